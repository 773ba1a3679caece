"""Binding live sessions to a persistence backend's write handles.

A persistence plugin persists the sessions of ``ctx.sessions`` by listening to
the store's events (:func:`bind_live_sessions` wires them):

* ``session/created`` binds the session to a write handle — the one a resumer
  already opened for it in this backend (``open(id, "write")``), else a fresh
  ``create``; for a session already stored but not open here, an
  ``open(id, "write")`` whose stored events the live session must reproduce
  (else: an id collision);
* ``session/event`` routes each committed event into that handle's buffer (the
  first buffered event arms the 200 ms window);
* ``session/flush`` drains the handle and returns once the events are durable;
* ``session/disposed`` drains the handle and releases ownership;
* plugin disposal drains every bound session, then closes the backend.

Binding needs I/O (is the id stored? take the lock), so it runs as a
background task; events committed before it finishes are picked up from the
session's own log when it does. A background task only starts when the host
next yields, and one that has not started by shutdown is cancelled: so the
binding is *run once, by whoever needs it first* — the background task, a
flush, the release, or plugin disposal — shielded from cancellation, and
everyone else waits for it. Release and disposal therefore always see the
handle, and a session detached just before the host exits is still written.
A binding failure — or a lost lock — is raised by the session's next flush
(fail closed: the checkpoint policy then stops the turn before the next side
effect); it never fails the append that triggered it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

from dsh_host._context import Context
from dsh_host._persistence.backend import PersistenceService
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._persistence.persistence import SessionAlreadyExistsError
from dsh_host._persistence.storage import SessionStorage
from dsh_host._persistence.write_behind import Once, Spawn, WriteHandle
from dsh_host._session.events import SessionEvent
from dsh_host._session.keys import SESSIONS
from dsh_host._session.packed import PackedLog
from dsh_host._session.session import Session

__all__ = ["LiveBinder", "bind_live_sessions", "host_spawn", "wire_storage"]

L = TypeVar("L")
S = TypeVar("S", bound=PersistenceService[Any])


def host_spawn(ctx: Context, label: str) -> Spawn:
    """Background tasks (write windows) as named host tasks, cancelled after the plugin's drain."""

    def spawn(fn: Callable[[], Awaitable[Any]]) -> None:
        ctx.start_soon(fn, name=label)

    return spawn


