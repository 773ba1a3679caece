"""Contexts, fibers and services: the Cordis-style core of the host.

A :class:`Host` owns one :class:`~dsh_host._bus.EventBus`, one service table
and one anyio task group. Each mounted YAML row becomes a :class:`Fiber` (one
runtime instance of a plugin) with its own :class:`Context`. Everything a
plugin registers through its context -- listeners, services, cleanup
callbacks, background tasks -- is an *effect* owned by its fiber, and is
undone in reverse order when the fiber is disposed. That is what makes
unloading a plugin safe: nothing it registered can outlive it.

A fiber whose injected services are not all live waits (``pending``) and is
applied as soon as they are; when a service it injects goes away it is
disposed and waits again.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

import anyio
import anyio.abc

from ._bus import (
    Emit,
    EventBus,
    EventKey,
    EventMode,
    EventSpec,
    Next,
    Parallel,
    Serial,
    StreamNext,
    StreamWaterfall,
    Waterfall,
)
from .errors import (
    DshError,
    InactiveContextError,
    ServiceConflictError,
    ServiceUnavailableError,
)

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")
L = TypeVar("L")
P = ParamSpec("P")
Disposer = Callable[[], Any]
log = logging.getLogger("dsh.host")


class ServiceKey(Generic[T]):
    """The typed name of a service: ``ctx.service(TOOLS)`` is a ``ToolRuntime`` to mypy.

    Each layer defines the keys of the services it implements beside them
    (``dsh_host._tools.TOOLS``, ``dsh_host._session.SESSIONS``...). The key's
    ``name`` is the service's name in YAML ``inject``/``provides`` and in
    ``ctx.<name>`` attribute access, which keeps working (untyped).
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


def _service_name(key: ServiceKey[Any] | str) -> str:
    return key.name if isinstance(key, ServiceKey) else key


class FiberState(enum.Enum):
    PENDING = "pending"
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    UNLOADING = "unloading"
    DISPOSED = "disposed"
    DISABLED = "disabled"


class _Effect:
    """One registration of a fiber; calling it twice is a no-op."""

    __slots__ = ("_done", "_fn", "label")

    def __init__(self, fn: Disposer, label: str) -> None:
        self._fn = fn
        self._done = False
        self.label = label

    def __call__(self) -> Any:
        if self._done:
            return None
        self._done = True
        return self._fn()


class Fiber:
    """One runtime instance of a plugin (one YAML row)."""

    def __init__(
        self,
        host: Host,
        row_id: str,
        plugin_name: str,
        instance: Any,
        config: Any,
        inject: tuple[str, ...],
        provides: tuple[str, ...],
        entry_point: str = "",
    ) -> None:
        self.host = host
        self.id = row_id
        self.plugin_name = plugin_name
        self.instance = instance
        self.config = config
        self.inject = inject
        self.provides = provides
        self.entry_point = entry_point
        self.state = FiberState.PENDING
        self.error: BaseException | None = None
        self.effects: list[_Effect] = []
        self.scopes: set[anyio.CancelScope] = set()
        self.hooks: list[str] = []
        self.ctx = Context(host, self)

    @property
    def missing(self) -> list[str]:
        return [name for name in self.inject if not self.host.service_live(name)]

    def describe_state(self) -> str:
        if self.state is FiberState.PENDING:
            missing = self.missing
            noun = "service" if len(missing) == 1 else "services"
            return f"waiting for {noun}: {', '.join(missing)}" if missing else "pending"
        if self.state is FiberState.FAILED:
            return f"failed: {self.error}"
        return str(self.state.value)

    def add_effect(self, fn: Disposer, label: str) -> _Effect:
        if self.state not in (FiberState.LOADING, FiberState.ACTIVE):
            raise InactiveContextError(
                f"cannot create effect on inactive context (plugin row {self.id!r} is "
                f"{self.state.value}); register listeners and services inside apply()"
            )
        effect = _Effect(fn, label)
        self.effects.append(effect)
        return effect

    async def run_disposers(self) -> None:
        effects, self.effects = self.effects, []
        for effect in reversed(effects):
            try:
                result = effect()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.warning(
                    "disposer %s of plugin row %r failed; continuing teardown",
                    effect.label,
                    self.id,
                    exc_info=True,
                )
        for scope in list(self.scopes):
            scope.cancel()
        self.scopes.clear()
        self.hooks.clear()


