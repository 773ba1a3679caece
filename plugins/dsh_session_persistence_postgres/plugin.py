"""The ``session-persistence-postgres`` plugin: the backend as a service, bound to live sessions.

Live sessions reach PostgreSQL through the session store's events, exactly as
with the JSONL plugin:

* ``session/created`` binds the session to a write handle — the one a resumer
  already opened for it in this backend (``open(id, "write")``), else a fresh
  ``create``; for a session already stored but not open here, an
  ``open(id, "write")`` whose stored events the live session must reproduce;
* ``session/event`` routes each committed event into that handle's buffer (the
  fixed 200 ms window starts with the first buffered event; its write runs as
  a background task, ``ctx.start_soon``);
* ``session/flush`` drains the handle and returns once the batch is committed;
* ``session/disposed`` drains the handle and releases its lock.

Binding needs I/O (is the id stored? take the lock), so it runs as a
background task; events committed before it finishes are picked up from the
session's own log when it does. A binding failure — or a lost lock — is raised
by the session's next flush (fail closed: the checkpoint policy then stops the
turn before the next side effect). Plugin disposal drains every handle first
(``ctx.effect``), so an orderly shutdown loses nothing that was appended.
"""

from __future__ import annotations

import contextlib
import os
from typing import Annotated

import anyio
import msgspec

from dsh_host import Context, Plugin
from dsh_host.errors import ConfigError
from dsh_host.session.events import SessionEvent
from dsh_host.session.persistence import SessionAlreadyExistsError, SessionPersistenceError
from dsh_host.session.session import Session

from ._backend import PostgresSessionPersistence, PostgresWriteHandle

__all__ = ["PostgresConfig", "SessionPersistencePostgres", "resolve_dsn"]


class PostgresConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``session-persistence-postgres`` row."""

    #: libpq connection string or URI. Prefer ``dsn_env`` when it carries a password.
    dsn: str | None = None
    #: Name of an environment variable holding the DSN, read when the row mounts
    #: (keeps the secret out of the config object and of ``dsh plugins`` output).
    dsn_env: str | None = None
    #: PostgreSQL schema holding this store's tables (created on first use).
    schema: str = "dsh"
    #: Connections shared by reads, listing and creation. Each open write handle
    #: holds one more connection (the one carrying its advisory lock).
    pool_size: Annotated[int, msgspec.Meta(ge=1, le=100)] = 4
    #: Seconds to wait for a new connection.
    connect_timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0


def resolve_dsn(config: PostgresConfig) -> str:
    """The DSN the config names; exactly one of ``dsn`` and ``dsn_env`` must be set."""
    if (config.dsn is None) == (config.dsn_env is None):
        raise ConfigError(
            "session-persistence-postgres: set exactly one of config.dsn (a libpq connection "
            'string, e.g. "host=127.0.0.1 dbname=dsh") or config.dsn_env (the name of an '
            "environment variable holding it)"
        )
    if config.dsn is not None:
        return config.dsn
    assert config.dsn_env is not None
    value = os.environ.get(config.dsn_env)
    if not value:
        raise ConfigError(
            f"session-persistence-postgres: config.dsn_env names ${config.dsn_env}, which is "
            "not set or empty; export the DSN in that variable or use config.dsn"
        )
    return value


class _Binding:
    """One live session and the write handle that persists it."""

    __slots__ = ("error", "handle", "ready", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.handle: PostgresWriteHandle | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()


class _LiveBinder:
    """Keeps live sessions bound to write handles (see the module docstring)."""

    def __init__(self, ctx: Context, backend: PostgresSessionPersistence) -> None:
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
                    # Stored but not open here (another worker wrote it, or a restart):
                    # adopt it only if the live session reproduces the stored events.
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


def _require_prefix(handle: PostgresWriteHandle, session: Session, *, adopted: bool) -> None:
    """The live session must reproduce what the handle already holds (else: id collision)."""
    if handle.bound is not None and handle.bound is not session:
        raise SessionAlreadyExistsError(
            f'session "{session.id}" is already bound to a different live session in this '
            "backend (id collision)"
        )
    stored = handle.events
    live = session.events
    if len(live) < len(stored) or any(live[i] != stored[i] for i in range(len(stored))):
        what = "is already persisted with" if adopted else "already has a persisted log with"
        raise SessionAlreadyExistsError(
            f'session "{session.id}" {what} {len(stored)} event(s) that do not match this live '
            "session (id collision); resume it instead of creating a new session with its id"
        )


class SessionPersistencePostgres(Plugin):
    """Entry point ``session-persistence-postgres``: provides ``sessionPersistence``."""

    name = "session-persistence-postgres"
    provides = ("sessionPersistence",)
    inject = ("sessions",)
    Config = PostgresConfig

    def apply(self, ctx: Context, config: PostgresConfig) -> None:
        backend = PostgresSessionPersistence(
            resolve_dsn(config),
            schema=config.schema,
            pool_size=config.pool_size,
            connect_timeout=config.connect_timeout,
            spawn=ctx.start_soon,
            logger=ctx.logger,
        )
        binder = _LiveBinder(ctx, backend)
        ctx.provide("sessionPersistence", backend)
        ctx.on("session/created", binder.on_created)
        ctx.on("session/event", binder.on_event)
        ctx.on("session/flush", binder.on_flush)
        ctx.on("session/disposed", binder.on_disposed)
        ctx.effect(binder.close, "drain session logs")
        # Create or check the schema now, so a bad DSN or an unreachable server is logged
        # at boot rather than at the first session (which would raise it again).
        ctx.start_soon(backend.ensure_schema, name="session-persistence-postgres schema")
        for session in ctx.sessions.list():
            binder.on_created(session)
