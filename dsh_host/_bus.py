"""The host-owned async event bus.

An event is declared once, by the layer or plugin that dispatches it, as a
typed *event key* (a module-level constant such as
``dsh_host._tools.TOOLS_EXECUTE``). The key carries the event's name, its
dispatch mode and the types of its payload and result, so ``mypy`` checks a
listener against it::

    ctx.on(TOOLS_EXECUTE, around_execute)   # around_execute's signature is checked

The owner also puts the key on the host's bus (``ctx.declare_event(KEY)``, undone
when the owner is unloaded): that is what lets a plain name (``ctx.on("tools/execute",
fn)``, the spelling a YAML composition or an untyped plugin uses) resolve, and
what ``dsh plugins`` lists. A listener registered by key is checked at once (the key
says everything the bus checks); one registered by a name not declared yet waits,
unchecked and never called, until the owner declares it, and is checked then (a wrong
kind is dropped and logged against its row). Dispatching by an undeclared name is an
error. A listener of the wrong kind is refused rather than misbehaving when it is (or
is not) awaited. Modes (D4 in docs/decisions.md):

``EMIT`` (:class:`Emit`)
    Notification. Listeners are plain sync callables, called in order; each
    listener's exception is contained and logged, so one broken observer never
    starves the next -- and never reaches the code that emitted: this is the
    one place observers are called, so it is where output is kept from steering
    a turn (a transcript printer writing to a closed pipe, a follower that
    failed). ``SystemExit`` is contained too, because printing libraries raise
    it for a closed pipe (rich does); ``KeyboardInterrupt`` and cancellation
    are not failures of the listener and propagate.
``PARALLEL`` (:class:`Parallel`)
    Async listeners all start, all are awaited. If any failed, the failure of
    the first-registered failing listener is raised after every listener
    settled (the others are logged). Siblings are never cancelled: a flush
    listener that is half way through an fsync must finish.
``SERIAL`` (:class:`Serial`)
    Async listeners one at a time, in order, each awaited before the next
    starts; they return nothing (an exception propagates and skips the rest).
``WATERFALL`` (:class:`Waterfall`)
    An around-chain: ``async def handler(arg, next) -> T``. ``await next()``
    runs the rest of the chain and finally the dispatcher's ``default()``.
    The first-registered listener is outermost. Not calling ``next`` vetoes
    everything downstream. Each level gets its own ``next``: calling it twice
    re-runs the downstream chain (which makes retry wrappers safe; DSH's
    shared-cursor quirk is deliberately not reproduced).
``STREAM_WATERFALL`` (:class:`StreamWaterfall`)
    The same around-chain for streams (``llm/stream``): handlers are *sync*
    ``def handler(arg, next) -> AsyncIterator[T]`` (an ``async def`` generator
    qualifies); ``next()`` returns the downstream iterator without starting
    it, so a wrapper can run code before the adapter is even constructed.

Listener lists are snapshotted at dispatch: a listener added during a dispatch
does not join it.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import anyio

from .errors import (
    EventModeConflictError,
    HandlerKindError,
    UndeclaredEventError,
)

if TYPE_CHECKING:
    from ._context import Fiber

T = TypeVar("T")
P = ParamSpec("P")
A = TypeVar("A")
R = TypeVar("R")
L = TypeVar("L")
log = logging.getLogger("dsh.bus")


class EventMode(enum.Enum):
    EMIT = "emit"
    PARALLEL = "parallel"
    SERIAL = "serial"
    WATERFALL = "waterfall"
    STREAM_WATERFALL = "stream-waterfall"


#: How many positional arguments a listener of each mode receives *besides*
#: the declared payload arguments (waterfalls pass ``next`` last).
_EXTRA_ARGS = {
    EventMode.EMIT: 0,
    EventMode.PARALLEL: 0,
    EventMode.SERIAL: 0,
    EventMode.WATERFALL: 1,
    EventMode.STREAM_WATERFALL: 1,
}


class EventSpec:
    """An event's declaration: name, dispatch mode, payload arity, one line of doc.

    Use one of the typed subclasses (:class:`Emit`, :class:`Parallel`,
    :class:`Serial`, :class:`Waterfall`, :class:`StreamWaterfall`) so listeners
    are type-checked; a bare ``EventSpec`` is the untyped form.
    """

    __slots__ = ("arity", "doc", "mode", "name")

    def __init__(self, name: str, mode: EventMode, arity: int | None = None, doc: str = "") -> None:
        self.name = name
        self.mode = mode
        #: number of payload arguments a dispatch passes (None: not checked)
        self.arity = arity
        self.doc = doc

    def _identity(self) -> tuple[str, EventMode, int | None]:
        return (self.name, self.mode, self.arity)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventSpec):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.mode.value}, arity={self.arity})"


class EventKey(EventSpec, Generic[L]):
    """A typed event declaration: ``L`` is the type of the event's listeners.

    ``ctx.on(key, listener)`` has mypy check ``listener`` against ``L``. Write
    keys with the mode classes below, which spell ``L`` from the payload.
    """

    __slots__ = ()


class Emit(EventKey[Callable[P, object]], Generic[P]):
    """Key of an EMIT event; ``Emit[[Session, SessionEvent]]``: listeners ``(session, event)``."""

    __slots__ = ()

    def __init__(self, name: str, arity: int = 1, doc: str = "") -> None:
        super().__init__(name, EventMode.EMIT, arity, doc)


class Parallel(EventKey[Callable[P, Awaitable[None]]], Generic[P]):
    """Key of a PARALLEL event; listeners are ``async def`` taking ``P``."""

    __slots__ = ()

    def __init__(self, name: str, arity: int = 1, doc: str = "") -> None:
        super().__init__(name, EventMode.PARALLEL, arity, doc)


class Serial(EventKey[Callable[P, Awaitable[None]]], Generic[P]):
    """Key of a SERIAL event; listeners are ``async def`` taking ``P``, awaited in turn."""

    __slots__ = ()

    def __init__(self, name: str, arity: int = 1, doc: str = "") -> None:
        super().__init__(name, EventMode.SERIAL, arity, doc)


class Waterfall(EventKey[Callable[[A, Callable[[], Awaitable[R]]], Awaitable[R]]], Generic[A, R]):
    """Key of a WATERFALL event: ``async def listener(arg: A, next: Next[R]) -> R``."""

    __slots__ = ()

    def __init__(self, name: str, doc: str = "") -> None:
        super().__init__(name, EventMode.WATERFALL, 1, doc)


class StreamWaterfall(
    EventKey[Callable[[A, Callable[[], AsyncIterator[R]]], AsyncIterator[R]]], Generic[A, R]
):
    """Key of a STREAM_WATERFALL event: ``def listener(arg: A, next) -> AsyncIterator[R]``."""

    __slots__ = ()

    def __init__(self, name: str, doc: str = "") -> None:
        super().__init__(name, EventMode.STREAM_WATERFALL, 1, doc)


#: What a waterfall listener's ``next`` is: run the rest of the chain.
Next = Callable[[], Awaitable[R]]
#: What a stream-waterfall listener's ``next`` is: the downstream stream, not started.
StreamNext = Callable[[], AsyncIterator[R]]


@dataclass(slots=True, eq=False)
class Listener:
    name: str
    fn: Callable[..., Any]
    fiber: Fiber | None
    label: str = field(default="")
    #: False while registered by a name nobody declared yet: never called until checked
    checked: bool = True


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
    if mode is EventMode.EMIT and (is_async or is_asyncgen):
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


def _check_same_mode(declared: EventSpec, other: EventSpec) -> None:
    if declared.mode is not other.mode:
        raise EventModeConflictError(
            f"event {declared.name!r} is already declared as {declared.mode.value}; "
            f"it cannot be re-declared as {other.mode.value}"
        )


def _describe(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", "")
    return f"{module}.{name}" if module else name


class EventBus:
    """Declarations, listener storage and the five dispatch modes. Owned by the host."""

    def __init__(self) -> None:
        #: declared name -> (spec, how many live declarations hold it)
        self._specs: dict[str, tuple[EventSpec, int]] = {}
        self._listeners: dict[str, list[Listener]] = {}
        #: names with listeners registered before anyone declared them (not yet checked)
        self._unchecked: set[str] = set()

    # -- declaration -----------------------------------------------------
    def declare(self, spec: EventSpec) -> Callable[[], None]:
        """Declare ``spec``; returns the disposer that withdraws this declaration.

        Declaring an already declared event again (a second row of the same
        plugin) is counted, and the name stays declared until every declaration
        is withdrawn. Declaring it with another mode is an error.
        """
        existing = self._specs.get(spec.name)
        if existing is not None:
            _check_same_mode(existing[0], spec)
            self._specs[spec.name] = (existing[0], existing[1] + 1)
        else:
            self._specs[spec.name] = (spec, 1)
            self._check_waiting(spec)
        self._listeners.setdefault(spec.name, [])
        withdrawn = False

        def undeclare() -> None:
            nonlocal withdrawn
            if withdrawn:
                return
            withdrawn = True
            held = self._specs.get(spec.name)
            if held is None:
                return
            if held[1] <= 1:
                del self._specs[spec.name]
            else:
                self._specs[spec.name] = (held[0], held[1] - 1)

        return undeclare

    def _check_waiting(self, spec: EventSpec) -> None:
        """Check the listeners registered by name before ``spec`` was declared.

        One of the wrong kind is dropped and logged against its plugin row: the
        declaring owner is not at fault.
        """
        if spec.name not in self._unchecked:
            return  # the common case, on every dispatch: nothing waits
        self._unchecked.discard(spec.name)
        for listener in list(self._listeners.get(spec.name, ())):
            if listener.checked:
                continue
            try:
                _check_kind(spec, listener.fn)
            except HandlerKindError as exc:
                self.remove(listener)
                row = listener.fiber.id if listener.fiber is not None else "root"
                log.error("dropped a listener of plugin row %r: %s", row, exc)
            else:
                listener.checked = True

    def is_declared(self, name: str) -> bool:
        return name in self._specs

    def spec(self, event: EventSpec | str) -> EventSpec:
        """The spec of ``event``: a key is its own spec (checked against a declaration).

        Raises :class:`UndeclaredEventError` for a name nobody declared.
        """
        spec = self._resolve(event, strict=True)
        assert spec is not None
        return spec

    def _resolve(self, event: EventSpec | str, *, strict: bool) -> EventSpec | None:
        if isinstance(event, EventSpec):
            held = self._specs.get(event.name)
            if held is not None:
                _check_same_mode(held[0], event)
            return event
        try:
            return self._specs[event][0]
        except KeyError:
            if not strict:
                return None
            raise UndeclaredEventError(
                f"event {event!r} is not declared (declared events: "
                f"{', '.join(sorted(self._specs)) or 'none'}); use the event's typed key "
                "(e.g. dsh_host._tools.TOOLS_EXECUTE), which needs no declaration, or mount the "
                "plugin that declares it; a plugin that owns a new event declares it with "
                "ctx.declare_event(KEY)."
            ) from None

    def specs(self) -> list[EventSpec]:
        return [spec for spec, _ in self._specs.values()]

    # -- registration ----------------------------------------------------
    def add(
        self,
        event: EventSpec | str,
        fn: Callable[..., Any],
        fiber: Fiber | None,
        *,
        prepend: bool = False,
    ) -> Listener:
        """Add a listener; by name, the name need not be declared yet.

        A listener registered by key, or by the name of a declared event, is
        checked now. One registered by a name not declared yet (its owner's row
        comes later in the composition, or is not mounted) waits, unchecked and
        never called, until the name is declared, and is checked then.
        """
        spec = self._resolve(event, strict=False)
        name = event if isinstance(event, str) else event.name
        if spec is not None:
            _check_kind(spec, fn)
            self._check_waiting(spec)
        elif not callable(fn):
            raise HandlerKindError(f"listener for {name!r} is not callable: {fn!r}")
        listener = Listener(name, fn, fiber, _describe(fn), checked=spec is not None)
        if spec is None:
            self._unchecked.add(name)
        listeners = self._listeners.setdefault(name, [])
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

    def listeners(self, event: EventSpec | str) -> list[Listener]:
        """A snapshot of the listeners of ``event`` in dispatch order (waiting ones too)."""
        spec = self._resolve(event, strict=False)
        name = event if isinstance(event, str) else event.name
        assert spec is None or spec.name == name
        return list(self._listeners.get(name, ()))

    def has_listeners(self, event: EventSpec | str) -> bool:
        """Whether ``event`` has a listener now (one waiting for its declaration included):
        a caller that emits per stream chunk skips building the payload nobody would receive
        (docs/decisions.md D49). O(1): one dictionary look-up, no copy."""
        return bool(self._listeners.get(event if isinstance(event, str) else event.name))

    def listener_count(self, event: EventSpec | str) -> int:
        """How many listeners ``event`` has now (waiting ones too), as ``len(listeners(event))``
        without the copy: what the session store asks at every barrier (docs/decisions.md D50).
        """
        return len(self._listeners.get(event if isinstance(event, str) else event.name, ()))

    def _snapshot(self, event: EventSpec | str, mode: EventMode) -> list[Listener]:
        # What ``spec`` resolves, looked up once here: a declared name is its spec; a key is
        # its own spec, refused only when declared with another mode (no call for either on a
        # dispatch that is allowed, docs/decisions.md D50).
        if type(event) is str:
            held = self._specs.get(event)
            spec = held[0] if held is not None else self.spec(event)  # raises: undeclared
        elif isinstance(event, EventSpec):
            spec = event
            held = self._specs.get(event.name)
            if held is not None and held[0].mode is not event.mode:
                _check_same_mode(held[0], event)  # raises
        else:
            spec = self.spec(event)
        if spec.mode is not mode:
            raise EventModeConflictError(
                f"event {spec.name!r} is declared as {spec.mode.value}; "
                f"it cannot be dispatched as {mode.value}"
            )
        if spec.name in self._unchecked:
            self._check_waiting(spec)  # a key dispatches before its owner declared it
        return list(self._listeners.get(spec.name, ()))

    # -- dispatch --------------------------------------------------------
    def emit(self, event: EventSpec | str, *args: Any) -> None:
        for listener in self._snapshot(event, EventMode.EMIT):
            try:
                listener.fn(*args)
            except (Exception, SystemExit):
                log.warning(
                    "listener %s of %r raised; the error is contained and later listeners "
                    "still run",
                    listener.label,
                    listener.name,
                    exc_info=True,
                )

    async def serial(self, event: EventSpec | str, *args: Any) -> None:
        for listener in self._snapshot(event, EventMode.SERIAL):
            await listener.fn(*args)

    def parallel(self, event: EventSpec | str, *args: Any) -> Coroutine[Any, Any, None]:
        """The dispatch of a PARALLEL event, to be awaited. A lone listener's own coroutine is
        the dispatch (its result or failure is the caller's, as when awaited here): no frame
        that only awaits it on the way down (a session's barrier, docs/decisions.md D50)."""
        listeners = self._snapshot(event, EventMode.PARALLEL)
        if len(listeners) == 1:
            lone: Coroutine[Any, Any, None] = listeners[0].fn(*args)
            return lone
        return self._parallel_all(listeners, args)

    async def _parallel_all(self, listeners: list[Listener], args: tuple[Any, ...]) -> None:
        if not listeners:
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
                "listener %s of %r also failed: %r", listener.label, listener.name, error,
            )
        raise errors[0][1]

    async def waterfall(
        self, event: EventSpec | str, arg: Any, default: Callable[[], Awaitable[T]]
    ) -> T:
        listeners = self._snapshot(event, EventMode.WATERFALL)
        if not listeners:
            return await default()
        result: T = await listeners[0].fn(arg, _next_of(listeners, 1, arg, default))
        return result

    def waterfall_stream(
        self, event: EventSpec | str, arg: Any, default: Callable[[Any], AsyncIterator[T]]
    ) -> AsyncIterator[T]:
        listeners = self._snapshot(event, EventMode.STREAM_WATERFALL)

        def build(index: int) -> AsyncIterator[T]:
            if index == len(listeners):
                return default(arg)
            stream: AsyncIterator[T] = listeners[index].fn(arg, lambda: build(index + 1))
            return stream

        return build(0)


def _next_of(
    listeners: list[Listener], index: int, arg: Any, default: Callable[[], Awaitable[T]]
) -> Callable[[], Awaitable[T]]:
    """The ``next`` handed to ``listeners[index - 1]``: the rest of the chain, or the
    dispatcher's ``default`` itself below the last listener. Each call starts the rest
    afresh; calling it makes the coroutine of the next level directly, with no frame of its
    own that only awaits it (docs/decisions.md D50)."""
    if index == len(listeners):
        return default
    return functools.partial(_run_chain, listeners, index, arg, default)


async def _run_chain(
    listeners: list[Listener], index: int, arg: Any, default: Callable[[], Awaitable[T]]
) -> T:
    result: T = await listeners[index].fn(arg, _next_of(listeners, index + 1, arg, default))
    return result
