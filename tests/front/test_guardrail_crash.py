"""SIGKILL during a slow tool guardrail, then resume: nothing claims the call ran.

A tool guardrail runs in ``tools/pre-execute``, before the ``tools/execute`` chain where the
checkpoint policy flushes the log and the body runs. Before it deliberates, the front door
appends a ``guardrail/asked`` gate and flushes (D23 in docs/decisions.md), so a process killed
while a guardrail deliberates leaves a durable ``tool/call`` and a gate no verdict passed, and has
not run the body (the ledger is empty). Resume closes the call ``TOOL_NOT_STARTED``: in the log
as in the world it never started, and asking the model again is safe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsh_host import Agent

from .front_helpers import events_of, script

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).with_name("guardrail_crash_child.py")


def kill_in_guardrail(tmp_path: Path, root: Path, model: str, ledger: Path) -> str:
    """Run the child until its guardrail is deliberating, SIGKILL it; the session id."""
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), model, str(ledger), str(ready)],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), child.communicate(timeout=60)[1]
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.wait(timeout=60)
        assert child.stderr is not None
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return ready.read_text()


async def test_a_kill_inside_a_tool_guardrail_resumes_as_not_started(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    model = script(tmp_path, [
        {"tool_calls": [{"id": "charge-1", "name": "charge",
                         "arguments": {"customer": "cus_1", "cents": 500}}]},
        {"text": "never reached"},
    ])  # fmt: skip
    session_id = kill_in_guardrail(tmp_path, root, model, ledger)
    after = script(tmp_path, [{"text": "retrying is safe"}], "after.json")
    async with Agent(after, store=root, approval="never") as agent:
        await agent.resume(session_id)
        calls = events_of(agent, "tool/call", "tool/result", "guardrail/verdict")
        ended = events_of(agent, "turn/end")
        gates = len(events_of(agent, "guardrail/asked"))
        resumed = await agent.run("try again")
    assert not ledger.exists()  # the body never ran
    # the call and its gate were durable; resume says it never started (not unknown)
    assert [c.type for c in calls] == ["tool/call", "tool/result"]
    result = calls[1].data
    assert result.error is not None and result.error.code == "TOOL_NOT_STARTED"
    assert result.message.source.call_id == "charge-1"
    assert gates == 1
    assert len(ended) == 1  # the interrupted turn is closed
    assert resumed.completed and resumed.output == "retrying is safe"
