"""Cost in money (issue 40): every billed call priced against hand-computed figures, per usage
shape (uncached input, cache reads, cache writes, reasoning inside output), per request, turn and
session, failed attempts and compaction summaries included; an unknown model is unknown, not 0."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._agent import Agent
from dsh_host._session.events import turn_end_kind
from dsh_host._session.messages import TokenUsage
from dsh_host._session.prices import ModelPrice, PriceTable, parse_prices
from dsh_host._session.tokens import TokenMeter
from dsh_host.errors import ConfigError

pytestmark = pytest.mark.anyio

#: $2 / 1M uncached input, $8 / 1M output, $0.5 / 1M cache read, $2.5 / 1M cache write
RATES = {"input": 2, "output": 8, "cache_read": 0.5, "cache_write": 2.5}


def base(responses: list[Any], meter: dict[str, Any] | None = None) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
        Row(name="token-meter", config=meter if meter is not None else {}),
    ]


def new_agent(host: Any) -> Agent:
    agent: Agent = host.ctx.agent.create()
    return agent


async def test_each_usage_shape_costs_the_hand_computed_figure() -> None:
    script = [
        # uncached only: 1000 * 2 + 100 * 8 = 2800 micro-dollars
        {"text": "a", "usage": {"input_tokens": 1000, "output_tokens": 100}},
        # cache read + write: 300*2 + 5000*0.5 + 2000*2.5 + 50*8 = 600+2500+5000+400 = 8500
        {
            "text": "b",
            "usage": {
                "input_tokens": 300,
                "output_tokens": 50,
                "cache_read_tokens": 5000,
                "cache_write_tokens": 2000,
            },
        },
        # reasoning is part of output, never charged twice: 10*2 + 700*8 = 5620
        {
            "text": "c",
            "usage": {"input_tokens": 10, "output_tokens": 700, "reasoning_tokens": 600},
        },
    ]
    async with open_host(base(script, {"prices": {"scripted": RATES}})) as host:
        agent = new_agent(host)
        await agent.run_turn("one")
        await agent.run_turn("two")
        await agent.run_turn("three")
        meter: TokenMeter = host.ctx.tokenMeter
        costs = [r.cost_usd for r in meter.requests(agent.session)]
        assert costs == [Decimal("0.0028"), Decimal("0.0085"), Decimal("0.00562")]
        per_turn = meter.turn_usage(agent.session)
        assert [per_turn[t].cost_usd for t in (1, 2, 3)] == costs
        total = meter.usage(agent.session)
        assert total.cost_usd == Decimal("0.01692")
        assert total.to_json()["cost_usd"] == pytest.approx(0.01692)


async def test_a_failed_attempt_is_billed_and_counted() -> None:
    script = [
        {
            "error": {"code": "SERVER_ERROR", "message": "boom", "status": 500},
            "usage": {"input_tokens": 4000, "output_tokens": 0},
        }
    ]
    async with open_host(base(script, {"prices": {"scripted": RATES}})) as host:
        agent = new_agent(host)
        reason = await agent.run_turn("go")
        assert turn_end_kind(reason) == "error"
        meter: TokenMeter = host.ctx.tokenMeter
        [request] = meter.requests(agent.session)
        assert request.kind == "attempt" and request.model == "scripted"
        assert request.cost_usd == Decimal("0.008")  # 4000 * $2 / 1M
        assert meter.usage(agent.session).cost_usd == Decimal("0.008")


async def test_an_unknown_model_is_unknown_cost_not_zero() -> None:
    script = [{"text": "a", "usage": {"input_tokens": 1000, "output_tokens": 100}}]
    async with open_host(base(script, {"catalogue": False})) as host:
        agent = new_agent(host)
        await agent.run_turn("go")
        total = host.ctx.tokenMeter.usage(agent.session)
        assert total.cost_usd is None
        assert total.unpriced_requests == 1 and total.unpriced_models == ("scripted",)
        assert total.to_json()["cost_usd"] is None


def test_provider_key_beats_model_key_and_catalogue_prices_known_models() -> None:
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=0)
    table = PriceTable(
        parse_prices({"m": {"input": 1, "output": 1}, "route:m": {"input": 3, "output": 1}})
    )
    assert table.cost("route", "m", usage) == Decimal(3)
    assert table.cost("other", "m", usage) == Decimal(1)
    # genai-prices' list price of Claude Sonnet 4.5: $3 in, $15 out, $0.30 read, $3.75 write.
    shaped = TokenUsage(
        input_tokens=300, output_tokens=100, cache_read_tokens=500, cache_write_tokens=200
    )
    assert PriceTable().cost("anthropic", "claude-sonnet-4-5", shaped) == Decimal("0.0033")
    assert PriceTable().cost("scripted", "no-such-model-xyz", shaped) is None


def test_cache_rates_default_to_the_input_rate() -> None:
    price = ModelPrice(input=Decimal(4), output=Decimal(0))
    usage = TokenUsage(
        input_tokens=100, output_tokens=0, cache_read_tokens=100, cache_write_tokens=100
    )
    assert price.cost(usage) == Decimal("0.0012")


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({"m": {"input": 1}}, "prices.m: missing output"),
        ({"m": {"input": -1, "output": 1}}, "prices.m.input: a price must be"),
        ({"m": {"input": "x", "output": 1}}, "prices.m.input: 'x' is not a number"),
        ({"m": {"input": 1, "output": 1, "cached": 1}}, "prices.m: unknown key(s) cached"),
    ],
)
async def test_a_bad_price_entry_is_refused_naming_it(prices: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        async with open_host(base([{"text": "a"}], {"prices": prices})):
            pass
    assert message in str(caught.value)


async def test_a_compaction_summary_is_billed_in_its_turn() -> None:
    from dsh_host._tools import ToolDefinition, ToolExecution, text_output

    # Each step emits ~600 tokens of tool output into a 4000-token window: compaction-basic
    # summarizes before a later step; the summary request reports 3000 in / 200 out, priced
    # 3000*2 + 200*8 = 7600 micro-dollars, counted in turn 1 beside the replies.
    steps = [
        {
            "tool_calls": [{"name": "emit", "arguments": {"text": f"chunk {i} " + "z" * 2400}}],
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
        for i in range(12)
    ]
    summary = {
        "text": "## Primary Request and Intent\n- emit chunks\n## Current Work\n- chunks",
        "usage": {"input_tokens": 3000, "output_tokens": 200},
    }
    model = {
        "responses": [*steps, {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 10}}],
        "context_window": 4000,
        "compaction_responses": [summary] * 6,
    }
    rows = base([], {"prices": {"scripted": RATES}})
    rows[3] = Row(id="model", name="llm-scripted", config=model)
    rows.append(Row(name="compaction-basic"))
    async with open_host(rows) as host:

        async def body(args: Any, exec: ToolExecution) -> Any:
            return str(args.get("text", ""))

        host.ctx.tools.register(
            ToolDefinition(
                name="emit",
                description="returns its text",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}},
                execute=body,
                output=text_output(),
            )
        )
        agent = new_agent(host)
        await agent.run_turn("emit twelve chunks")
        meter: TokenMeter = host.ctx.tokenMeter
        summaries = [r for r in meter.requests(agent.session) if r.kind == "compaction"]
        assert summaries, "the fixture must compact"
        assert all(r.turn == 1 and r.cost_usd == Decimal("0.0076") for r in summaries)
        replies = [r for r in meter.requests(agent.session) if r.kind == "reply"]
        # every reply: 10*2 + 10*8 = 100 micro-dollars
        expected = Decimal("0.0076") * len(summaries) + Decimal("0.0001") * len(replies)
        assert meter.turn_usage(agent.session)[1].cost_usd == expected


def test_a_model_the_catalogue_lacked_is_priced_once_a_catalogue_lists_it() -> None:
    """A catalogue miss is remembered only for the catalogue in force (its snapshot object)."""
    from genai_prices import types as catalogue
    from genai_prices.data_snapshot import DataSnapshot, get_snapshot, set_custom_snapshot

    usage = TokenUsage(input_tokens=1_000_000, output_tokens=0)
    table = PriceTable()
    assert table.cost("scripted", "dsh-test-model-9", usage) is None
    assert table.cost("scripted", "dsh-test-model-9", usage) is None  # the remembered miss
    extra = catalogue.Provider(
        id="dsh-test",
        name="dsh test",
        api_pattern="dsh-test.invalid",
        model_match=catalogue.ClauseStartsWith(starts_with="dsh-test-"),
        models=[
            catalogue.ModelInfo(
                id="dsh-test-model-9",
                match=catalogue.ClauseEquals(equals="dsh-test-model-9"),
                prices=catalogue.ModelPrice(input_mtok=Decimal(7)),
            )
        ],
    )
    set_custom_snapshot(
        DataSnapshot(providers=[*get_snapshot().providers, extra], from_auto_update=False)
    )
    try:
        assert table.cost("scripted", "dsh-test-model-9", usage) == Decimal(7)
    finally:
        set_custom_snapshot(None)
    assert table.cost("scripted", "dsh-test-model-9", usage) is None
