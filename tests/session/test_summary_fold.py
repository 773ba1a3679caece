"""A summary folded page by page says what the whole log says (D33).

``dsh serve``'s session page summarises a stored log by walking it a page at a time with a
:class:`SummaryFold`, which keeps only the last ended turn and what follows it for the pending
approvals. A real log (the agent loop, tool rules, a deferred approval, a decision, the continued
turn) is cut at every event and each prefix is fed to a fold in pages of 3: its pending
approvals, terms, title, last turn, last turn end, count and open turn equal the whole-log
functions' on the same prefix.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._session.approvals import pending_approvals
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._session.summary import SummaryFold, last_turn, last_turn_end, title
from dsh_host._session.terms import recorded_terms
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

pytestmark = pytest.mark.anyio

CALL = {"tool_calls": [{"id": "c-ask", "name": "probe", "arguments": {"x": 1}}]}


def rows() -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="rules", name="tool-rules",
            config={"rules": [{"tool": "probe", "decision": "ask", "reason": "r"}]}),
        Row(id="approval", name="user-approval", config={"unanswered": "defer"}),
        Row(id="model", name="llm-scripted",
            config={"responses": [{"text": "hello"}, CALL, {"text": "after"}]}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


async def test_a_fold_fed_in_pages_summarises_every_prefix_as_the_whole_log() -> None:
    async with open_host(rows()) as host:

        async def body(args: Any, exec_: ToolExecution) -> str:
            return "ran"

        host.ctx.tools.register(ToolDefinition(
            name="probe", description="probe", parameters={"type": "object"}, execute=body,
            output=text_output(),
        ))  # fmt: skip
        agent = host.ctx.agent.create(session_id="fold-1")
        await agent.run_turn("first question")
        await agent.run_turn("go")  # ends awaiting approval
        await agent.decide("c-ask", "allow", reason="fine", decided_by="test")
        await agent.continue_turn()
        events = list(agent.session.events)
        header = agent.session.header
    kinds = [e.type for e in events]
    assert "approval/decided" in kinds and kinds.count("turn/end") == 3
    seen_pending = seen_open = False
    for n in range(len(events) + 1):
        prefix = events[:n]
        fold = SummaryFold()
        for start in range(0, n, 3):
            fold.feed(prefix[start : start + 3])
        pending = pending_approvals(prefix, "fold-1")
        assert pending_approvals(fold.last_events(), "fold-1") == pending, n
        assert fold.terms == recorded_terms(prefix), n
        assert fold.turn_open == bool(interrupted_turn_closers(prefix)), n
        summary = fold.summary(header)
        assert summary.events == n and summary.title == title(prefix), n
        assert summary.last_turn == last_turn(prefix), n
        assert summary.last_turn_end == last_turn_end(prefix), n
        seen_pending |= bool(pending)
        seen_open |= fold.turn_open
    assert seen_pending and seen_open  # the cuts met a waiting approval and an open turn
