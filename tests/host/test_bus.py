from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from dsh_host._bus import EventBus, EventMode, EventSpec
from dsh_host.errors import EventModeConflictError, HandlerKindError, UndeclaredEventError

pytestmark = pytest.mark.anyio


def make_bus() -> EventBus:
    bus = EventBus()
    bus.declare(EventSpec("t/wf", EventMode.WATERFALL, 1))
    bus.declare(EventSpec("t/emit", EventMode.EMIT, 1))
    bus.declare(EventSpec("t/par", EventMode.PARALLEL, 1))
    bus.declare(EventSpec("t/ser", EventMode.SERIAL, 1))
    bus.declare(EventSpec("t/stream", EventMode.STREAM_WATERFALL, 1))
    return bus


async def test_waterfall_order_outer_first_and_veto() -> None:
    bus = make_bus()
    trace: list[str] = []

    async def outer(arg: Any, next_: Any) -> str:
        trace.append("outer in")
        result: str = await next_()
        trace.append("outer out")
        return f"outer({result})"

    async def inner(arg: Any, next_: Any) -> str:
        trace.append("inner")
        result: str = await next_()
        return f"inner({result})"

    bus.add("t/wf", outer, None)
    bus.add("t/wf", inner, None)

    async def default() -> str:
        trace.append("default")
        return "body"

    assert await bus.waterfall("t/wf", 1, default) == "outer(inner(body))"
    assert trace == ["outer in", "inner", "default", "outer out"]

    async def veto(arg: Any, next_: Any) -> str:
        return "vetoed"

    bus2 = make_bus()
    bus2.add("t/wf", veto, None)
    bus2.add("t/wf", inner, None)
    trace.clear()
    assert await bus2.waterfall("t/wf", 1, default) == "vetoed"
    assert trace == []


async def test_waterfall_next_twice_reruns_downstream() -> None:
    bus = make_bus()
    calls: list[str] = []

    async def retry(arg: Any, next_: Any) -> int:
        first: int = await next_()
        second: int = await next_()
        return first + second

    async def counter(arg: Any, next_: Any) -> int:
        calls.append("counter")
        result: int = await next_()
        return result

    bus.add("t/wf", retry, None)
    bus.add("t/wf", counter, None)

    async def default() -> int:
        return 1

    assert await bus.waterfall("t/wf", None, default) == 2
    assert calls == ["counter", "counter"]


async def test_emit_contains_failures_and_continues() -> None:
    bus = make_bus()
    seen: list[int] = []

    def broken(x: int) -> None:
        raise ValueError("observer bug")

    bus.add("t/emit", broken, None)
    bus.add("t/emit", seen.append, None)
    bus.emit("t/emit", 7)
    assert seen == [7]


async def test_emit_contains_a_printer_that_exits_on_a_closed_pipe() -> None:
    """rich turns a write to a closed pipe into ``SystemExit(1)``: from an observer (the CLI
    transcript) it must stop that observer, not the code that emitted (a turn)."""
    bus = make_bus()
    seen: list[int] = []

    def printer(x: int) -> None:
        raise SystemExit(1)

    bus.add("t/emit", printer, None)
    bus.add("t/emit", seen.append, None)
    bus.emit("t/emit", 7)
    assert seen == [7]

    def interrupted(x: int) -> None:
        raise KeyboardInterrupt

    bus.add("t/emit", interrupted, None)
    with pytest.raises(KeyboardInterrupt):  # not a listener's failure: it propagates
        bus.emit("t/emit", 8)


async def test_parallel_runs_all_and_raises_first_registered_failure() -> None:
    bus = make_bus()
    finished: list[str] = []

    async def slow_ok(x: int) -> None:
        await anyio.sleep(0.01)
        finished.append("slow")

    async def fails_a(x: int) -> None:
        raise KeyError("a")

    async def fails_b(x: int) -> None:
        raise ValueError("b")

    bus.add("t/par", fails_a, None)
    bus.add("t/par", slow_ok, None)
    bus.add("t/par", fails_b, None)
    with pytest.raises(KeyError):
        await bus.parallel("t/par", 1)
    assert finished == ["slow"], "a failing sibling must not cancel the others"


async def test_serial_awaits_every_listener_in_turn_and_returns_nothing() -> None:
    bus = make_bus()
    trace: list[str] = []

    async def first(x: int) -> None:
        trace.append("first in")
        await anyio.lowlevel.checkpoint()
        trace.append("first out")

    async def returns_a_value(x: int) -> int:
        trace.append("second")
        return x * 2  # a value is ignored: it does not stop the chain

    async def third(x: int) -> None:
        trace.append("third")

    for fn in (first, returns_a_value, third):
        bus.add("t/ser", fn, None)
    # serial is typed -> None; at run time a listener's return value must not leak through it
    assert await bus.serial("t/ser", 4) is None  # type: ignore[func-returns-value]
    assert trace == ["first in", "first out", "second", "third"]


def test_there_is_no_bail_mode() -> None:
    assert {mode.value for mode in EventMode} == {
        "emit",
        "parallel",
        "serial",
        "waterfall",
        "stream-waterfall",
    }
    assert not hasattr(EventBus, "bail")


async def test_stream_waterfall_is_lazy() -> None:
    bus = make_bus()
    trace: list[str] = []

    def wrapper(arg: Any, next_: Any) -> AsyncIterator[int]:
        async def gen() -> AsyncIterator[int]:
            trace.append("wrapper first pull")
            async for item in next_():
                yield item * 10

        return gen()

    bus.add("t/stream", wrapper, None)

    def adapter(arg: Any) -> AsyncIterator[int]:
        trace.append("adapter constructed")

        async def gen() -> AsyncIterator[int]:
            yield 1
            yield 2

        return gen()

    stream = bus.waterfall_stream("t/stream", None, adapter)
    assert trace == [], "nothing may run before the stream is consumed"
    assert [x async for x in stream] == [10, 20]
    assert trace == ["wrapper first pull", "adapter constructed"]


async def test_async_generator_function_is_a_valid_stream_listener() -> None:
    bus = make_bus()

    async def wrapper(arg: Any, next_: Any) -> AsyncIterator[int]:
        async for item in next_():
            yield item + 1

    bus.add("t/stream", wrapper, None)

    async def adapter_gen() -> AsyncIterator[int]:
        yield 1

    assert [x async for x in bus.waterfall_stream("t/stream", None, lambda a: adapter_gen())] == [2]


def test_wrong_handler_kinds_are_registration_errors() -> None:
    bus = make_bus()

    async def async_fn(x: Any) -> None:
        return None

    def sync_fn(x: Any) -> None:
        return None

    async def async_wf(x: Any, next_: Any) -> None:
        return None

    with pytest.raises(HandlerKindError, match="never be awaited"):
        bus.add("t/emit", async_fn, None)
    with pytest.raises(HandlerKindError, match="async def"):
        bus.add("t/par", sync_fn, None)
    with pytest.raises(HandlerKindError, match="coroutine"):
        bus.add("t/stream", async_wf, None)
    with pytest.raises(HandlerKindError, match=r"\(arg, next\)"):
        bus.add("t/wf", async_fn, None)  # forgot the next parameter


def test_undeclared_and_conflicting_events() -> None:
    bus = make_bus()
    with pytest.raises(UndeclaredEventError, match="t/nope"):
        bus.emit("t/nope")
    with pytest.raises(EventModeConflictError):
        bus.declare(EventSpec("t/wf", EventMode.EMIT))
    with pytest.raises(EventModeConflictError):
        bus.emit("t/wf", 1)
