"""Cancellation ends a turn ``aborted`` with honest tool results (D2, D6)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from msgspec import UNSET

from dsh_host import CancelToken, Row
from dsh_host._agent import Agent
from dsh_host._session.events import (
    AbortedReason,
    AssistantMessageData,
    CompletedReason,
    DisposedCancel,
    HookCancel,
    ParentCancel,
    ToolResultData,
    UserCancel,
)
from dsh_host._session.messages import (
    AssistantMessage,
    TextBlock,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    ToolResultBlock,
)
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._tools import Ask, ToolExecution
from dsh_host._tools.types import STOPPED_OUTCOME_UNKNOWN_TEXT

from .agent_helpers import agent_service, live_types, model_requests, register_tool, scripted_host

# D18: a body that had started when its call was cancelled is recorded as outcome unknown.
STOPPED = STOPPED_OUTCOME_UNKNOWN_TEXT
UNKNOWN = "TOOL_OUTCOME_UNKNOWN"

# both backends: cancellation in the agent loop
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def results(agent: Agent) -> list[tuple[str, str, str | None]]:
    """(call id, model text, error code) of every tool/result, in log order."""
    out = []
    for event in agent.session.events:
        if event.type == "tool/result":
            data = event.data
            assert isinstance(data, ToolResultData)
            block = data.message.content[0]
            assert isinstance(block, ToolResultBlock)
            text = "".join(b.text for b in block.content if isinstance(b, TextBlock))
            code = data.error.code if data.error is not UNSET else None
            out.append((data.message.source.call_id, text, code))
    return out


async def run_and_cancel(
    agent: Agent, started: anyio.Event, cause: Any = None, prompt: str = "go"
) -> Any:
    outcome: list[Any] = []

    async def turn() -> None:
        outcome.append(await agent.run_turn(prompt))

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn)
        with anyio.fail_after(20):
            await started.wait()
        agent.cancel(cause)
    return outcome[0]


# --------------------------------------------------------------------------- streaming


async def test_cancel_mid_stream_keeps_the_visible_prefix() -> None:
    responses = [{"text": "partial", "hang": True}, {"text": "recovered"}]
    async with scripted_host(responses) as host:
        seen = anyio.Event()

        def watch(request: Any, next: Any) -> Any:
            async def relay() -> Any:
                async for chunk in next():
                    if isinstance(chunk, TextDeltaChunk):
                        seen.set()
                    yield chunk

            return relay()

        host.ctx.on("llm/stream", watch)
        agent = agent_service(host).create()
        reason = await run_and_cancel(agent, seen)
        kinds = live_types(agent.session)
        [anchor] = [e for e in agent.session.events if e.type == "assistant/message"]
        # the next turn completes and replays the prefix
        assert await agent.run_turn("again") == CompletedReason()
        second = model_requests(host)[1].messages
    assert reason == AbortedReason(reason=UserCancel())
    assert kinds[-4:] == ["request/context", "assistant/message", "step/end", "turn/end"]
    data = anchor.data
    assert isinstance(data, AssistantMessageData)
    assert data.interrupted is True
    assert data.message.content == (TextBlock(text="partial"),)
    assert any(
        isinstance(m, AssistantMessage) and m.content == (TextBlock(text="partial"),)
        for m in second
    )


async def test_cancel_mid_stream_drops_a_half_streamed_tool_call() -> None:
    responses = [{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}], "hang": True}]
    async with scripted_host(responses) as host:
        seen = anyio.Event()

        def watch(request: Any, next: Any) -> Any:
            async def relay() -> Any:
                async for chunk in next():
                    yield chunk
                    if isinstance(chunk, ToolCallDeltaChunk):
                        seen.set()

            return relay()

        host.ctx.on("llm/stream", watch)
        ran: list[bool] = []

        async def echo(args: Any, exec: ToolExecution) -> Any:
            ran.append(True)
            return "x"

        register_tool(host, "echo", echo)
        agent = agent_service(host).create()
        reason = await run_and_cancel(agent, seen)
        kinds = live_types(agent.session)
    assert isinstance(reason, AbortedReason)
    assert "tool/call" not in kinds
    assert "assistant/message" not in kinds  # nothing visible: the raw attempt is kept instead
    assert kinds[-3:] == ["assistant/attempt", "step/end", "turn/end"]
    assert ran == []


# --------------------------------------------------------------------------- tool bodies


async def test_cancel_during_a_tool_body() -> None:
    responses = [
        {
            "tool_calls": [
                {"name": "slow", "id": "call-slow"},
                {"name": "after", "id": "call-after"},
            ]
        },
        {"text": "never requested"},
    ]
    async with scripted_host(responses) as host:
        started = anyio.Event()
        trail: list[str] = []

        async def slow(args: Any, exec: ToolExecution) -> Any:
            started.set()
            await exec.signal.wait()
            await anyio.sleep(0.01)  # still working after the abort: it is awaited anyway
            trail.append("slow finished")
            return "late success"

        async def after(args: Any, exec: ToolExecution) -> Any:
            trail.append("after ran")
            return "x"

        register_tool(host, "slow", slow)
        register_tool(host, "after", after)
        agent = agent_service(host).create()
        reason = await run_and_cancel(agent, started, HookCancel(reason="deadline"))
        kinds = live_types(agent.session)
        requests = model_requests(host)
    assert reason == AbortedReason(reason=HookCancel(reason="deadline"))
    assert trail == ["slow finished"]
    assert results(agent) == [
        ("call-slow", STOPPED + "What the tool returned when it stopped:late success", UNKNOWN),
        ("call-after", "Error: tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH"),
    ]
    tail = kinds[kinds.index("assistant/message") :]
    assert tail == [
        "assistant/message",
        "tool/call",
        "tool/result",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    assert len(requests) == 1


async def test_cancel_during_a_parallel_group_drains_started_calls() -> None:
    responses = [
        {
            "tool_calls": [
                {"name": "par", "arguments": {"n": 1}, "id": "p1"},
                {"name": "par", "arguments": {"n": 2}, "id": "p2"},
                {"name": "excl", "id": "x"},
            ]
        },
    ]
    async with scripted_host(responses, maxParallelToolCalls=2) as host:
        both = anyio.Event()
        running: list[int] = []

        async def par(args: Any, exec: ToolExecution) -> Any:
            running.append(args["n"])
            if len(running) == 2:
                both.set()
            await exec.signal.wait()
            return "stopped"

        async def excl(args: Any, exec: ToolExecution) -> Any:
            raise AssertionError("the barrier after an aborted group must never run")

        register_tool(host, "par", par, parallel=True)
        register_tool(host, "excl", excl)
        agent = agent_service(host).create()
        reason = await run_and_cancel(agent, both)
    assert isinstance(reason, AbortedReason)
    assert [(call_id, code) for call_id, _, code in results(agent)] == [
        ("p1", UNKNOWN),
        ("p2", UNKNOWN),
        ("x", "ABORTED_BEFORE_DISPATCH"),
    ]


async def test_cancel_during_a_bash_body_kills_the_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = f"echo $$ > {pid_file}; exec sleep 60"
    responses = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "id": "b1",
                    "arguments": {"command": command, "description": "sleep a while"},
                }
            ]
        },
    ]
    rows = [
        Row(
            name="builtin-tools",
            config={"workspace": str(tmp_path), "sandbox": "danger-full-access"},
        )
    ]
    async with scripted_host(responses, *rows) as host:
        started = anyio.Event()

        async def watch_pid() -> None:
            while not _read(pid_file):  # noqa: ASYNC110 - the writer is another process
                await anyio.sleep(0.02)
            started.set()

        agent = agent_service(host).create()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_pid)
            reason = await run_and_cancel(agent, started)
    assert isinstance(reason, AbortedReason)
    assert results(agent) == [("b1", STOPPED, UNKNOWN)]
    with pytest.raises(ProcessLookupError):
        os.kill(int(_read(pid_file)), 0)


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


# --------------------------------------------------------------------------- approval


async def test_cancel_during_approval() -> None:
    responses = [{"tool_calls": [{"name": "guarded", "id": "g"}]}, {"text": "never"}]
    async with scripted_host(responses, Row(name="user-approval")) as host:
        asked = anyio.Event()
        ran: list[bool] = []

        async def guarded(args: Any, exec: ToolExecution) -> Any:
            ran.append(True)
            return "ran"

        async def ask(exec: ToolExecution, next: Any) -> Any:
            return Ask("needs a human")

        async def answerer(request: Any, next: Any) -> Any:
            asked.set()
            await anyio.sleep_forever()

        register_tool(host, "guarded", guarded)
        host.ctx.on("tools/pre-execute", ask)
        host.ctx.on("approval/request", answerer)
        agent = agent_service(host).create()
        reason = await run_and_cancel(agent, asked)
        kinds = live_types(agent.session)
        decided = [e.data for e in agent.session.events if e.type == "approval/decided"]
    assert isinstance(reason, AbortedReason)
    assert ran == []
    assert results(agent) == [
        ("g", "Error: tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH")
    ]
    assert [d.outcome for d in decided] == ["cancelled"]
    tail = kinds[kinds.index("tool/call") :]
    assert tail == [
        "tool/call",
        "approval/asked",
        "approval/decided",
        "tool/result",
        "step/end",
        "turn/end",
    ]


async def test_ask_without_approval_fails_closed_in_a_turn() -> None:
    responses = [{"tool_calls": [{"name": "guarded", "id": "g"}]}, {"text": "ok, not allowed"}]
    async with scripted_host(responses) as host:

        async def guarded(args: Any, exec: ToolExecution) -> Any:
            raise AssertionError("must not run")

        async def ask(exec: ToolExecution, next: Any) -> Any:
            return Ask()

        register_tool(host, "guarded", guarded)
        host.ctx.on("tools/pre-execute", ask)
        agent = agent_service(host).create()
        reason = await agent.run_turn("go")
    assert reason == CompletedReason()
    assert results(agent) == [
        ("g", 'Error: tool "guarded" requires approval (not yet supported)', None)
    ]


# --------------------------------------------------------------------------- causes


async def test_caller_token_cancels_with_its_cause() -> None:
    async with scripted_host([{"text": "partial", "hang": True}]) as host:
        agent = agent_service(host).create()
        token = CancelToken()
        outcome: list[Any] = []

        async def turn() -> None:
            outcome.append(await agent.run_turn("go", signal=token))

        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            await anyio.wait_all_tasks_blocked()
            token.abort("parent")
    assert outcome == [AbortedReason(reason=ParentCancel())]


async def test_closing_the_agent_mid_turn_ends_it_disposed() -> None:
    async with scripted_host([{"text": "partial", "hang": True}]) as host:
        agent = agent_service(host).create()
        session = agent.session
        outcome: list[Any] = []

        async def turn() -> None:
            outcome.append(await agent.run_turn("go"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            await anyio.wait_all_tasks_blocked()
            await agent.aclose()
        assert not host.ctx.sessions.is_live(session)
    assert outcome == [AbortedReason(reason=DisposedCancel())]
    assert live_types(session)[-1] == "turn/end"


# --------------------------------------------------------------------------- host cancellation


async def test_host_cancellation_during_a_body_never_closes_a_step_with_a_call_unanswered() -> None:
    """A cancel scope around the whole turn (the host going away) is not a turn ending,
    but the step it interrupts is still closed balanced (D18): every requested call gets a
    result before ``step/end``, a started one ``TOOL_OUTCOME_UNKNOWN``, one never recorded
    ``TOOL_NOT_STARTED``; the open turn is left for crash repair, which adds only
    ``turn/end {interrupted}``. (Before: ``step/end`` with the call unanswered, and repair
    ignored calls of closed steps, so the log kept an unanswered call forever.)"""
    responses = [
        {
            "tool_calls": [
                {"name": "slow", "id": "s1"},
                {"name": "slow", "id": "s2"},
            ]
        },
    ]
    async with scripted_host(responses) as host:
        started = anyio.Event()

        async def slow(args: Any, exec: ToolExecution) -> Any:
            started.set()
            await anyio.sleep(60)
            return "done"

        register_tool(host, "slow", slow)
        agent = agent_service(host).create()
        async with anyio.create_task_group() as tg:

            async def turn() -> None:
                await agent.run_turn("go")

            tg.start_soon(turn)
            with anyio.fail_after(20):
                await started.wait()
            tg.cancel_scope.cancel()
        kinds = live_types(agent.session)
        closers = interrupted_turn_closers(agent.session.events)
    assert kinds[kinds.index("assistant/message") :] == [
        "assistant/message",
        "tool/call",
        "tool/result",
        "tool/result",
        "step/end",
    ]
    assert [(call_id, code) for call_id, _, code in results(agent)] == [
        ("s1", "TOOL_OUTCOME_UNKNOWN"),
        ("s2", "TOOL_NOT_STARTED"),
    ]
    assert [c.type for c in closers] == ["turn/end"]
