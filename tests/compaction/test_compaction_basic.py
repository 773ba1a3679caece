"""``compaction-basic`` (issue 22): a scripted long session whose surface crosses the threshold
of a small declared context window is compacted at ``agent/pre-step`` with the summary from the
scripted model; the model view shrinks while the log and the transcript keep every event; the
compacted session resumes from JSONL and the reader round-trips it byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_compaction_basic import (
    CHECKPOINT_PREAMBLE,
    COMPACTION_INSTRUCTION,
    SUMMARY_CLOSE_TAG,
    SUMMARY_OPEN_TAG,
)

from dsh_host import Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._session.compaction import (
    MANUAL_COMPACTION_TEXTS,
    ManualCompactionError,
    compacted_text,
    is_compact_checkpoint_source,
)
from dsh_host._session.events import CompletedReason, ReplaceOp, SessionEvent, encode_event
from dsh_host._session.messages import TextBlock, UserMessage
from dsh_host._session.session import Session, derive_messages_from_events
from dsh_host.errors import AbortError, ConfigError

from .compaction_helpers import (
    call,
    host_with,
    model_requests,
    new_agent,
    register_echo,
    rows,
    surface_types,
)

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SUMMARY = "## Primary Request and Intent\n- emit chunks\n## Current Work\n- chunk emission"
WINDOW = 4000  # threshold 3200 tokens, retain 640


def compaction_rows(root: Path | None = None, **basic: Any) -> list[Row]:
    extra = [
        Row(name="token-meter"),
        Row(name="compaction-basic", config=basic),
    ]
    if root is not None:
        extra.append(Row(name="session-persistence-jsonl", config={"root": str(root)}))
        extra.append(Row(name="session-checkpoint-policy"))
    return extra


def long_script(steps: int, size: int = 2400) -> list[dict[str, Any]]:
    return [call(f"chunk {i} " + "z" * size) for i in range(steps)] + [{"text": "all done"}]


def of_type(session_or_events: Any, kind: str) -> list[SessionEvent]:
    events = getattr(session_or_events, "events", session_or_events)
    return [e for e in events if e.type == kind]


def checkpoint_events(events: Any) -> list[SessionEvent]:
    return [
        e
        for e in events
        if e.type == "user/message"
        and isinstance(e.surface_op, ReplaceOp)
        and is_compact_checkpoint_source(e.data.source)
    ]


async def test_a_long_session_is_compacted_at_pre_step(tmp_path: Path) -> None:
    base = rows(long_script(12), context_window=WINDOW, summaries=[{"text": SUMMARY}] * 6)
    async with host_with(base, *compaction_rows()) as host:
        register_echo(host)
        agent = new_agent(host)
        reason = await agent.run_turn("emit twelve chunks")
        assert isinstance(reason, CompletedReason)
        session = agent.session
        events = session.events

        starts = of_type(session, "compaction/start")
        assert starts, "the surface crossed the threshold but nothing was compacted"
        # Every bracket is start, summary, the replacement, end — adjacent, owned by turn 1.
        for start in starts:
            s = start.seq
            assert [events[s + k].type for k in range(4)] == [
                "compaction/start",
                "compaction/summary",
                "user/message",
                "compaction/end",
            ]
            assert start.data["turn"] == 1 and events[s + 3].data["turn"] == 1
            assert "error" not in events[s + 3].data
            cid = start.data["compactionId"]
            summary_event, checkpoint = events[s + 1], events[s + 2]
            assert summary_event.data["compactionId"] == cid
            assert summary_event.data["llmStreamCall"] is True
            assert summary_event.data["provider"] == "scripted"
            assert summary_event.data["maxTokens"] == 8192
            assert [dict(b) for b in summary_event.data["summary"]] == [
                {"type": "text", "text": SUMMARY}
            ]
            shadowed = list(summary_event.data["shadowedSeqs"])
            rng = summary_event.data["shadowedRange"]
            assert (rng["start"], rng["end"]) == (shadowed[0], shadowed[-1])
            assert checkpoint.surface_op == ReplaceOp(start=shadowed[0], end=shadowed[-1])
            assert checkpoint.source_event_seqs == (s, s + 1, *shadowed)
            message = checkpoint.data
            assert isinstance(message, UserMessage)
            assert message.source.compaction_id == cid  # type: ignore[union-attr]
            assert message.content == (
                TextBlock(text=f"{CHECKPOINT_PREAMBLE}\n\n{SUMMARY_OPEN_TAG}"),
                TextBlock(text=SUMMARY),
                TextBlock(text=SUMMARY_CLOSE_TAG),
            )

        # The summary requests went through llm/stream, replaying the prefix, instruction last.
        requests = model_requests(host)
        summaries = [r for r in requests if r.purpose == "compaction"]
        assert len(summaries) == len(starts)
        first = summaries[0]
        last = first.messages[-1]
        assert isinstance(last, UserMessage) and last.content[0].text == COMPACTION_INSTRUCTION  # type: ignore[union-attr]
        loop_before = [r for r in requests[: requests.index(first)] if r.purpose is None][-1]
        assert tuple(first.messages[:-1]) == tuple(loop_before.messages[: len(first.messages) - 1])
        assert first.tools == loop_before.tools
        # The request right after the compaction is smaller and opens with the checkpoint.
        after = requests[requests.index(first) + 1]
        assert after.purpose is None and len(after.messages) < len(loop_before.messages)
        assert any(
            isinstance(m, UserMessage) and is_compact_checkpoint_source(m.source)
            for m in after.messages
        )

        # The model view shrank; the log and the transcript keep every tool result.
        model_view = derive_messages_from_events(list(events))
        transcript = session.append_origin_events()
        results = [e for e in transcript if e.type == "tool/result"]
        assert len(results) == 12
        assert len(model_view) < len(transcript)
        assert all(e.seq not in session.surface.nodes for e in results[:4])
        # The surface stays balanced: every tool call on it has its result on it.
        meter = host.ctx.tokenMeter
        pressure = meter.pressure(session)
        assert pressure.context_window == WINDOW
        assert pressure.projected_tokens < WINDOW


async def test_resume_after_compaction_and_the_jsonl_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    base = rows(long_script(10), context_window=WINDOW, summaries=[{"text": SUMMARY}] * 6)
    async with host_with(base, *compaction_rows(root)) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("emit ten chunks")
        session_id = agent.id
        live = list(agent.session.events)
        live_surface = agent.session.surface.nodes
        live_messages = list(agent.session.derive_messages())
        await agent.aclose()
    assert checkpoint_events(live), "the fixture session must be compacted"

    # The JSONL reader gives back the same events, byte for byte, and the same surface.
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-jsonl", config={"root": str(root)})]
    ) as reader:
        handle = await reader.ctx.sessionPersistence.open(session_id, "read")
        load = await handle.read()
        await handle.close()
    stored = list(load.events)
    assert [encode_event(e) for e in stored] == [encode_event(e) for e in live]
    restored = Session.restore(load.header, stored, mark_seed_end=False)
    assert restored.surface.nodes == live_surface
    assert list(restored.derive_messages()) == live_messages

    # Resume: the next turn's request carries the checkpoint, not the shadowed history.
    resumed_rows = rows([{"text": "resumed"}], context_window=WINDOW, summaries=[])
    async with host_with(resumed_rows, *compaction_rows(root)) as host:
        agent = await host.ctx.agent.resume(session_id)
        assert agent.session.surface.nodes == live_surface
        await agent.run_turn("continue")
        [request] = model_requests(host)
        assert any(
            isinstance(m, UserMessage) and is_compact_checkpoint_source(m.source)
            for m in request.messages
        )
        assert len(request.messages) == len(live_messages) + 1
        await agent.aclose()


async def test_compact_now_on_an_idle_agent() -> None:
    script = [call("a" * 3000), call("b" * 3000), {"text": "done"}]
    base = rows(script, context_window=1_000_000, summaries=[{"text": SUMMARY}])
    async with host_with(base, *compaction_rows()) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        session = agent.session
        before = len(session.derive_messages())
        assert not of_type(session, "compaction/start")  # far below pressure
        result = await host.ctx.compaction.compact_now(agent, source_command_id="cmd-1")
        assert result is not None
        events = session.events
        start = events[result.start_seq]
        assert start.data["turn"] is None and start.data["sourceCommandId"] == "cmd-1"
        assert events[result.end_seq].type == "compaction/end"
        checkpoint = events[result.summary_seq + 1]
        assert checkpoint.data.source.source_command_id == "cmd-1"
        # Everything but the system prompt and the newest unit is summarized.
        assert surface_types(session)[-2:] == ["user/message", "assistant/message"]
        assert set(surface_types(session)[:-2]) <= {"system/message"}
        assert session.surface.nodes[-2] == result.summary_seq + 1
        n, tokens = len(result.shadowed_seqs), result.shadowed_token_count
        assert compacted_text(result) == f"Compacted {n} history items (~{tokens} tokens)."
        assert len(session.derive_messages()) < before
        # No compactable history left: nothing is written.
        count = session.seq
        assert await host.ctx.compaction.compact_now(agent) is None
        assert session.seq == count
        assert compacted_text(None) == "No compactable history yet."


async def test_compact_now_reports_a_failed_summary_and_leaves_the_surface() -> None:
    script = [call("a" * 3000), call("b" * 3000), {"text": "done"}]
    failing = [{"error": {"code": "SERVER", "message": "summarizer down"}}]
    base = rows(script, context_window=1_000_000, summaries=failing)
    async with host_with(base, *compaction_rows()) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        session = agent.session
        nodes = session.surface.nodes
        with pytest.raises(ManualCompactionError) as caught:
            await host.ctx.compaction.compact_now(agent)
        assert caught.value.code == "summary"
        assert MANUAL_COMPACTION_TEXTS[caught.value.code].startswith(
            "Compaction could not produce a useful summary."
        )
        assert session.surface.nodes == nodes
        [start] = of_type(session, "compaction/start")
        [end] = of_type(session, "compaction/end")
        assert end.data["compactionId"] == start.data["compactionId"]
        assert "summarizer down" in end.data["error"]
        assert not of_type(session, "compaction/summary")


async def test_a_summary_that_does_not_shrink_is_refused() -> None:
    script = [call("a" * 400), call("b" * 400), {"text": "done"}]
    base = rows(script, context_window=1_000_000, summaries=[{"text": "w" * 20_000}])
    async with host_with(base, *compaction_rows()) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        nodes = agent.session.surface.nodes
        with pytest.raises(ManualCompactionError) as caught:
            await host.ctx.compaction.compact_now(agent)
        assert caught.value.code == "summary"
        assert agent.session.surface.nodes == nodes
        [end] = of_type(agent.session, "compaction/end")
        assert "summary is not smaller than the shadowed content" in end.data["error"]


@pytest.mark.parametrize(
    "config",
    [
        {"retainRatio": 0.9},  # not below the 0.8 threshold
        {"retainRatio": 0.1, "retainTokens": 10},
        {"summarizationProvider": "x"},
        {"thresholdRatio": 1.5},
        {"unknown": 1},
        {"modelPolicies": [{"provider": "a", "model": "b"}, {"provider": "a", "model": "b"}]},
    ],
)
async def test_bad_config_fails_at_load(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        async with host_with(rows([{"text": "x"}]), *compaction_rows(**config)):
            pass


async def test_the_summary_can_be_routed_to_another_model() -> None:
    script = [call("a" * 3000), call("b" * 3000), {"text": "done"}]
    summarizer = Row(
        id="summ",
        name="llm-scripted",
        config={"provider": "summ", "model": "small", "responses": [{"text": SUMMARY}]},
    )
    config: dict[str, Any] = {"summarizationProvider": "summ", "summarizationModel": "small"}
    async with host_with(rows(script, summaries=[]), summarizer, *compaction_rows(**config)) as h:
        register_echo(h)
        agent = new_agent(h)
        await agent.run_turn("go")
        result = await h.ctx.compaction.compact_now(agent)
        assert result is not None
        summary = agent.session.events[result.summary_seq]
        assert (summary.data["provider"], summary.data["model"]) == ("summ", "small")
        [request] = model_requests(h, "summ")
        assert request.purpose == "compaction" and request.config.model == "small"
        assert all(r.purpose is None for r in model_requests(h))


@pytest.mark.parametrize("who", ["agent", "caller"])
async def test_cancelling_compact_now_closes_the_bracket(who: str) -> None:
    script = [call("a" * 3000), call("b" * 3000), {"text": "done"}]
    base = rows(script, context_window=1_000_000, summaries=[{"hang": True}])
    async with host_with(base, *compaction_rows()) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        session = agent.session
        nodes = session.surface.nodes
        caller = CancelToken()
        asked = anyio.Event()

        def on_stream(request: Any, next_: Any) -> Any:
            if request.purpose == "compaction":
                asked.set()
            return next_()

        host.ctx.on("llm/stream", on_stream)
        outcome: list[BaseException] = []

        async def compact() -> None:
            try:
                await host.ctx.compaction.compact_now(agent, caller)
            except Exception as error:
                outcome.append(error)

        async with anyio.create_task_group() as group:
            group.start_soon(compact)
            await asked.wait()
            assert agent.status == "running"  # maintenance holds turn admission
            if who == "agent":
                agent.cancel()
            else:
                caller.abort("stop")
        [error] = outcome
        if who == "agent":
            assert isinstance(error, ManualCompactionError) and error.code == "cancelled"
        else:
            assert isinstance(error, AbortError)
        assert session.surface.nodes == nodes
        [end] = [e for e in session.events if e.type == "compaction/end"]
        assert "error" in end.data
        assert agent.status == "idle"
