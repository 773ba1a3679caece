"""A process running the front door is SIGKILLed inside a side-effecting tool; resume tells the truth.

The effect happened (the ledger holds the call id); the log had the durable ``tool/call`` but no
result. ``Agent.resume`` closes the call ``TOOL_OUTCOME_UNKNOWN`` with that call id, which is the
key to look the effect up with, so nobody has to guess or charge twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from front_helpers import events_of, script

from dsh_host import Agent

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).with_name("front_crash_child.py")


def crash_inside_the_tool(tmp_path: Path, root: Path, ledger: Path) -> str:
    ready = tmp_path / "ready"
    model = script(tmp_path, [
        {"tool_calls": [{"name": "charge", "arguments": {"customer": "cus_1", "cents": 500},
                         "id": "charge-7"}]},
        {"text": "never reached"},
    ])
    child = subprocess.Popen(
        [sys.executable, str(CHILD), model, str(ledger), str(ready), str(root)],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60  # hang guard only
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), child.stderr.read() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    return ready.read_text().strip()


async def test_resume_after_a_crash_marks_the_started_call_outcome_unknown(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    session_id = crash_inside_the_tool(tmp_path, root, ledger)
    assert ledger.read_text() == "charge-7 cus_1 500\n"  # the world saw the charge
    model = script(tmp_path, [{"text": "I will check charge-7 before retrying."}], "after.json")
    async with Agent(model, store=root) as agent:
        await agent.resume(session_id)
        (call,) = events_of(agent, "tool/call")
        (result,) = events_of(agent, "tool/result")
        after = await agent.run("did it go through?")
    assert call.data.call_id == "charge-7"
    assert result.data.message.source.call_id == "charge-7"
    assert result.data.error.code == "TOOL_OUTCOME_UNKNOWN"
    assert after.turn == 2 and after.completed
    assert ledger.read_text() == "charge-7 cus_1 500\n"  # nothing was replayed
