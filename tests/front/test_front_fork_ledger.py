"""``Agent.fork(boundary)`` in memory carries the effects ledger ``dsh sessions fork`` writes
(D27): a fork before a turn that charged leaves that charge in the child's ``fork/effects``, and
the child's identical call is answered from the record instead of charging again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_host import Agent, tool
from dsh_host._session.events import TurnEnd

from .front_helpers import events_of, result_texts, script

pytestmark = pytest.mark.both_backends

CHARGES: list[str] = []


@tool
def charge(to: str, cents: int) -> str:
    """Charge a customer (an effect outside the session)."""
    CHARGES.append(f"{to} {cents}")
    return f"charged {to} {cents} cents"


CALL = {"tool_calls": [{"name": "charge", "arguments": {"to": "bob", "cents": 5}}]}
RESPONSES: list[dict[str, Any]] = [
    {"text": "Hello."}, CALL, {"text": "Charged."},  # the parent: turn 1, turn 2 charges
    CALL, {"text": "Charged again?"},  # the child, forked after turn 1, asks the same
]  # fmt: skip


@pytest.mark.anyio
async def test_a_fork_before_a_charge_does_not_charge_again(tmp_path: Path) -> None:
    CHARGES.clear()
    async with Agent(script(tmp_path, RESPONSES), tools=[charge], store=None) as agent:
        await agent.run("hi")
        await agent.run("charge bob")
        assert CHARGES == ["bob 5"]
        parent = agent.session_id
        turn_one_end = next(e.seq for e in agent.session.events
                            if isinstance(e.data, TurnEnd) and e.data.turn == 1)  # fmt: skip
        await agent.fork(turn_one_end)
        (ledger,) = events_of(agent, "fork/effects")
        record: Any = ledger.data
        assert record["parentSession"] == parent and record["boundary"] == turn_one_end
        assert [(e["tool"], e["status"]) for e in record["effects"]] == [("charge", "done")]
        assert record["effects"][0]["result"] == "charged bob 5 cents"
        await agent.run("charge bob")
        texts = list(result_texts(agent).values())
    assert CHARGES == ["bob 5"]  # the child's identical call did not charge again
    assert texts[-1].startswith("Error: not run again: this exact call already took effect")
    assert "charged bob 5 cents" in texts[-1]
