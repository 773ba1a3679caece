"""Approvals that wait (D19), in process: the real loop, tools pipeline, rules and approval rows.

``unanswered: defer`` with no answerer: the step settles the calls that need no approval, the
asked one stays without a result, the turn ends ``awaiting-approval``; a decision is bound to
the call and its ``argsDigest``, one-shot, re-checked when applied, and ``continue_turn`` runs
exactly the decided call (or answers with the rejection text) before the next model request.
"""

from __future__ import annotations

from typing import Any

import pytest
from dsh_user_approval import AwaitingApprovalReason, check_approval_invariants

from dsh_host import Row, open_host
from dsh_host._agent import ApprovalDecisionError, ApprovalPendingError
from dsh_host._session import CompletedReason
from dsh_host._session.approvals import awaiting_call_ids, deferred_calls
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

# both backends: the agent loop halting and resuming
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def rows(responses: list[Any], *, unanswered: str = "defer", rules: Any = None) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(
            id="rules",
            name="tool-rules",
            config={"rules": rules or [{"tool": "probe", "decision": "ask", "reason": "r"}]},
        ),
        Row(id="approval", name="user-approval", config={"unanswered": unanswered}),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


TWO_CALLS = {
    "tool_calls": [
        {"id": "c-ask", "name": "probe", "arguments": {"x": 1}},
        {"id": "c-free", "name": "free", "arguments": {}},
    ]
}


def register(host: Any, ran: list[str]) -> None:
    async def body(args: Any, exec_: ToolExecution) -> str:
        ran.append(exec_.call_id)
        return f"ran {exec_.name}"

    for name in ("probe", "free"):
        host.ctx.tools.register(
            ToolDefinition(
                name=name, description=name, parameters={"type": "object"}, execute=body,
                output=text_output(),
            )
        )


def results(events: Any) -> dict[str, str]:
    out = {}
    for event in events:
        if event.type == "tool/result":
            (block,) = event.data.message.content
            out[block.tool_call_id] = block.content[0].text
    return out


async def deferred_agent(host: Any, ran: list[str]) -> Any:
    register(host, ran)
    agent = host.ctx.agent.create(session_id="defer-1")
    reason = await agent.run_turn("go")
    assert isinstance(reason, AwaitingApprovalReason)
    assert reason.call_ids == ("c-ask",)
    return agent


async def test_defer_settles_the_others_and_ends_awaiting_approval() -> None:
    ran: list[str] = []
    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        agent = await deferred_agent(host, ran)
        events = list(agent.session.events)
        kinds = [e.type for e in events]
        assert ran == ["c-free"]  # the call that needed no approval ran, the asked one did not
        assert results(events) == {"c-free": "ran free"}
        asked = next(e for e in events if e.type == "approval/asked")
        assert asked.data.stage == "pre-execute" and asked.data.call_id == "c-ask"
        assert "approval/decided" not in kinds
        assert kinds[-2:] == ["step/end", "turn/end"]
        assert awaiting_call_ids(events[-1].data.reason) == ("c-ask",)
        # Pending, not crashed: no closer for it while no turn is open.
        assert interrupted_turn_closers(events) == []
        (pending,) = agent.pending_approvals()
        assert (pending.call_id, pending.tool_name, pending.arguments) == ("c-ask", "probe", '{"x":1}')
        assert pending.bound
        # The model never sees a call without its result: no new turn while it waits.
        with pytest.raises(ApprovalPendingError, match="c-ask"):
            await agent.run_turn("something else")
        assert len(agent.session.events) == len(events)
        # Nothing decided yet: continue writes nothing and reports the same state.
        again = await agent.continue_turn()
        assert awaiting_call_ids(again) == ("c-ask",)
        assert len(agent.session.events) == len(events)


