"""A child's deferred approval through ``dsh serve`` (issue 34, D36): real HTTP on loopback.

The lead delegates to ``worker``, whose bash call is asked and deferred (serve defers every
unanswered ask): the lead's delegating call waits, so the lead's status is
``awaiting-approval``; the approval listed is the child's call. Deciding it continues the lead,
not the child alone: the lead's delegating call re-attaches to the child, which runs the call
once under its declared role and answers the delegation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .harness import CALL, ledger_call, running_server

pytestmark = [pytest.mark.anyio]


def _worker(tmp: Path) -> str:
    script = tmp / "worker.json"
    script.write_text(json.dumps({"responses": [ledger_call(), {"text": "worker: ledger written"}]}))
    return (
        f"- {{id: model-worker, name: llm-scripted, config: {{provider: worker, path: {script}}}}}\n"
        "- id: subagents\n  name: subagents\n  config:\n    agents:\n"
        "      - {name: worker, description: Writes the ledger., instructions: Do it., "
        "tools: [bash], provider: worker, model: scripted}\n"
    )


async def test_deciding_a_childs_call_continues_the_parent_waiting_on_it(tmp_path: Path) -> None:
    lead = [
        {"tool_calls": [{"id": "d1", "name": "subagent",
                         "arguments": {"agent": "worker", "prompt": "write the ledger"}}]},
        {"text": "lead: the worker is done"},
    ]  # fmt: skip
    async with running_server(tmp_path, lead, extra_rows=_worker(tmp_path)) as server:
        session = await server.create(id="lead")
        turn = await server.turn(session, "delegate the ledger")
        waiting = await server.wait_turn_end(session, turn)
        assert waiting["status"] == "awaiting-approval", waiting
        assert waiting["lastTurnEnd"]["kind"] == "awaiting-approval", waiting
        listed = (await server.client.get("/approvals")).json()["approvals"]
        assert [(row["sessionId"], row["callId"]) for row in listed] == [("lead--d1", CALL)]
        assert server.ledger() == []  # nothing ran before the decision

        decided = await server.client.post(
            f"/sessions/lead--d1/approvals/{CALL}", json={"decision": "allow"}
        )
        assert decided.status_code == 200, decided.text
        body = decided.json()
        assert body["continued"] is True and body["continuedSession"] == "lead", body
        done = await server.wait_turn_end("lead", body["turn"])
        assert done["lastTurnEnd"]["kind"] == "completed", done
        assert done["status"] == "idle", done
        events = await server.events("lead")
        child = await server.events("lead--d1")
    assert server.ledger() == [CALL]  # the child's call ran once, after the decision
    results = [e["data"]["message"]["content"][0] for e in events if e["type"] == "tool/result"]
    assert len(results) == 1 and "worker: ledger written" in json.dumps(results[0])
    ends = [e["data"]["reason"]["kind"] for e in child if e["type"] == "turn/end"]
    assert ends[-1] == "completed", ends
