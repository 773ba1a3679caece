"""``token-meter`` (issue 22): usage per turn and session from the logged usage, pressure of the
current surface against the declared context window, the local estimate where the provider gave
none, and a measurement that follows surface replacements (negative deltas)."""

from __future__ import annotations

import pytest
from dsh_token_meter import TokenMeter, estimate_message

from dsh_host import Row
from dsh_host._session.events import ReplaceOp
from dsh_host._session.messages import PluginSource, TextBlock, UserMessage, new_message_id
from dsh_host.errors import ConfigError

from .compaction_helpers import call, host_with, new_agent, register_echo, rows

pytestmark = pytest.mark.anyio

METER = Row(name="token-meter")


def usage(inp: int, out: int, cache: int | None = None) -> dict[str, int]:
    u = {"input_tokens": inp, "output_tokens": out}
    if cache is not None:
        u["cache_read_tokens"] = cache
    return u


async def test_usage_totals_per_turn_and_session() -> None:
    script = [
        {**call("a"), "usage": usage(1000, 20, cache=500)},
        {"text": "one", "usage": usage(1100, 5)},
        {"text": "two", "usage": usage(1200, 7, cache=900)},
    ]
    async with host_with(rows(script), METER) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("first")
        await agent.run_turn("second")
        meter: TokenMeter = host.ctx.tokenMeter
        total = meter.usage(agent.session)
        assert (total.input_tokens, total.output_tokens, total.cache_read_tokens) == (
            3300,
            32,
            1400,
        )
        assert total.requests == 3
        per_turn = meter.turn_usage(agent.session)
        assert sorted(per_turn) == [1, 2]
        assert per_turn[1].input_tokens == 2100 and per_turn[1].output_tokens == 25
        assert per_turn[2].cache_read_tokens == 900


async def test_pressure_against_the_declared_window_uses_the_provider_anchor() -> None:
    # The provider reports a prompt far larger than the heuristic would: its figure is the anchor.
    script = [{"text": "hello", "usage": usage(5000, 10, cache=3000)}]
    async with host_with(rows(script, context_window=10_000), METER) as host:
        agent = new_agent(host)
        await agent.run_turn("hi")
        pressure = host.ctx.tokenMeter.pressure(agent.session)
        assert pressure.context_window == 10_000
        assert pressure.pressure_tokens == 8000
        assert pressure.estimated is False
        assert pressure.projected_tokens == 8010  # the sample plus no surface movement since
        assert pressure.ratio == pytest.approx(0.801)


async def test_a_provider_without_usage_gets_the_local_estimate() -> None:
    # The scripted default usage (10 input tokens) is below the heuristic price: estimated.
    text = "x" * 4000
    async with host_with(rows([{"text": "ok"}]), METER) as host:
        agent = new_agent(host)
        await agent.run_turn(text)
        meter: TokenMeter = host.ctx.tokenMeter
        measured = meter.measure(agent.session)
        assert measured.baseline_kind == "estimated"
        assert measured.surface_tokens == sum(node.tokens for node in measured.nodes)
        assert measured.total_tokens >= 1000  # 4000 characters at four per token
        assert meter.pressure(agent.session).context_window is None  # none declared


async def test_a_replacement_shrinks_the_measurement() -> None:
    big = "y" * 8000
    script = [{"text": "done", "usage": usage(50_000, 3)}]
    async with host_with(rows(script), METER) as host:
        agent = new_agent(host)
        await agent.run_turn(big)
        session = agent.session
        meter: TokenMeter = host.ctx.tokenMeter
        before = meter.measure(session)
        assert before.baseline_kind == "usage"
        [prompt_seq] = [
            seq for seq in session.surface.nodes if session.events[seq].type == "user/message"
        ]
        small = UserMessage(
            id=new_message_id(),
            content=(TextBlock(text="short"),),
            source=PluginSource(plugin="test"),
        )
        session.append(
            "user/message",
            small,
            surface_op=ReplaceOp(start=prompt_seq, end=prompt_seq),
            source_event_seqs=[prompt_seq],
        )
        after = meter.measure(session)
        assert after.baseline_kind == "usage"
        assert after.surface_delta_tokens < -1900  # the 8000 characters left the surface
        assert after.total_tokens == before.total_tokens + after.surface_delta_tokens
        assert [n.seq for n in after.nodes] == list(session.surface.nodes)
        assert after.surface_tokens == before.surface_tokens + after.surface_delta_tokens
        assert estimate_message(small) == 4 + 2 + 4


async def test_the_row_takes_no_settings() -> None:
    with pytest.raises(ConfigError):
        async with host_with(rows([{"text": "x"}]), Row(name="token-meter", config={"x": 1})):
            pass
