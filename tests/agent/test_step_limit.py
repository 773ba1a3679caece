"""The loop guard on the ``agent`` row: ``maxStepsPerTurn`` ends a looping turn with the
turn-end kind ``max-turn-requests {limit}`` (issue 14 item 4), durably, and every reader of a
log with that kind (or any kind it does not know) keeps working."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dsh_host import Row, open_host
from dsh_host._agent import AgentConfigError
from dsh_host._loader import PluginHost
from dsh_host._session.events import (
    CompletedReason,
    MaxTurnRequestsReason,
    SessionEvent,
    TurnEnd,
    UnknownTurnEndReason,
    event_to_builtins,
    register_turn_end_reason,
    turn_end_kind,
)
from dsh_host._session.messages import PluginSource, TextBlock, UserMessage
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._tools import ToolExecution
from dsh_host.errors import ConfigError

from .agent_helpers import agent_service, live_types, model_requests, register_tool, scripted_rows

# both backends: the agent loop
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def looping(count: int) -> list[dict[str, Any]]:
    """A model that calls the same tool again after every result (``count`` times)."""
    return [{"tool_calls": [{"name": "poll", "arguments": {"job": 7}}]} for _ in range(count)]


async def poll(args: Any, exec: ToolExecution) -> Any:
    return "still running"


@asynccontextmanager
async def persisted(root: Path, responses: list[Any], **agent: Any) -> AsyncIterator[PluginHost]:
    rows = [
        *scripted_rows(responses, **agent),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
    ]
    async with open_host(rows) as host:
        register_tool(host, "poll", poll)
        yield host


async def stored(root: Path, session_id: str) -> list[SessionEvent]:
    """The log as a fresh backend instance reads it from disk."""
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-jsonl", config={"root": str(root)})]
    ) as host:
        handle = await host.ctx.sessionPersistence.open(session_id, "read")
        load = await handle.read()
        await handle.close()
    return list(load.events)


def check_balanced(events: list[SessionEvent]) -> None:
    """Every step closed, every tool/call answered once, the turn closed last."""
    kinds = [e.type for e in events]
    assert kinds.count("step/start") == kinds.count("step/end")
    calls = [e.data.call_id for e in events if e.type == "tool/call"]
    answered = [e.data.message.source.call_id for e in events if e.type == "tool/result"]
    assert sorted(calls) == sorted(answered) and len(set(calls)) == len(calls)
    assert kinds[-1] == "turn/end"
    assert interrupted_turn_closers(events) == []


async def test_a_looping_model_ends_the_turn_at_the_limit_and_it_is_on_disk(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    async with persisted(root, looping(40), maxStepsPerTurn=5) as host:
        agent = agent_service(host).create(session_id="looping")
        reason = await agent.run_turn("wait for job 7")
        requests = len(model_requests(host))
        await agent.aclose()
    assert reason == MaxTurnRequestsReason(limit=5)
    assert requests == 5
    on_disk = await stored(root, "looping")
    assert [e.seq for e in on_disk] == list(range(len(on_disk)))
    kinds = [e.type for e in on_disk]
    assert kinds.count("step/start") == 5 and kinds.count("tool/call") == 5
    check_balanced(on_disk)
    end = on_disk[-1].data
    assert isinstance(end, TurnEnd) and end.reason == MaxTurnRequestsReason(limit=5)
    assert event_to_builtins(on_disk[-1])["data"] == {
        "turn": 1,
        "reason": {"kind": "max-turn-requests", "limit": 5},
    }


async def test_the_default_limit_is_200_steps() -> None:
    async with open_host(scripted_rows(looping(230))) as host:
        register_tool(host, "poll", poll)
        agent = agent_service(host).create()
        assert agent.options.max_steps_per_turn == 200
        reason = await agent.run_turn("wait")
        kinds = live_types(agent.session)
    assert reason == MaxTurnRequestsReason(limit=200)
    assert kinds.count("step/start") == 200


async def test_a_turn_that_finishes_on_the_last_allowed_step_completes() -> None:
    responses = [*looping(2), {"text": "job 7 finished"}]
    async with open_host(scripted_rows(responses, maxStepsPerTurn=3)) as host:
        register_tool(host, "poll", poll)
        agent = agent_service(host).create()
        reason = await agent.run_turn("wait")
    assert reason == CompletedReason()


async def test_what_the_cut_step_would_have_entered_waits_for_the_next_turn() -> None:
    responses = [
        {"tool_calls": [{"name": "note", "id": "n1"}]},
        {"text": "I saw the note"},
    ]
    async with open_host(scripted_rows(responses, maxStepsPerTurn=1)) as host:

        async def note(args: Any, exec: ToolExecution) -> Any:
            exec.defer_context(
                UserMessage(
                    id="ctx-1",
                    content=(TextBlock(text="remember"),),
                    source=PluginSource(plugin="t"),
                )
            )
            return "ok"

        register_tool(host, "note", note)
        agent = agent_service(host).create()
        first = await agent.run_turn("go")
        second = await agent.run_turn("continue")
        [_, request] = model_requests(host)
    assert first == MaxTurnRequestsReason(limit=1)
    assert second == CompletedReason()
    # the next turn answers the cut turn's call and carries the context it deferred
    texts = [
        block.text
        for message in request.messages
        if isinstance(message, UserMessage)
        for block in message.content
        if isinstance(block, TextBlock)
    ]
    assert texts[-2:] == ["continue", "remember"]  # run_turn enters the prompt, then the queue


async def test_a_bad_limit_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_steps_per_turn"):
        async with open_host(scripted_rows([{"text": "x"}], maxStepsPerTurn=0)):
            pass
    async with open_host(scripted_rows([{"text": "x"}])) as host:
        with pytest.raises(AgentConfigError, match="agent maxStepsPerTurn must be a positive"):
            agent_service(host).create(max_steps_per_turn=0)
        assert agent_service(host).create(max_steps_per_turn=3).options.max_steps_per_turn == 3


class AwaitingApprovalReason(
    msgspec.Struct, frozen=True, kw_only=True, tag="awaiting-approval", tag_field="kind"
):
    """A plugin-added kind this process knows and a later reader does not."""

    pending: tuple[str, ...]


async def test_a_kind_the_reader_does_not_know_reads_back_verbatim(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    dispose = register_turn_end_reason(AwaitingApprovalReason)
    try:
        async with persisted(root, [{"text": "x"}]) as host:
            session = host.ctx.sessions.create("plugin-kind", meta={"cwd": str(tmp_path)})
            session.append("turn/start", {"turn": 1})
            session.append(
                "turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "pending": ["c1"]}}
            )
            await host.ctx.sessions.flush(session)
    finally:
        dispose()
    [_, end] = await stored(root, "plugin-kind")
    assert isinstance(end.data, TurnEnd)
    reason = end.data.reason
    assert isinstance(reason, UnknownTurnEndReason)
    assert turn_end_kind(reason) == "awaiting-approval"
    assert event_to_builtins(end)["data"]["reason"] == {
        "kind": "awaiting-approval",
        "pending": ["c1"],
    }
    assert turn_end_kind(MaxTurnRequestsReason(limit=2)) == "max-turn-requests"