class Context:
    """What a plugin sees of the host: services, events and its own lifetime.

    Services, typed: ``ctx.service(SESSIONS)`` (raises
    :class:`ServiceUnavailableError` when not live) or ``ctx.get(AGENT)``
    (``None`` when not live; use it for optional dependencies and re-read it at
    use time). The same by name, untyped: ``ctx.sessions``,
    ``ctx.service("sessions")``, ``ctx.get("approval")``.

    Events, typed: ``ctx.on(TOOLS_EXECUTE, around)`` (mypy checks ``around``
    against the key); by name, untyped: ``ctx.on("tools/execute", around)``
    (checked once the event's owner has declared it; see :mod:`dsh_host._bus`).
    """

    def __init__(self, host: Host, fiber: Fiber | None) -> None:
        self._host = host
        self._fiber = fiber

    # -- services ---------------------------------------------------------
    def row_configs(self, *plugin_names: str) -> list[Any]:
        """The validated configs of this host's rows of ``plugin_names``, in mount order.

        Only rows mounted so far are listed (rows mount in composition order). A plugin
        that must not be wider than another row reads that row's config here (D24).
        """
        return [
            fiber.config
            for fiber in self._host.fibers
            if fiber.plugin_name in plugin_names and fiber.config is not None
        ]

    @overload
    def provide(self, key: ServiceKey[T], value: T) -> Disposer: ...
    @overload
    def provide(self, key: str, value: Any) -> Disposer: ...
    def provide(self, key: ServiceKey[Any] | str, value: Any) -> Disposer:
        name = _service_name(key)
        fiber = self._require_fiber("provide a service")
        if fiber.provides and name not in fiber.provides:
            raise ServiceConflictError(
                f"plugin row {fiber.id!r} ({fiber.plugin_name}) provides {name!r} but does not "
                f"declare it; add it to the plugin's `provides` ({', '.join(fiber.provides)})"
            )
        self._host._register_service(name, value, fiber)
        return fiber.add_effect(
            lambda: self._host._unregister_service(name, fiber), f"provide {name}"
        )

    @overload
    def service(self, key: ServiceKey[T]) -> T: ...
    @overload
    def service(self, key: str) -> Any: ...
    def service(self, key: ServiceKey[Any] | str) -> Any:
        """The live service ``key``; raises :class:`ServiceUnavailableError` otherwise."""
        return self._host.service(_service_name(key))

    @overload
    def get(self, key: ServiceKey[T]) -> T | None: ...
    @overload
    def get(self, key: str) -> Any: ...
    def get(self, key: ServiceKey[Any] | str) -> Any:
        """The live service ``key``, or None."""
        return self._host.get_service(_service_name(key))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._host.service(name)

    # -- events -----------------------------------------------------------
    def declare_event(
        self, event: EventSpec | str, mode: EventMode | None = None, arity: int | None = None
    ) -> Disposer:
        """Declare an event this plugin dispatches; withdrawn when the plugin is disposed.

        Pass the event's key (``ctx.declare_event(MY_EVENT)``); the untyped
        ``(name, mode, arity)`` form declares a bare :class:`EventSpec`.
        """
        if isinstance(event, str):
            if mode is None:
                raise TypeError(f"declare_event({event!r}) needs a mode (or pass an event key)")
            event = EventSpec(event, mode, arity)
        fiber = self._require_fiber("declare an event")
        undeclare = self._host.bus.declare(event)
        return fiber.add_effect(undeclare, f"declare {event.name}")

    # Waterfalls are matched by their payload and result types (mypy then names the
    # mismatch); the ParamSpec-typed keys by their listener type as a whole, which mypy
    # checks strictly (solving P from the listener would accept a missing argument).
    @overload
    def on(
        self,
        event: Waterfall[A, R],
        handler: Callable[[A, Next[R]], Awaitable[R]],
        *,
        prepend: bool = False,
    ) -> Disposer: ...
    @overload
    def on(
        self,
        event: StreamWaterfall[A, R],
        handler: Callable[[A, StreamNext[R]], AsyncIterator[R]],
        *,
        prepend: bool = False,
    ) -> Disposer: ...
    @overload
    def on(self, event: EventKey[L], handler: L, *, prepend: bool = False) -> Disposer: ...
    @overload
    def on(
        self, event: str, handler: Callable[..., Any], *, prepend: bool = False
    ) -> Disposer: ...
    def on(self, event: EventSpec | str, handler: Any, *, prepend: bool = False) -> Disposer:
        """Listen to ``event``; the listener is removed when this plugin is disposed."""
        fiber = self._fiber
        if fiber is not None and fiber.state not in (FiberState.LOADING, FiberState.ACTIVE):
            raise InactiveContextError(
                f"cannot create effect on inactive context (plugin row {fiber.id!r})"
            )
        listener = self._host.bus.add(event, handler, fiber, prepend=prepend)
        if fiber is None:
            return lambda: self._host.bus.remove(listener)
        fiber.hooks.append(listener.name)
        return fiber.add_effect(lambda: self._host.bus.remove(listener), f"on {listener.name}")

    @overload
    def emit(self, event: Emit[P], *args: P.args, **kwargs: P.kwargs) -> None: ...
    @overload
    def emit(self, event: str, *args: Any) -> None: ...
    def emit(self, event: EventSpec | str, *args: Any, **kwargs: Any) -> None:
        if kwargs:  # the refusal only: no call per dispatch (docs/decisions.md D50)
            _no_keywords(event, kwargs)
        self._host.bus.emit(event, *args)

    # serial, parallel and waterfall hand back the bus's own coroutine rather than awaiting it
    # in one of their own: a frame that only passes the result through, at every dispatch of a
    # step (docs/decisions.md D50). Awaiting the result is the dispatch, as before.
    @overload
    def serial(
        self, event: Serial[P], *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, None]: ...
    @overload
    def serial(self, event: str, *args: Any) -> Coroutine[Any, Any, None]: ...
    def serial(
        self, event: EventSpec | str, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, None]:
        if kwargs:  # the refusal only: no call per dispatch (docs/decisions.md D50)
            _no_keywords(event, kwargs)
        return self._host.bus.serial(event, *args)

    @overload
    def parallel(
        self, event: Parallel[P], *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, None]: ...
    @overload
    def parallel(self, event: str, *args: Any) -> Coroutine[Any, Any, None]: ...
    def parallel(
        self, event: EventSpec | str, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, None]:
        if kwargs:  # the refusal only: no call per dispatch (docs/decisions.md D50)
            _no_keywords(event, kwargs)
        return self._host.bus.parallel(event, *args)

    @overload
    def waterfall(
        self, event: Waterfall[A, R], arg: A, default: Callable[[], Awaitable[R]]
    ) -> Coroutine[Any, Any, R]: ...
    @overload
    def waterfall(
        self, event: str, arg: Any, default: Callable[[], Awaitable[T]]
    ) -> Coroutine[Any, Any, T]: ...
    def waterfall(
        self, event: EventSpec | str, arg: Any, default: Callable[[], Awaitable[Any]]
    ) -> Coroutine[Any, Any, Any]:
        return self._host.bus.waterfall(event, arg, default)

    @overload
    def waterfall_stream(
        self, event: StreamWaterfall[A, R], arg: A, default: Callable[[A], AsyncIterator[R]]
    ) -> AsyncIterator[R]: ...
    @overload
    def waterfall_stream(
        self, event: str, arg: Any, default: Callable[[Any], AsyncIterator[T]]
    ) -> AsyncIterator[T]: ...
    def waterfall_stream(
        self, event: EventSpec | str, arg: Any, default: Callable[[Any], AsyncIterator[Any]]
    ) -> AsyncIterator[Any]:
        return self._host.bus.waterfall_stream(event, arg, default)

    # -- lifetime ---------------------------------------------------------
    def effect(self, disposer: Disposer, label: str = "effect") -> Disposer:
        """Run ``disposer`` (sync or async) when this plugin is disposed."""
        fiber = self._require_fiber("register an effect")
        return fiber.add_effect(disposer, label)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str = "") -> None:
        """Run ``fn(*args)`` in the host's task group.

        The task is cancelled after this plugin's disposers ran, so a writer
        task can still be drained by an (async) disposer first.
        """
        fiber = self._fiber
        if fiber is not None and fiber.state not in (FiberState.LOADING, FiberState.ACTIVE):
            raise InactiveContextError(
                f"cannot create effect on inactive context (plugin row {fiber.id!r})"
            )

        async def runner() -> None:
            with anyio.CancelScope() as scope:
                if fiber is not None:
                    fiber.scopes.add(scope)
                try:
                    await fn(*args)
                except DshError as exc:
                    # A user-facing condition (a database that cannot be reached, say): its
                    # message names it and says what to do; a traceback would bury it.
                    log.error("background task %s of %s failed: %s", name or fn,
                              fiber and fiber.id, exc)
                except Exception:
                    log.exception("background task %s of %s failed", name or fn, fiber and fiber.id)
                finally:
                    if fiber is not None:
                        fiber.scopes.discard(scope)

        self._host.task_group.start_soon(runner, name=name or None)

    @property
    def host(self) -> Host:
        return self._host

    @property
    def row_id(self) -> str | None:
        return self._fiber.id if self._fiber is not None else None

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(f"dsh.{self._fiber.id}" if self._fiber else "dsh.root")

    def _require_fiber(self, what: str) -> Fiber:
        fiber = self._fiber
        if fiber is None:
            # The root context owns its registrations itself; give it a root fiber.
            fiber = self._host.root_fiber
        if fiber.state not in (FiberState.LOADING, FiberState.ACTIVE):
            raise InactiveContextError(
                f"cannot create effect on inactive context (cannot {what} from plugin row "
                f"{fiber.id!r}, which is {fiber.state.value})"
            )
        return fiber