class _Binding:
    """One live session and the write handle that persists it."""

    __slots__ = ("bind_once", "error", "handle", "release_once", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.handle: WriteHandle[Any] | None = None
        self.error: BaseException | None = None
        self.bind_once = Once()
        self.release_once = Once()


class LiveBinder:
    """Keeps live sessions bound to write handles (see the module docstring)."""

    def __init__(self, ctx: Context, backend: PersistenceService[Any]) -> None:
        self._ctx = ctx
        self._backend = backend
        self._bindings: dict[str, _Binding] = {}
        #: Detached sessions whose release has not finished (disposal waits for them).
        self._releasing: set[_Binding] = set()

    # -- listeners

    def on_created(self, session: Session) -> None:
        binding = _Binding(session)
        self._bindings[session.id] = binding
        self._ctx.start_soon(self._bind, binding, name=f"bind session {session.id}")

    def on_event(self, session: Session, event: SessionEvent) -> None:
        binding = self._bindings.get(session.id)
        if binding is None or binding.session is not session or binding.error is not None:
            return
        if binding.handle is None:
            return  # the binder admits the session's log suffix when it finishes
        try:
            binding.handle.admit_live(event)
        except Exception as error:  # surfaced by the next flush; never fails the append
            binding.error = error
            raise

    async def on_flush(self, session: Session) -> None:
        binding = self._bindings.get(session.id)
        if binding is None or binding.session is not session:
            return
        if not binding.bind_once.done:  # every flush but the first finds it bound
            await self._bind(binding)
        if binding.error is not None:
            raise binding.error
        assert binding.handle is not None
        await binding.handle.flush()

    def on_disposed(self, session: Session) -> None:
        binding = self._bindings.get(session.id)
        if binding is None or binding.session is not session:
            return
        del self._bindings[session.id]
        if binding.handle is not None:
            binding.handle.detach()
        self._releasing.add(binding)
        self._ctx.start_soon(self._release, binding, name=f"release session {session.id}")

    # -- work

    async def _bind(self, binding: _Binding) -> None:
        """Bind once (whoever comes first runs it, shielded); everyone returns when it is done."""

        async def bind() -> None:
            session = binding.session
            try:
                handle = await self._handle_for(session)
                handle.bind(session)
                binding.handle = handle
                events = session.events
                if len(events) > handle.next_seq:
                    handle.append(list(events[handle.next_seq :]))
            except Exception as error:
                binding.error = error
                self._ctx.logger.warning(
                    '%s: cannot persist session "%s": %s', self._backend.name, session.id, error
                )

        await binding.bind_once.run(bind)

    async def _handle_for(self, session: Session) -> WriteHandle[Any]:
        backend = self._backend
        handle = backend.owner(session.id)
        if handle is not None:
            _require_prefix(handle, session, adopted=True, where=None)
            return handle
        try:
            return await backend.create(session.header)
        except SessionAlreadyExistsError:
            # Stored but not open here (a restart, another worker): adopt it only if the
            # live session reproduces the stored events.
            handle = await backend.open(session.id, "write")
            try:
                where = backend.locate(session.header).path
                _require_prefix(handle, session, adopted=False, where=where)
            except BaseException:
                await handle.abandon()
                raise
            return handle

    async def _release(self, binding: _Binding) -> None:
        """Drain and release once; a second caller (disposal) waits for the first."""

        async def release() -> None:
            try:
                await self._bind(binding)
                if binding.handle is not None:
                    binding.handle.detach()
                    await binding.handle.close()
            except Exception as error:
                self._ctx.logger.error(
                    '%s: final write of session "%s" failed: %s',
                    self._backend.name,
                    binding.session.id,
                    error,
                )
            finally:
                self._releasing.discard(binding)

        await binding.release_once.run(release)

    async def close(self) -> None:
        """Plugin disposal: drain every bound and every detached session, then the backend."""
        with anyio.CancelScope(shield=True):
            while self._bindings or self._releasing:
                bindings = [*self._releasing, *self._bindings.values()]
                self._bindings.clear()
                for binding in bindings:
                    await self._release(binding)
            with contextlib.suppress(Exception):
                await self._backend.aclose()


def _require_prefix(
    handle: WriteHandle[Any], session: Session, *, adopted: bool, where: str | None
) -> None:
    """The live session must reproduce what the handle already holds (else: id collision)."""
    if handle.bound is not None and handle.bound is not session:
        raise SessionAlreadyExistsError(
            f'session "{session.id}" is already bound to a different live session in this '
            "backend (id collision)"
        )
    stored = handle.accepted_events()
    live = session.events
    backing = live.lineage
    if isinstance(stored, PackedLog) and isinstance(backing, PackedLog):
        # A resumed session's log was copied from the handle's: shared pages are not decoded
        # to be compared (docs/decisions.md D37).
        same = len(live) >= len(stored) and backing.starts_with(stored)
    else:
        same = len(live) >= len(stored) and all(
            live[i] == stored[i] for i in range(len(stored))
        )
    if not same:
        if adopted:
            what = "is already persisted with"
        else:
            what = f"already has a persisted log ({where}) with"
        raise SessionAlreadyExistsError(
            f'session "{session.id}" {what} {len(stored)} event(s) that do not match this live '
            "session (id collision); resume it instead of creating a new session with its id"
        )


def bind_live_sessions(ctx: Context, backend: PersistenceService[Any]) -> LiveBinder:
    """Persist ``ctx.sessions`` through ``backend``: wire the listeners, drain at disposal.

    Call it in ``apply`` after ``ctx.provide``; sessions already live are bound too.
    """
    binder = LiveBinder(ctx, backend)
    ctx.on("session/created", binder.on_created)
    ctx.on("session/event", binder.on_event)
    ctx.on("session/flush", binder.on_flush)
    ctx.on("session/disposed", binder.on_disposed)
    ctx.effect(binder.close, "drain session logs")
    for session in ctx.service(SESSIONS).list():
        binder.on_created(session)
    return binder


@overload
def wire_storage(
    ctx: Context, storage: SessionStorage[L], *, name: str
) -> PersistenceService[L]: ...
@overload
def wire_storage(
    ctx: Context, *, name: str, service: Callable[[Spawn, logging.Logger], S]
) -> S: ...
def wire_storage(
    ctx: Context,
    storage: SessionStorage[Any] | None = None,
    *,
    name: str,
    service: Callable[[Spawn, logging.Logger], PersistenceService[Any]] | None = None,
) -> PersistenceService[Any]:
    """The one call a storage plugin's ``apply`` makes: compose, provide, bind.

    Pass the plugin's ``storage`` (composed into a :class:`PersistenceService`), or, for a
    plugin with its own service class, ``service``: a factory called with the write window's
    spawner and the row's logger. The service is provided as ``sessionPersistence`` and the
    live sessions are bound to it (:func:`bind_live_sessions`); ``name`` (the plugin's) labels
    its background write windows. Returns the service.
    """
    if (storage is None) == (service is None):
        raise TypeError(f"{name}: wire_storage() takes a storage or a service factory, one of them")
    spawn = host_spawn(ctx, f"{name} write window")
    if service is not None:
        backend = service(spawn, ctx.logger)
    else:
        assert storage is not None
        backend = PersistenceService[Any](storage, spawn=spawn, logger=ctx.logger)
    ctx.provide(SESSION_PERSISTENCE, backend)
    bind_live_sessions(ctx, backend)
    return backend
