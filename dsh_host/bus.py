"""The host-owned async event bus.

Every event name is *declared* once with its dispatch mode, so a listener of
the wrong kind is refused when it registers rather than misbehaving when it
is (or is not) awaited. Modes (DECISIONS D4):

``EMIT``
    Notification. Listeners are plain sync callables, called in order; each
    listener's exception is contained and logged, so one broken observer never
    starves the next.
``PARALLEL``
    Async listeners all start, all are awaited. If any failed, the failure of
    the first-registered failing listener is raised after every listener
    settled (the others are logged). Siblings are never cancelled: a flush
    listener that is half way through an fsync must finish.
``SERIAL``
    Async listeners one at a time; the first result that is not None/False
    is returned and the rest are skipped.
``BAIL``
    The synchronous version of SERIAL.
``WATERFALL``
    An around-chain: ``async def handler(arg, next) -> T``. ``await next()``
    runs the rest of the chain and finally the dispatcher's ``default()``.
    The first-registered listener is outermost. Not calling ``next`` vetoes
    everything downstream. Each level gets its own ``next``: calling it twice
    re-runs the downstream chain (which makes retry wrappers safe; DSH's
    shared-cursor quirk is deliberately not reproduced).
``STREAM_WATERFALL``
    The same around-chain for streams (``llm/stream``): handlers are *sync*
    ``def handler(arg, next) -> AsyncIterator[T]`` (an ``async def`` generator
    qualifies); ``next()`` returns the downstream iterator without starting
    it, so a wrapper can run code before the adapter is even constructed.

Listener lists are snapshotted at dispatch: a listener added during a dispatch
does not join it.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .errors import (
    EventModeConflictError,
    HandlerKindError,
    UndeclaredEventError,
)

if TYPE_CHECKING:
    from .context import Fiber

T = TypeVar("T")
log = logging.getLogger("dsh.bus")


class EventMode(enum.Enum):
    EMIT = "emit"
    PARALLEL = "parallel"
    SERIAL = "serial"
    BAIL = "bail"
    WATERFALL = "waterfall"
    STREAM_WATERFALL = "stream-waterfall"


#: How many positional arguments a listener of each mode receives *besides*
#: the declared payload arguments (waterfalls pass ``next`` last).
_EXTRA_ARGS = {
    EventMode.EMIT: 0,
    EventMode.PARALLEL: 0,
    EventMode.SERIAL: 0,
    EventMode.BAIL: 0,
    EventMode.WATERFALL: 1,
    EventMode.STREAM_WATERFALL: 1,
}


@dataclass(frozen=True, slots=True)
class EventSpec:
    name: str
    mode: EventMode
    #: number of payload arguments a dispatch passes (None: not checked)
    arity: int | None = None
    doc: str = ""


@dataclass(slots=True, eq=False)
class Listener:
    name: str
    fn: Callable[..., Any]
    fiber: Fiber | None
    label: str = field(default="")


#: The events the host core and the built-in services dispatch.
CORE_EVENTS: tuple[EventSpec, ...] = (
    EventSpec("session/event", EventMode.EMIT, 2, "(session, event) after every append"),
    EventSpec("session/created", EventMode.EMIT, 1, "(session) when the store registers one"),
    EventSpec("session/disposed", EventMode.EMIT, 1, "(session) when the store drops one"),
    EventSpec("session/flush", EventMode.PARALLEL, 1, "(session) the durability barrier"),
    EventSpec("llm/stream", EventMode.STREAM_WATERFALL, 1, "(request) -> chunk stream"),
    EventSpec("tools/pre-execute", EventMode.WATERFALL, 1, "(exec) -> PreToolDecision"),
    EventSpec("tools/execute", EventMode.WATERFALL, 1, "(exec) -> tool result"),
    EventSpec("tools/post-execute", EventMode.WATERFALL, 1, "(post) -> PostToolDecision"),
    EventSpec("tools/result", EventMode.EMIT, 1, "(result record) after a call settled"),
    EventSpec("agent/pre-step", EventMode.WATERFALL, 1, "(step context) -> PreStepDecision"),
    EventSpec("agent/request", EventMode.WATERFALL, 1, "(request) -> request"),
    EventSpec("agent/request-error", EventMode.WATERFALL, 1, "(error ctx) -> action"),
    EventSpec("agent/turn-stopping", EventMode.SERIAL, 1, "(turn ctx) -> continue?"),
    EventSpec("agent/turn-start", EventMode.EMIT, 1, "(turn info)"),
    EventSpec("agent/turn-end", EventMode.EMIT, 1, "(turn info)"),
    EventSpec("agent/step-start", EventMode.EMIT, 1, "(step info)"),
    EventSpec("agent/step-end", EventMode.EMIT, 1, "(step info)"),
    EventSpec("approval/request", EventMode.WATERFALL, 1, "(approval request) -> outcome"),
)


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _check_kind(spec: EventSpec, fn: Callable[..., Any]) -> None:
    if not callable(fn):
        raise HandlerKindError(f"listener for {spec.name!r} is not callable: {fn!r}")
    is_async = _is_async_callable(fn)
    is_asyncgen = inspect.isasyncgenfunction(fn)
    mode = spec.mode
    if mode in (EventMode.EMIT, EventMode.BAIL) and (is_async or is_asyncgen):
        raise HandlerKindError(
            f"{spec.name!r} is declared {mode.value}, so listeners must be plain sync "
            f"functions; {_describe(fn)} is async and would never be awaited. "
            "Push async work to a task (ctx.start_soon) or a memory channel instead."
        )
    if mode in (EventMode.PARALLEL, EventMode.SERIAL, EventMode.WATERFALL) and not is_async:
        raise HandlerKindError(
            f"{spec.name!r} is declared {mode.value}, so listeners must be "
            f"`async def` functions; {_describe(fn)} is not."
        )
    if mode is EventMode.STREAM_WATERFALL and is_async:
        raise HandlerKindError(
            f"{spec.name!r} is a stream-waterfall event: a listener is a sync function "
            "(or an async generator function) returning an async iterator; "
            f"{_describe(fn)} is a coroutine function."
        )
    if spec.arity is not None:
        expected = spec.arity + _EXTRA_ARGS[mode]
        try:
            inspect.signature(fn).bind(*([None] * expected))
        except TypeError:
            shape = "(arg, next)" if _EXTRA_ARGS[mode] else f"{expected} positional argument(s)"
            raise HandlerKindError(
                f"listener {_describe(fn)} for {spec.name!r} cannot be called with "
                f"{shape}; {mode.value} listeners of this event take {expected}."
            ) from None
        except ValueError:  # no signature (some builtins): accept
            pass


def _describe(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", "")
    return f"{module}.{name}" if module else name


class EventBus:
    """Listener storage and the six dispatch modes. Owned by the host."""

    def __init__(self) -> None:
        self._specs: dict[str, EventSpec] = {}
        self._listeners: dict[str, list[Listener]] = {}
        for spec in CORE_EVENTS:
            self.declare(spec)

    # -- declaration -----------------------------------------------------
    def declare(self, spec: EventSpec) -> None:
        existing = self._specs.get(spec.name)
        if existing is not None:
            if existing.mode is not spec.mode:
                raise EventModeConflictError(
                    f"event {spec.name!r} is already declared as {existing.mode.value}; "
                    f"it cannot be re-declared as {spec.mode.value}"
                )
            return
        self._specs[spec.name] = spec
        self._listeners.setdefault(spec.name, [])

    def spec(self, name: str) -> EventSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UndeclaredEventError(
                f"event {name!r} is not declared; known events: "
                f"{', '.join(sorted(self._specs))}. A plugin that owns a new event declares it "
                "with ctx.declare_event(name, mode)."
            ) from None

    def specs(self) -> list[EventSpec]:
        return list(self._specs.values())

    # -- registration ----------------------------------------------------
    def add(
        self, name: str, fn: Callable[..., Any], fiber: Fiber | None, *, prepend: bool = False
    ) -> Listener:
        spec = self.spec(name)
        _check_kind(spec, fn)
        listener = Listener(name, fn, fiber, _describe(fn))
        listeners = self._listeners[name]
        if prepend:
            listeners.insert(0, listener)
        else:
            listeners.append(listener)
        return listener

    def remove(self, listener: Listener) -> None:
        try:
            self._listeners[listener.name].remove(listener)
        except (KeyError, ValueError):
            pass

    def listeners(self, name: str) -> list[Listener]:
        """A snapshot of the listeners of ``name`` in dispatch order."""
        self.spec(name)
        return list(self._listeners[name])

    def _snapshot(self, name: str, mode: EventMode) -> list[Listener]:
        spec = self.spec(name)
        if spec.mode is not mode:
            raise EventModeConflictError(
                f"event {name!r} is declared as {spec.mode.value}; "
                f"it cannot be dispatched as {mode.value}"
            )
        return list(self._listeners[name])

    # -- dispatch --------------------------------------------------------
    def emit(self, name: str, *args: Any) -> None:
        for listener in self._snapshot(name, EventMode.EMIT):
            try:
                listener.fn(*args)
            except Exception:
                log.warning(
                    "listener %s of %r raised; the error is contained and later listeners "
                    "still run",
                    listener.label,
                    name,
                    exc_info=True,
                )

    def bail(self, name: str, *args: Any) -> Any:
        for listener in self._snapshot(name, EventMode.BAIL):
            result = listener.fn(*args)
            if result is not None and result is not False:
                return result
        return None

    async def serial(self, name: str, *args: Any) -> Any:
        for listener in self._snapshot(name, EventMode.SERIAL):
            result = await listener.fn(*args)
            if result is not None and result is not False:
                return result
        return None

    async def parallel(self, name: str, *args: Any) -> None:
        listeners = self._snapshot(name, EventMode.PARALLEL)
        if not listeners:
            return
        if len(listeners) == 1:
            await listeners[0].fn(*args)
            return
        failures: list[BaseException | None] = [None] * len(listeners)

        async def run(index: int, listener: Listener) -> None:
            try:
                await listener.fn(*args)
            except Exception as exc:  # captured: siblings must not be cancelled
                failures[index] = exc

        async with anyio.create_task_group() as tg:
            for index, listener in enumerate(listeners):
                tg.start_soon(run, index, listener)
        errors = [(listeners[i], e) for i, e in enumerate(failures) if e is not None]
        if not errors:
            return
        for listener, error in errors[1:]:
            log.warning(
                "listener %s of %r also failed: %r", listener.label, name, error,
            )
        raise errors[0][1]

    async def waterfall(
        self, name: str, arg: Any, default: Callable[[], Awaitable[T]]
    ) -> T:
        listeners = self._snapshot(name, EventMode.WATERFALL)
        return await _run_chain(listeners, 0, arg, default)

    def waterfall_stream(
        self, name: str, arg: Any, default: Callable[[Any], AsyncIterator[T]]
    ) -> AsyncIterator[T]:
        listeners = self._snapshot(name, EventMode.STREAM_WATERFALL)

        def build(index: int) -> AsyncIterator[T]:
            if index == len(listeners):
                return default(arg)
            stream: AsyncIterator[T] = listeners[index].fn(arg, lambda: build(index + 1))
            return stream

        return build(0)


async def _run_chain(
    listeners: list[Listener], index: int, arg: Any, default: Callable[[], Awaitable[T]]
) -> T:
    if index == len(listeners):
        return await default()

    async def next_() -> T:
        return await _run_chain(listeners, index + 1, arg, default)

    result: T = await listeners[index].fn(arg, next_)
    return result
