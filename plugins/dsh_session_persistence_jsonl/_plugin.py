"""The ``session-persistence-jsonl`` plugin: the backend as a service, bound to live sessions.

Live sessions are persisted by listening to the session store's events:

* ``session/created`` binds the session to a write handle — the one a resumer
  already opened for it in this backend, else a fresh ``create`` (or, for a
  log already on disk, an ``open(id, "write")`` whose stored prefix the live
  session must reproduce);
* ``session/event`` routes each committed event into that handle's buffer
  (the fixed 200 ms window starts with the first buffered event);
* ``session/flush`` drains the handle now and returns once it is durable;
* ``session/disposed`` drains and releases the handle.

Binding needs I/O (is the id already stored?), so it runs as a background
task; events committed before it finishes are picked up from the session's
own log when it does. A binding failure is raised by the session's next flush
(fail closed: the checkpoint policy then stops the turn).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import anyio
import msgspec

from dsh_host.context import Context
from dsh_host.plugin import Plugin
from dsh_host.session.events import SessionEvent
from dsh_host.session.persistence import SessionAlreadyExistsError, SessionPersistenceError
from dsh_host.session.session import Session

from ._backend import JsonlSessionPersistence, JsonlWriteHandle

__all__ = ["JsonlConfig", "SessionPersistenceJsonl"]


class JsonlConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Config of a ``session-persistence-jsonl`` row."""

    #: Root directory of all session logs (resolved against the process cwd at load).
    root: str = "./.dsh/sessions"
    #: ``zstd`` (default): one checksummed Zstandard frame per durable batch;
    #: ``none``: raw JSONL lines. One root holds one encoding.
    compression: Literal["zstd", "none"] = "zstd"


class _Binding:
    """One live session and the write handle that persists it."""

    __slots__ = ("error", "handle", "ready", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.handle: JsonlWriteHandle | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()


class _LiveBinder:
    """Keeps live sessions bound to write handles (see the module docstring)."""

    def __init__(self, ctx: Context, backend: JsonlSessionPersistence) -> None:
        self._ctx = ctx
        self._backend = backend
        self._bindings: dict[str, _Binding] = {}

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
        await binding.ready.wait()
        if binding.error is not None:
            raise binding.error
        assert binding.handle is not None
        await binding.handle.flush()

    def on_disposed(self, session: Session) -> None:
        binding = self._bindings.get(session.id)
        if binding is None or binding.session is not session:
            return
        del self._bindings[session.id]
        self._ctx.start_soon(self._release, binding, name=f"release session {session.id}")

    # -- work

    async def _bind(self, binding: _Binding) -> None:
        session = binding.session
        try:
            handle = self._backend.owner(session.id)
            if handle is None:
                try:
                    handle = await self._backend.create(session.header)
                except SessionAlreadyExistsError:
                    # Stored but not open here (e.g. a reload): adopt it only if the live
                    # session reproduces the stored prefix.
                    handle = await self._backend.open(session.id, "write")
                    try:
                        _require_prefix(handle, session, adopted=False)
                    except BaseException:
                        handle.release_now()
                        raise
            else:
                _require_prefix(handle, session, adopted=True)
            handle.bound = session
            binding.handle = handle
            events = session.events
            if len(events) > handle.next_seq:
                handle.append(list(events[handle.next_seq :]))
        except Exception as error:
            binding.error = error
            self._ctx.logger.warning(
                '%s: cannot persist session "%s": %s', self._backend.name, session.id, error
            )
        finally:
            binding.ready.set()

    async def _release(self, binding: _Binding) -> None:
        with anyio.CancelScope(shield=True):
            await binding.ready.wait()
            handle = binding.handle
            if handle is None:
                return
            try:
                await handle.close()
            except SessionPersistenceError as error:
                self._ctx.logger.error(
                    '%s: final write of session "%s" failed: %s',
                    self._backend.name,
                    binding.session.id,
                    error,
                )

    async def close(self) -> None:
        """Plugin disposal: drain every bound session, then every other handle."""
        with anyio.CancelScope(shield=True):
            for binding in list(self._bindings.values()):
                await self._release(binding)
            self._bindings.clear()
            with contextlib.suppress(Exception):
                await self._backend.aclose()


def _require_prefix(handle: JsonlWriteHandle, session: Session, *, adopted: bool) -> None:
    """The live session must reproduce what the handle already stores (else: id collision)."""
    if handle.bound is not None and handle.bound is not session:
        raise SessionAlreadyExistsError(
            f'session "{session.id}" is already bound to a different live session in this '
            "backend (id collision)"
        )
    stored = handle.accepted_events()
    live = session.events
    if len(live) < len(stored) or any(live[i] != stored[i] for i in range(len(stored))):
        what = (
            "is already persisted with" if adopted else "already has a persisted log on disk with"
        )
        raise SessionAlreadyExistsError(
            f'session "{session.id}" {what} {len(stored)} event(s) that do not match this live '
            "session (id collision); resume it instead of creating a new session with its id"
        )


class SessionPersistenceJsonl(Plugin):
    """Entry point ``session-persistence-jsonl``: provides ``sessionPersistence``."""

    name = "session-persistence-jsonl"
    provides = ("sessionPersistence",)
    inject = ("sessions",)
    Config = JsonlConfig

    def apply(self, ctx: Context, config: Any) -> None:
        assert isinstance(config, JsonlConfig)
        backend = JsonlSessionPersistence(
            config.root,
            config.compression,
            spawn=_spawner(ctx),
            logger=ctx.logger,
        )
        binder = _LiveBinder(ctx, backend)
        ctx.provide("sessionPersistence", backend)
        ctx.on("session/created", binder.on_created)
        ctx.on("session/event", binder.on_event)
        ctx.on("session/flush", binder.on_flush)
        ctx.on("session/disposed", binder.on_disposed)
        ctx.effect(binder.close, "drain session logs")
        for session in ctx.sessions.list():
            binder.on_created(session)


def _spawner(ctx: Context) -> Any:
    """Write windows run as host background tasks (cancelled after the plugin's drain)."""

    def spawn(fn: Any) -> None:
        ctx.start_soon(fn, name="session-persistence-jsonl write window")

    return spawn
