"""Budgets (issue 40): ``max_cost_usd`` / ``max_tokens`` per turn and per session, checked before
every model request against what the log shows was spent; the turn ends ``budget-exceeded`` and no
request is made beyond the limit; a continued session keeps counting from its log."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._agent import Agent
from dsh_host._agent.budget import Budget, BudgetExceededReason
from dsh_host._session.events import TurnEnd, turn_end_kind

pytestmark = pytest.mark.anyio

RATES = {"input": 10, "output": 10}  # $10 / 1M tokens: 1000 tokens cost $0.01


def rows(responses: list[Any], agent: dict[str, Any] | None = None) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted", **(agent or {})}),
        Row(name="token-meter", config={"prices": {"scripted": RATES}}),
    ]


def requests_made(host: Any) -> int:
    for fiber in host.fibers:
        if fiber.id == "model":
            return len(fiber.instance.adapter.requests)
    raise KeyError("model")


def emit_call(n: int) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": "noop", "arguments": {}}],
        "usage": {"input_tokens": 900, "output_tokens": 100},
    }


def register_noop(host: Any) -> None:
    from dsh_host._tools import ToolDefinition, ToolExecution, text_output

    async def body(args: Any, exec: ToolExecution) -> Any:
        return "ok"

    host.ctx.tools.register(
        ToolDefinition(
            name="noop",
            description="does nothing",
            parameters={"type": "object", "properties": {}},
            execute=body,
            output=text_output(),
        )
    )


async def test_turn_cost_budget_stops_before_the_third_request() -> None:
    # Each request costs $0.01 (1000 tokens at $10/1M); the turn may spend $0.02: the third
    # request is never made.
    script = [emit_call(i) for i in range(5)]
    budget = {"budget": {"turn": {"max_cost_usd": 0.02}}}
    async with open_host(rows(script, budget)) as host:
        register_noop(host)
        agent: Agent = host.ctx.agent.create()
        reason = await agent.run_turn("go")
        assert isinstance(reason, BudgetExceededReason)
        assert (reason.scope, reason.limit, reason.max, reason.spent) == (
            "turn",
            "cost",
            0.02,
            0.02,
        )
        assert requests_made(host) == 2
        events = agent.session.events
        assert [e.type for e in events].count("assistant/message") == 2
        last = events[-1]
        assert last.type == "turn/end" and isinstance(last.data, TurnEnd)
        assert turn_end_kind(last.data.reason) == "budget-exceeded"
        assert "no further model request" in last.data.reason.message  # type: ignore[union-attr]


async def test_session_token_budget_counts_across_turns() -> None:
    script = [{"text": "a", "usage": {"input_tokens": 600, "output_tokens": 0}}] * 3
    async with open_host(rows(script, {"budget": {"session": {"max_tokens": 1000}}})) as host:
        agent: Agent = host.ctx.agent.create()
        assert turn_end_kind(await agent.run_turn("one")) == "completed"  # 600 spent
        assert turn_end_kind(await agent.run_turn("two")) == "completed"  # 1200 spent
        reason = await agent.run_turn("three")
        assert isinstance(reason, BudgetExceededReason)
        assert (reason.scope, reason.limit, reason.spent) == ("session", "tokens", 1200)
        assert requests_made(host) == 2


async def test_a_new_agent_on_the_same_session_keeps_counting_from_the_log() -> None:
    # What was spent comes from the log, not from the agent that spent it.
    script = [{"text": "a", "usage": {"input_tokens": 1000, "output_tokens": 0}}] * 3
    async with open_host(rows(script)) as host:
        first: Agent = host.ctx.agent.create()
        await first.run_turn("one")  # $0.01, no budget
        second: Agent = host.ctx.agent.create(
            session=first.session, budget=Budget(session_max_cost_usd=Decimal("0.01"))
        )
        reason = await second.run_turn("two")
        assert isinstance(reason, BudgetExceededReason) and reason.scope == "session"
        assert requests_made(host) == 1


async def test_an_unpriced_model_fails_a_cost_budget_closed() -> None:
    script = [{"text": "a"}] * 3
    base = rows(script, {"budget": {"session": {"max_cost_usd": 5}}})
    base[-1] = Row(name="token-meter", config={"catalogue": False})
    async with open_host(base) as host:
        agent: Agent = host.ctx.agent.create()
        assert turn_end_kind(await agent.run_turn("one")) == "completed"  # nothing spent yet
        reason = await agent.run_turn("two")
        assert isinstance(reason, BudgetExceededReason)
        assert reason.spent is None and "no price is known for model(s) scripted" in reason.message
        assert requests_made(host) == 1


async def test_the_model_reads_why_the_last_turn_stopped() -> None:
    # A 500-token turn budget: the first request spends 600, so the turn stops before its
    # second; the next turn (a budget of its own) opens with a notice the model reads.
    script = [
        {
            "tool_calls": [{"name": "noop", "arguments": {}}],
            "usage": {"input_tokens": 600, "output_tokens": 0},
        },
        {"text": "after", "usage": {"input_tokens": 10, "output_tokens": 0}},
    ]
    async with open_host(rows(script, {"budget": {"turn": {"max_tokens": 500}}})) as host:
        register_noop(host)
        agent: Agent = host.ctx.agent.create()
        stopped = await agent.run_turn("one")
        assert isinstance(stopped, BudgetExceededReason)
        assert requests_made(host) == 1
        assert turn_end_kind(await agent.run_turn("two")) == "completed"
        last = next(f for f in host.fibers if f.id == "model").instance.adapter.requests[-1]
        texts = [
            block.text
            for message in last.messages
            for block in message.content
            if hasattr(block, "text")
        ]
        notice = [t for t in texts if t.startswith("[budget-exceeded]")]
        assert len(notice) == 1 and "turn token budget is spent" in notice[0]


async def test_a_non_positive_limit_is_refused_at_creation() -> None:
    from dsh_host._agent import AgentConfigError

    async with open_host(rows([{"text": "a"}])) as host:
        with pytest.raises(AgentConfigError, match="turn_max_tokens must be positive, got 0"):
            host.ctx.agent.create(budget=Budget(turn_max_tokens=0))
