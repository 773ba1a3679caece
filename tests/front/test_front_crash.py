"""A process running the front door is SIGKILLed inside a side-effecting tool; resume tells the truth.

The effect happened (the ledger holds the call id); the log had the durable ``tool/call`` but no
result. ``Agent.resume`` closes the call ``TOOL_OUTCOME_UNKNOWN`` with that call id, which is the
key to look the effect up with, so nobody has to guess or charge twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crash.tool_body import kill_inside_tool_body

from dsh_host import Agent

from .front_helpers import events_of, script

pytestmark = pytest.mark.anyio

async def test_resume_after_a_crash_marks_the_started_call_outcome_unknown(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    killed = kill_inside_tool_body(tmp_path, "front", [
        {"tool_calls": [{"name": "charge", "arguments": {"customer": "cus_1", "cents": 500},
                         "id": "charge-7"}]},
        {"text": "never reached"},
    ], root=root)  # fmt: skip
    session_id = killed.session_id
    assert killed.ledger == ["charge-7 cus_1 500"]  # the world saw the charge
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
    assert (tmp_path / "ledger.txt").read_text() == "charge-7 cus_1 500\n"  # nothing replayed