@pytest.mark.parametrize(("decision", "runs", "text"), [
    ("allow", ["c-free", "c-ask"], "ran probe"),
    ("deny", ["c-free"], 'Error: the user rejected tool "probe"'),
])
async def test_decide_then_continue_runs_exactly_the_decided_call(
    decision: str, runs: list[str], text: str
) -> None:
    ran: list[str] = []
    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        agent = await deferred_agent(host, ran)
        before = len(agent.session.events)
        decided = await agent.decide("c-ask", decision, reason="looked fine", decided_by="test")
        assert decided.decision is not None and decided.decision.decided_by == "test"
        record = agent.session.events[-1]
        assert record.type == "approval/decided" and len(agent.session.events) == before + 1
        assert record.data.outcome == ("allowed-once" if decision == "allow" else "rejected")
        assert record.data.call_id == "c-ask" and record.data.reason == "looked fine"
        assert record.data.args_digest == decided.asked_digest
        assert agent.pending_approvals() == []
        with pytest.raises(ApprovalDecisionError, match="already decided"):
            await agent.decide("c-ask", "allow")
        reason = await agent.continue_turn()
        assert isinstance(reason, CompletedReason)
        assert ran == runs
        events = list(agent.session.events)
        assert results(events)["c-ask"] == text
        # The continued turn: step 1 applies the decision (a fresh tool/call first), step 2 asks
        # the model, whose request carries every call with its result.
        tail = [e.type for e in events[before + 1 :]]
        assert tail[:5] == ["turn/start", "step/start", "tool/call", "tool/result", "step/end"]
        assert "approval/asked" not in tail  # the recorded decision is applied, not re-asked
        adapter = host.ctx.llm.adapter_for("scripted")
        last = adapter.requests[-1]
        call_ids = {b.id for m in last.messages for b in m.content if getattr(b, "type", "") == "tool-call"}
        answered = {
            b.tool_call_id for m in last.messages for b in m.content
            if getattr(b, "type", "") == "tool-result"
        }
        assert call_ids <= answered
        assert deferred_calls(events) == []
        assert check_approval_invariants(events) == frozenset()
        with pytest.raises(ApprovalDecisionError, match="not awaiting approval"):
            await agent.decide("c-ask", "allow")


async def test_decisions_are_bound_to_call_and_digest() -> None:
    ran: list[str] = []
    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        agent = await deferred_agent(host, ran)
        before = len(agent.session.events)
        with pytest.raises(ApprovalDecisionError, match="not awaiting approval"):
            await agent.decide("c-free", "allow")  # ran already: not pending
        with pytest.raises(ApprovalDecisionError, match="not awaiting approval"):
            await agent.decide("nope", "allow")
        with pytest.raises(ApprovalDecisionError, match="argsDigest"):
            await agent.decide("c-ask", "allow", args_digest="0" * 64)
        with pytest.raises(ApprovalDecisionError, match="allow"):
            await agent.decide("c-ask", "maybe")
        assert len(agent.session.events) == before  # nothing recorded by a refusal
        assert ran == ["c-free"]


async def test_a_rule_that_now_denies_wins_over_a_recorded_allow() -> None:
    ran: list[str] = []
    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        agent = await deferred_agent(host, ran)
        await agent.decide("c-ask", "allow")
        host.ctx.on("tools/pre-execute", _deny_probe, prepend=True)
        reason = await agent.continue_turn()
        assert isinstance(reason, CompletedReason)
        assert ran == ["c-free"]
        assert results(agent.session.events)["c-ask"] == "Error: probe is frozen now"


async def _deny_probe(exec_: Any, next_: Any) -> Any:
    from dsh_host._tools import Deny

    if exec_.name == "probe":
        return Deny("probe is frozen now")
    return await next_()


async def test_the_never_policy_now_rejects_a_recorded_allow() -> None:
    ran: list[str] = []
    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        agent = await deferred_agent(host, ran)
        await agent.decide("c-ask", "allow")
        from dsh_user_approval import set_approval_policy

        set_approval_policy(agent.session, "never")
        await agent.continue_turn()
        assert ran == ["c-free"]
        assert results(agent.session.events)["c-ask"] == 'Error: the user rejected tool "probe"'