def _no_keywords(event: EventSpec | str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        name = event.name if isinstance(event, EventSpec) else event
        raise TypeError(f"event {name!r} is dispatched with positional arguments only")


class Host:
    """The plugin host: event bus, services, fibers, and the task group they run in."""

    def __init__(self, task_group: anyio.abc.TaskGroup) -> None:
        self.bus = EventBus()
        self.task_group = task_group
        self.fibers: list[Fiber] = []
        self._services: dict[str, tuple[Any, Fiber]] = {}
        self.root_fiber = Fiber(self, "root", "root", None, None, (), ())
        self.root_fiber.state = FiberState.ACTIVE
        self.ctx = Context(self, None)
        self._activation_order: list[Fiber] = []

    # -- services ---------------------------------------------------------
    def service_live(self, name: str) -> bool:
        entry = self._services.get(name)
        return entry is not None and entry[1].state in (FiberState.ACTIVE, FiberState.LOADING)

    def get_service(self, name: str) -> Any:
        entry = self._services.get(name)
        if entry is None or entry[1].state not in (FiberState.ACTIVE, FiberState.LOADING):
            return None
        return entry[0]

    def service(self, name: str) -> Any:
        entry = self._services.get(name)
        if entry is None:
            live = ", ".join(sorted(self._services)) or "none"
            raise ServiceUnavailableError(
                f"service {name!r} is not provided by any active plugin (live services: {live}); "
                "add a row that provides it to the YAML composition"
            )
        value, fiber = entry
        if fiber.state not in (FiberState.ACTIVE, FiberState.LOADING):
            raise ServiceUnavailableError(
                f"cannot get required service {name!r} in inactive context "
                f"(its provider, row {fiber.id!r}, is {fiber.state.value})"
            )
        return value

    def services(self) -> dict[str, str]:
        """Live service name -> providing row id."""
        return {name: fiber.id for name, (_, fiber) in self._services.items()}

    def _register_service(self, name: str, value: Any, fiber: Fiber) -> None:
        existing = self._services.get(name)
        if existing is not None and existing[1] is not fiber:
            raise ServiceConflictError(
                f'service "{name}" has been registered at {existing[1].id}; '
                f"row {fiber.id!r} cannot provide it too (disable one of the two rows)"
            )
        self._services[name] = (value, fiber)

    def _unregister_service(self, name: str, fiber: Fiber) -> None:
        entry = self._services.get(name)
        if entry is not None and entry[1] is fiber:
            del self._services[name]

    # -- fibers -----------------------------------------------------------
    def add_fiber(self, fiber: Fiber) -> None:
        self.fibers.append(fiber)

    async def settle(self) -> None:
        """Apply every pending fiber whose injects are live, in row order, until stable."""
        progressed = True
        while progressed:
            progressed = False
            for fiber in self.fibers:
                if fiber.state is FiberState.PENDING and not fiber.missing:
                    await self._activate(fiber)
                    progressed = True
                    break

    async def _activate(self, fiber: Fiber) -> None:
        fiber.state = FiberState.LOADING
        fiber.error = None
        try:
            self._call_apply(fiber)
        except Exception as exc:
            fiber.state = FiberState.FAILED
            fiber.error = exc
            log.error("plugin row %r (%s) failed to apply: %s", fiber.id, fiber.plugin_name, exc)
            await fiber.run_disposers()
            await self._drop_dependents()
            return
        fiber.state = FiberState.ACTIVE
        self._activation_order.append(fiber)
        log.info(
            "row %r (%s) active; provides: %s; hooks: %s", fiber.id, fiber.plugin_name,
            ", ".join(fiber.provides) or "-", ", ".join(sorted(set(fiber.hooks))) or "-",
        )

    def _call_apply(self, fiber: Fiber) -> None:
        apply_fn = getattr(fiber.instance, "dsh_apply", None)
        if apply_fn is None:
            raise TypeError(f"plugin {fiber.plugin_name!r} has no dsh_apply hook")
        result = apply_fn(ctx=fiber.ctx, config=fiber.config)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise TypeError(
                f"apply() of plugin {fiber.plugin_name!r} is async; apply must be synchronous "
                "(start async work with ctx.start_soon)"
            )

    async def dispose_fiber(self, fiber: Fiber, *, next_state: FiberState) -> None:
        """Dispose ``fiber``; plugins that inject one of its services go first.

        Dependents are torn down *before* the provider so that their own
        disposers (a final flush, say) can still use the service.
        """
        if fiber.state in (FiberState.ACTIVE, FiberState.LOADING):
            provided = {name for name, (_, owner) in self._services.items() if owner is fiber}
            for dependent in reversed(list(self._activation_order)):
                if dependent is not fiber and provided.intersection(dependent.inject):
                    await self.dispose_fiber(dependent, next_state=FiberState.PENDING)
            fiber.state = FiberState.UNLOADING
            await fiber.run_disposers()
            if fiber in self._activation_order:
                self._activation_order.remove(fiber)
        fiber.state = next_state
        await self._drop_dependents()

    async def _drop_dependents(self) -> None:
        """Dispose active fibers whose injected services went away; they wait again."""
        changed = True
        while changed:
            changed = False
            for fiber in reversed(self._activation_order):
                if fiber.state is FiberState.ACTIVE and fiber.missing:
                    await self.dispose_fiber(fiber, next_state=FiberState.PENDING)
                    changed = True
                    break

    async def unload(self, row_id: str) -> None:
        """Dispose one row (its dependents go back to waiting)."""
        for fiber in self.fibers:
            if fiber.id == row_id:
                await self.dispose_fiber(fiber, next_state=FiberState.DISPOSED)
                await self.settle()
                return
        raise KeyError(row_id)

    async def close(self) -> None:
        """Dispose every active fiber in reverse activation order, then the root's effects."""
        with anyio.CancelScope(shield=True):
            while self._activation_order:
                fiber = self._activation_order.pop()
                if fiber.state is FiberState.ACTIVE:
                    fiber.state = FiberState.UNLOADING
                    await fiber.run_disposers()
                    fiber.state = FiberState.DISPOSED
            self.root_fiber.state = FiberState.UNLOADING
            await self.root_fiber.run_disposers()
            self.root_fiber.state = FiberState.DISPOSED

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "id": fiber.id,
                "name": fiber.plugin_name,
                "entryPoint": fiber.entry_point,
                "provides": list(fiber.provides),
                "injects": list(fiber.inject),
                "hooks": sorted(set(fiber.hooks)),
                "state": fiber.state.value,
                "detail": fiber.describe_state(),
            }
            for fiber in self.fibers
        ]

    def active(self) -> Sequence[Fiber]:
        return [f for f in self.fibers if f.state is FiberState.ACTIVE]
