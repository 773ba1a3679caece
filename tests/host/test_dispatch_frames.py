"""Coroutine frames a dispatch enters, counted (docs/decisions.md D50): a waterfall's levels and
the context's dispatch methods pass no await through a frame of their own."""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import anyio
import pytest

from dsh_host._bus import EventMode, EventSpec
from dsh_host._context import Host

pytestmark = pytest.mark.anyio


async def profiled(work: Callable[[], Awaitable[Any]], on_call: Callable[[FrameType], None]) -> Any:
    """``work()``'s result, with ``on_call(frame)`` for every Python function frame entered (a
    coroutine resumed is entered again) while it runs."""

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            on_call(frame)

    sys.setprofile(profile)
    try:
        return await work()
    finally:
        sys.setprofile(None)


async def coroutine_frames(work: Callable[[], Awaitable[Any]]) -> tuple[Any, Counter[str]]:
    """``work()``'s result and the coroutine frames it started, by qualified name (a frame
    resumed after a suspension is not counted again)."""
    started: Counter[str] = Counter()
    seen: list[FrameType] = []  # kept alive: no id reused while counting

    def started_coroutine(frame: FrameType) -> None:
        code = frame.f_code
        if code.co_flags & inspect.CO_COROUTINE and not any(frame is other for other in seen):
            seen.append(frame)
            started[code.co_qualname] += 1

    return await profiled(work, started_coroutine), started


async def test_a_waterfall_of_three_levels_starts_one_frame_a_level_and_no_relay() -> None:
    async with anyio.create_task_group() as tg:
        host = Host(tg)
        ctx = host.ctx
        host.bus.declare(EventSpec("t/wf", EventMode.WATERFALL, 1))
        trace: list[str] = []

        def level(name: str) -> Callable[[Any, Callable[[], Awaitable[str]]], Awaitable[str]]:
            async def listener(arg: Any, next_: Callable[[], Awaitable[str]]) -> str:
                trace.append(name)
                return f"{name}({await next_()})"

            return listener

        for name in ("a", "b", "c"):
            ctx.on("t/wf", level(name))

        async def default() -> str:
            return "body"

        result, started = await coroutine_frames(lambda: host.bus.waterfall("t/wf", 1, default))
    assert result == "a(b(c(body)))" and trace == ["a", "b", "c"]
    assert started == Counter(
        {
            "EventBus.waterfall": 1,
            "_run_chain": 2,  # the second and third levels; the first is the dispatch's own
            "test_a_waterfall_of_three_levels_starts_one_frame_a_level_and_no_relay"
            ".<locals>.level.<locals>.listener": 3,
            "test_a_waterfall_of_three_levels_starts_one_frame_a_level_and_no_relay"
            ".<locals>.default": 1,
        }
    )


async def test_the_context_hands_back_the_bus_coroutine() -> None:
    async with anyio.create_task_group() as tg:
        host = Host(tg)
        ctx = host.ctx
        host.bus.declare(EventSpec("t/par", EventMode.PARALLEL, 1))
        host.bus.declare(EventSpec("t/ser", EventMode.SERIAL, 1))
        seen: list[Any] = []

        async def listener(arg: Any) -> None:
            seen.append(arg)

        ctx.on("t/par", listener)
        ctx.on("t/ser", listener)
        _, par = await coroutine_frames(lambda: ctx.parallel("t/par", 1))
        _, ser = await coroutine_frames(lambda: ctx.serial("t/ser", 2))
        with pytest.raises(TypeError, match="positional arguments only"):
            await ctx.parallel("t/par", arg=3)  # type: ignore[call-overload]
    assert seen == [1, 2]
    assert "Context.parallel" not in par
    assert "Context.serial" not in ser and ser["EventBus.serial"] == 1


async def test_a_parallel_event_with_one_listener_starts_only_the_listener() -> None:
    async with anyio.create_task_group() as tg:
        host = Host(tg)
        ctx = host.ctx
        host.bus.declare(EventSpec("t/par", EventMode.PARALLEL, 1))
        seen: list[Any] = []

        async def listener(arg: Any) -> None:
            if arg == "boom":
                raise ValueError(arg)
            seen.append(arg)

        ctx.on("t/par", listener)
        _, one = await coroutine_frames(lambda: ctx.parallel("t/par", 1))
        with pytest.raises(ValueError, match="boom"):  # its failure is the caller's, as ever
            await ctx.parallel("t/par", "boom")

        async def other(arg: Any) -> None:
            seen.append(("other", arg))

        ctx.on("t/par", other)
        _, two = await coroutine_frames(lambda: ctx.parallel("t/par", 2))
    assert seen[0] == 1 and sorted(map(repr, seen[1:])) == ["('other', 2)", "2"]  # any order
    # One listener: its own coroutine is the dispatch, nothing awaits it on the way.
    assert one == Counter(
        {"test_a_parallel_event_with_one_listener_starts_only_the_listener.<locals>.listener": 1}
    )
    # Two: both run in a task group (anyio's frames and trio's beside them).
    assert two["EventBus._parallel_all"] == 1


async def calls_in(work: Callable[[], Awaitable[Any]]) -> Counter[str]:
    """Every Python function entered while ``work()`` runs, by qualified name."""
    calls: Counter[str] = Counter()
    await profiled(work, lambda frame: calls.update((frame.f_code.co_qualname,)))
    return calls


async def test_a_dispatch_without_keywords_makes_no_keyword_check_call() -> None:
    async with anyio.create_task_group() as tg:
        host = Host(tg)
        ctx = host.ctx
        host.bus.declare(EventSpec("t/emit", EventMode.EMIT, 1))
        host.bus.declare(EventSpec("t/par", EventMode.PARALLEL, 1))
        seen: list[Any] = []

        async def listener(arg: Any) -> None:
            seen.append(arg)

        ctx.on("t/emit", seen.append)
        ctx.on("t/par", listener)

        async def work() -> None:
            ctx.emit("t/emit", 1)
            await ctx.parallel("t/par", 2)

        calls = await calls_in(work)
        with pytest.raises(TypeError, match="positional arguments only"):
            ctx.emit("t/emit", arg=3)  # type: ignore[call-overload]
    assert seen == [1, 2]
    assert calls["Context.emit"] == 1 and calls["Context.parallel"] == 1
    assert calls["_no_keywords"] == 0


async def test_a_dispatch_by_key_resolves_its_spec_without_a_call() -> None:
    from dsh_host._bus import Emit, Parallel
    from dsh_host.errors import EventModeConflictError

    async with anyio.create_task_group() as tg:
        host = Host(tg)
        bus = host.bus
        key: Emit[[int]] = Emit("t/key")
        bus.declare(key)
        seen: list[int] = []
        bus.add(key, seen.append, None)

        async def work() -> None:
            bus.emit(key, 1)  # by its key
            bus.emit("t/key", 2)  # by its name

        calls = await calls_in(work)
        # A key whose name is declared with another mode is still refused at dispatch.
        with pytest.raises(EventModeConflictError):
            bus.emit(Parallel("t/key"), 3)
    assert seen == [1, 2]
    assert calls["EventBus.spec"] == 0
    assert calls["EventBus._resolve"] == 0
    assert calls["_check_same_mode"] == 0
