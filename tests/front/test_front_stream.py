"""``agent.stream(...)``: typed events in log order; leaving the loop stops the events, not the turn."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from msgspec import UNSET

from dsh_host import Agent, ToolContext, tool
from dsh_host._agent import RequestErrorContext, Retry
from dsh_host._front import events as ev
from dsh_host._session.events import AbortedReason, CompletedReason, UserCancel

from .front_helpers import events_of, script

# both backends: streaming and cancellation through the front door
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@tool(approval="ask")
def charge(ctx: ToolContext, customer: str, cents: int) -> dict[str, Any]:
    """Charge a customer."""
    return {"charged": cents, "key": ctx.call_id}


@tool
async def lookup(customer: str) -> str:
    """Look a customer up."""
    return f"{customer} is known"


LOGGED = {
    "tool/call": ev.ToolCallStarted,
    "tool/result": ev.ToolCallFinished,
    "approval/asked": ev.ApprovalAsked,
    "approval/decided": ev.ApprovalDecided,
    "turn/end": ev.TurnEnd,
}


async def test_stream_order_is_log_order(tmp_path: Path) -> None:
    model = script(tmp_path, [
        {"reasoning": "Look up first.", "text": "Checking.",
         "tool_calls": [{"name": "lookup", "arguments": {"customer": "c1"}},
                        {"name": "charge", "arguments": {"customer": "c1", "cents": 5}}]},
        {"text": "Charged c1 five cents."},
    ])
    async with Agent(model, tools=[charge, lookup], store=None, approval=lambda r: True) as agent:
        seen: list[ev.Event] = []
        stream = agent.stream("charge c1")
        async for event in stream:
            seen.append(event)
        log = events_of(agent)
    assert stream.result is not None and stream.result.output == "Charged c1 five cents."
    logged = [e for e in seen if not isinstance(e, ev.TextDelta | ev.ReasoningDelta)]
    expected = [e for e in log if e.type in LOGGED]
    seqs = [(type(e), e.seq) for e in logged if not isinstance(e, ev.Retry)]  # Retry: checked below
    assert seqs == [(LOGGED[e.type], e.seq) for e in expected]
    assert [type(e) for e in logged] == [
        ev.ToolCallStarted, ev.ToolCallFinished,
        ev.ToolCallStarted, ev.ApprovalAsked, ev.ApprovalDecided, ev.ToolCallFinished,
        ev.TurnEnd,
    ]
    assert isinstance(seen[-1], ev.TurnEnd) and seen[-1].reason == CompletedReason()
    finished = [e for e in logged if isinstance(e, ev.ToolCallFinished)]
    assert finished[0].text == "c1 is known" and not finished[0].is_error
    assert finished[0].value == "c1 is known"
    assert '"key":"call_1_2"' in finished[1].text
    assert finished[1].value == {"charged": 5, "key": "call_1_2"}
    assert type(finished[1].value) is dict  # thawed from the frozen JSON
    # Deltas arrive before the assistant/message that records them, step by step.
    steps: dict[int, str] = {}
    for event in seen:
        if isinstance(event, ev.TextDelta):
            steps[event.step] = steps.get(event.step, "") + event.text
    assert steps == {1: "Checking.", 2: "Charged c1 five cents."}
    reasoning = "".join(e.text for e in seen if isinstance(e, ev.ReasoningDelta))
    assert reasoning == "Look up first."
    first_call = next(i for i, e in enumerate(seen) if isinstance(e, ev.ToolCallStarted))
    assert all(
        i < first_call for i, e in enumerate(seen) if isinstance(e, ev.TextDelta) and e.step == 1
    )


async def test_a_retried_request_shows_as_a_retry_event(tmp_path: Path) -> None:
    model = script(tmp_path, [
        {"text": "Partial", "error": {"code": "RATE_LIMIT", "message": "slow down"}},
        {"text": "Recovered."},
    ])
    async with Agent(model, store=None) as agent:

        async def retry_once(
            context: RequestErrorContext, next_: Callable[[], Awaitable[Any]]
        ) -> Any:
            return Retry() if context.attempt == 0 else await next_()

        agent.host.ctx.on("agent/request-error", retry_once)
        seen = [event async for event in agent.stream("hi")]
    kinds = [type(e) for e in seen]
    retry = next(e for e in seen if isinstance(e, ev.Retry))
    assert retry.failure.code == "RATE_LIMIT" and retry.attempt == 0
    after = seen[kinds.index(ev.Retry) + 1:]
    assert "".join(e.text for e in after if isinstance(e, ev.TextDelta)) == "Recovered."
    assert isinstance(seen[-1], ev.TurnEnd) and seen[-1].reason == CompletedReason()


LONG = {"text": " ".join(f"word{i}" for i in range(200)), "chunk_delay_ms": 20}


async def test_breaking_out_of_the_stream_stops_the_events_not_the_turn(tmp_path: Path) -> None:
    model = script(tmp_path, [LONG, {"text": "next turn"}])
    async with Agent(model, store=tmp_path / "s") as agent:
        with anyio.fail_after(60):
            async for event in agent.stream("talk"):
                if isinstance(event, ev.TextDelta):
                    break
            gc.collect()  # a no-op on CPython (refcounting); keeps other interpreters honest
            after = await agent.run("again")  # waits for the first turn to end first
        ends = [e.data for e in events_of(agent, "turn/end")]
    assert ends[0].reason == CompletedReason()  # printing stopped; the turn did not
    assert after.output == "next turn" and after.turn == 2
    (message,) = [e for e in events_of(agent, "assistant/message") if e.data.turn == 1]
    assert message.data.interrupted is UNSET
    assert "".join(b.text for b in message.data.message.content) == LONG["text"]


async def test_a_consumer_that_fails_leaves_the_turn_whole(tmp_path: Path) -> None:
    """The loop's body raises (a closed pipe): the error reaches the caller once the turn
    ended, completed and logged whole (before: the turn was cancelled, ``aborted``)."""
    model = script(tmp_path, [LONG])
    async with Agent(model, store=None) as agent:
        with anyio.fail_after(60), pytest.raises(BrokenPipeError):
            async with agent.stream("talk") as events:
                async for event in events:
                    if isinstance(event, ev.TextDelta):
                        raise BrokenPipeError(32, "Broken pipe")
        assert agent.core.status == "idle"
        (end,) = events_of(agent, "turn/end")
    assert end.data.reason == CompletedReason()


async def test_cancel_is_how_a_stream_stops_its_turn(tmp_path: Path) -> None:
    model = script(tmp_path, [LONG])
    async with Agent(model, store=None) as agent:
        with anyio.fail_after(60):
            async with agent.stream("talk") as events:
                async for event in events:
                    if isinstance(event, ev.TextDelta):
                        events.cancel()
            assert agent.core.status == "idle"
        (end,) = events_of(agent, "turn/end")
    assert end.data.reason == AbortedReason(reason=UserCancel())


def test_turn_end_kind_is_the_logged_kind() -> None:
    from dsh_host._session.events import UnknownTurnEndReason

    assert ev.TurnEnd(1, 1, CompletedReason()).kind == "completed"
    assert ev.TurnEnd(1, 1, AbortedReason(reason=UserCancel())).kind == "aborted"
    assert ev.TurnEnd(1, 1, UnknownTurnEndReason({"kind": "paused"})).kind == "paused"
