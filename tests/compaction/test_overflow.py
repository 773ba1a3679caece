"""Overflow recovery and the durable lock (issue 22): a provider's ``CONTEXT_WINDOW_EXCEEDED``
reaches ``agent/request-error``, compaction-basic prunes and summarizes everything but the newest
unit, and the step retries once over the smaller surface; with recovery off or nothing to
compact the provider's error stands. Pruning alone can relieve pressure (no summary request). A
live unmatched ``compaction/start`` blocks; one before a newer ``session/end-seed`` does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import Row
from dsh_host._session.compaction import ManualCompactionError, is_compact_checkpoint_source
from dsh_host._session.events import CompletedReason, ErrorReason, ReplaceOp
from dsh_host._session.messages import UserMessage

from .compaction_helpers import call, host_with, model_requests, new_agent, register_echo, rows

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SUMMARY = "## Primary Request and Intent\n- overflow test"
OVERFLOW = {"error": {"code": "CONTEXT_WINDOW_EXCEEDED", "message": "prompt is too long"}}


def basic(**config: Any) -> list[Row]:
    return [Row(name="token-meter"), Row(name="compaction-basic", config=config)]


async def test_overflow_compacts_and_retries_once() -> None:
    script = [call("a" * 3000), call("b" * 3000), OVERFLOW, {"text": "fits now"}]
    base = rows(script, summaries=[{"text": SUMMARY}])  # no window declared: no pressure path
    async with host_with(base, *basic()) as host:
        register_echo(host)
        agent = new_agent(host)
        reason = await agent.run_turn("go")
        assert isinstance(reason, CompletedReason)
        types = [e.type for e in agent.session.events]
        attempt = types.index("assistant/attempt")
        assert types[attempt + 1 : attempt + 5] == [
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end",
        ]
        requests = model_requests(host)
        failed, summary, retried = requests[-3:]
        assert summary.purpose == "compaction" and retried.purpose is None
        assert len(retried.messages) < len(failed.messages)
        assert any(
            isinstance(m, UserMessage) and is_compact_checkpoint_source(m.source)
            for m in retried.messages
        )


async def test_overflow_recovery_off_keeps_the_provider_error() -> None:
    script = [call("a" * 3000), call("b" * 3000), OVERFLOW]
    async with host_with(rows(script, summaries=[]), *basic(maxOverflowRetries=0)) as host:
        register_echo(host)
        agent = new_agent(host)
        reason = await agent.run_turn("go")
        assert isinstance(reason, ErrorReason)
        assert reason.error.code == "CONTEXT_WINDOW_EXCEEDED"
        assert not [e for e in agent.session.events if e.type.startswith("compaction/")]


async def test_overflow_with_nothing_to_compact_keeps_the_provider_error() -> None:
    async with host_with(rows([OVERFLOW], summaries=[]), *basic()) as host:
        agent = new_agent(host)
        reason = await agent.run_turn("a lone prompt")
        assert isinstance(reason, ErrorReason)
        assert reason.error.code == "CONTEXT_WINDOW_EXCEEDED"
        assert len(model_requests(host)) == 1


async def test_a_second_overflow_in_the_same_step_is_not_retried() -> None:
    script = [call("a" * 3000), call("b" * 3000), call("c" * 3000), OVERFLOW, OVERFLOW]
    summaries = [{"text": SUMMARY}, {"text": SUMMARY}]
    async with host_with(rows(script, summaries=summaries), *basic()) as host:
        register_echo(host)
        agent = new_agent(host)
        reason = await agent.run_turn("go")
        assert isinstance(reason, ErrorReason)
        starts = [e for e in agent.session.events if e.type == "compaction/start"]
        assert len(starts) == 1  # maxOverflowRetries: 1


async def test_pruning_alone_can_relieve_pressure() -> None:
    # One huge tool result pushes the request over 80 % of the window; pruning it is enough,
    # so no summary request is made (compaction_responses is empty: one would fail).
    script = [call("q", times=20_000), {"text": "done"}]
    pruner = Row(
        name="compaction-tool-result-pruner",
        config={"thresholdChars": 2000, "headChars": 500, "tailChars": 200},
    )
    base = rows(script, context_window=6000, summaries=[])
    async with host_with(base, Row(name="token-meter"), pruner, Row(name="compaction-basic")) as h:
        register_echo(h)
        agent = new_agent(h)
        assert isinstance(await agent.run_turn("go"), CompletedReason)
        events = agent.session.events
        assert [e.type for e in events if e.type.startswith("compaction/")] == ["compaction/prune"]
        assert all(r.purpose is None for r in model_requests(h))
        replaced = [e for e in events if isinstance(e.surface_op, ReplaceOp)]
        assert [e.type for e in replaced] == ["tool/result"]
        final = model_requests(h)[-1]
        assert sum(len(str(m)) for m in final.messages) < 10_000


async def test_a_live_bracket_blocks_and_a_stale_one_does_not(tmp_path: Path) -> None:
    script = [call("a" * 3000), call("b" * 3000), {"text": "done"}]
    base = rows(script, context_window=1_000_000, summaries=[{"text": SUMMARY}])
    persistence = Row(name="session-persistence-jsonl", config={"root": str(tmp_path)})
    async with host_with(base, *basic(), persistence) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        session_id = agent.id
        # A bracket a crashed process left open (the process "dies" here: no end).
        agent.session.append("compaction/start", {"compactionId": "dead", "turn": None})
        with pytest.raises(ManualCompactionError) as caught:
            await host.ctx.compaction.compact_now(agent)
        assert caught.value.code == "busy"
        await agent.aclose()
    # The next lifecycle (resume appends session/end-seed) makes it stale evidence.
    again = rows([], context_window=1_000_000, summaries=[{"text": SUMMARY}])
    async with host_with(again, *basic(), persistence) as host:
        agent = await host.ctx.agent.resume(session_id)
        assert agent.session.events[-1].type == "session/end-seed"
        result = await host.ctx.compaction.compact_now(agent)
        assert result is not None
        [dead] = [e for e in agent.session.events if e.type == "compaction/start"][:1]
        assert dead.data["compactionId"] == "dead"  # kept as it was; repair never closes it
        await agent.aclose()


async def test_compact_now_refuses_a_running_agent() -> None:
    script = [{"text": "slow", "delay_ms": 200}]
    async with host_with(rows(script, summaries=[]), *basic()) as host:
        agent = new_agent(host)
        async with anyio.create_task_group() as group:
            started = anyio.Event()
            host.ctx.on("agent/turn-start", lambda payload: started.set())
            group.start_soon(agent.run_turn, "go")
            await started.wait()
            with pytest.raises(ManualCompactionError) as caught:
                await host.ctx.compaction.compact_now(agent)
            assert caught.value.code == "busy"