async def test_an_answerer_may_defer_and_fail_mode_stays_fail_closed() -> None:
    ran: list[str] = []

    async def defer(req: Any, next_: Any) -> Any:
        return "defer"

    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        host.ctx.on("approval/request", defer)
        await deferred_agent(host, ran)
    ran.clear()
    async with open_host(rows([TWO_CALLS, {"text": "after"}], unanswered="fail")) as host:
        host.ctx.on("approval/request", defer)  # cannot wait here: unavailable, fail closed
        register(host, ran)
        agent = host.ctx.agent.create(session_id="fail-1")
        assert isinstance(await agent.run_turn("go"), CompletedReason)
        assert ran == ["c-free"]
        assert "no approval channel is available" in results(agent.session.events)["c-ask"]


async def test_the_model_is_told_that_unanswered_asks_wait() -> None:
    from dsh_user_approval import ASK_POLICY_SENTENCE, DEFER_POLICY_SENTENCE

    async with open_host(rows([{"text": "hi"}])) as host:
        agent = host.ctx.agent.create(session_id="ctx-1")
        assert host.ctx.approval.policy_context(agent) == DEFER_POLICY_SENTENCE
    async with open_host(rows([{"text": "hi"}], unanswered="fail")) as host:
        agent = host.ctx.agent.create(session_id="ctx-2")
        assert host.ctx.approval.policy_context(agent) == ASK_POLICY_SENTENCE


async def test_an_allow_decided_in_another_context_waits_again_and_nobody_is_asked() -> None:
    """D22: a decision holds only in the context it was asked in (here: the tool's definition
    changed between the decision and the continuation). Before, ``continue_turn`` asked the
    answerer inline, which allowed, and the call ran; now the call is deferred again (the turn
    ends awaiting-approval, no model request), nobody is asked, and a decision made in the new
    context runs it once."""
    ran: list[str] = []
    asked: list[str | None] = []

    async def allow(req: Any, next_: Any) -> Any:
        asked.append(req.call_id)
        return "allowed-once"

    async def body(args: Any, exec_: ToolExecution) -> str:
        ran.append(exec_.call_id)
        return f"ran {exec_.name}"

    def tool(name: str, description: str) -> ToolDefinition:
        return ToolDefinition(
            name=name, description=description, parameters={"type": "object"}, execute=body,
            output=text_output(),
        )

    async with open_host(rows([TWO_CALLS, {"text": "after"}])) as host:
        host.ctx.tools.register(tool("free", "free"))
        unregister = host.ctx.tools.register(tool("probe", "probe"))
        agent = host.ctx.agent.create(session_id="context-1")
        assert awaiting_call_ids(await agent.run_turn("go")) == ("c-ask",)
        await agent.decide("c-ask", "allow", decided_by="test")
        host.ctx.on("approval/request", allow)  # an answerer that would allow, if asked
        unregister()
        host.ctx.tools.register(
tool("probe", "probe, now deleting things"))
        requests = len([e for e in agent.session.events if e.type == "assistant/message"])
        reason = await agent.continue_turn()
        assert awaiting_call_ids(reason) == ("c-ask",), reason
        assert asked == [] and ran == ["c-free"]
        events = list(agent.session.events)
        assert "c-ask" not in results(events)
        assert len([e for e in events if e.type == "assistant/message"]) == requests
        again = [e for e in events if e.type == "approval/asked"][-1]
        assert "the context changed" in again.data.reason and "tool's definition" in (
            again.data.reason
        )
        (pending,) = agent.pending_approvals()
        assert pending.call_id == "c-ask" and pending.decision is None
        check_approval_invariants(events)
        await agent.decide("c-ask", "allow", decided_by="test")
        assert isinstance(await agent.continue_turn(), CompletedReason)
        assert asked == [] and ran == ["c-free", "c-ask"]
        assert results(agent.session.events)["c-ask"] == "ran probe"
