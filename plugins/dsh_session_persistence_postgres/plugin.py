"""The ``session-persistence-postgres`` plugin: the service plus the live-session wiring.

Live sessions reach storage through the host's session events:

- ``session/created`` binds the session to a write handle: the ownerless
  handle a resumer opened (``open(id, "write")``) if there is one — its stored
  events must be a prefix of the live log — else a new lazy handle (no I/O; a
  collision with a stored session surfaces at the first flush). The live
  events the handle lacks (a seed, the ``session/end-seed`` marker) are
  appended at once.
- ``session/event`` admits each event to the handle; the first buffered event
  arms the fixed 200 ms window, whose write runs as a background task
  (``ctx.start_soon``).
- ``session/flush`` is the barrier: it drains the handle, durably.
- ``session/disposed`` closes the handle (final drain, then the lock is
  released) in a background task; plugin disposal drains every handle first
  (``ctx.effect``), so nothing buffered is dropped by an orderly shutdown.

A binding that fails in ``session/created`` cannot veto the session (created
listeners are notifications), so the failure is kept and raised by the
session's next flush: fail closed at the durability barrier.
"""

from __future__ import annotations

import os
import weakref
from typing import Annotated, Any

import msgspec

from dsh_host import Context, Plugin
from dsh_host.errors import ConfigError
from dsh_host.session.events import SessionEvent, encode_event
from dsh_host.session.persistence import SessionAlreadyExistsError, SessionPersistenceError

from ._backend import PostgresSessionPersistence, PostgresWriteHandle

__all__ = ["PostgresConfig", "SessionPersistencePostgres", "bind_live_session"]


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


def _same_event(a: SessionEvent, b: SessionEvent) -> bool:
    return a is b or a == b or encode_event(a) == encode_event(b)


def bind_live_session(backend: PostgresSessionPersistence, session: Any) -> PostgresWriteHandle:
    """Bind a live session to its write handle (spec §7.6) and queue what storage lacks.

    Raises :class:`SessionAlreadyExistsError` when the id is bound to another
    live session that already wrote, or the handle's stored events are not a
    prefix of the live log.
    """
    sid: str = session.id
    events = list(session.events)
    handle = backend.owner(sid)
    if handle is not None and handle.bound is not None and handle.bound is not session:
        # Reclaim an id whose previous live owner never wrote anything.
        if handle.materialized or handle.next_seq > 0:
            raise SessionAlreadyExistsError(
                f'session "{sid}" is already bound to a different live session in this backend '
                "(id collision)"
            )
        handle.release_now()
        handle = None
    if handle is None:
        handle = backend.create_lazy(session.header)
    else:
        stored = handle.header.to_json().get("cwd")
        live = session.header.to_json().get("cwd")
        if stored != live:
            raise SessionAlreadyExistsError(
                f'session "{sid}" is already persisted at a different cwd (persisted: {stored}, '
                f"live: {live}) (id collision)"
            )
        known = handle.events
        if len(events) < len(known) or not all(
            _same_event(a, b) for a, b in zip(events, known, strict=False)
        ):
            raise SessionAlreadyExistsError(
                f'session "{sid}" is already persisted with {len(known)} event(s) that do '
                "not match this live session (id collision)"
            )
    handle.bound = session
    suffix = events[handle.next_seq :]
    if suffix:
        handle.append(suffix)
    return handle


class SessionPersistencePostgres(Plugin):
    """Entry point ``session-persistence-postgres``: the ``sessionPersistence`` service."""

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
        handles: weakref.WeakKeyDictionary[Any, PostgresWriteHandle] = weakref.WeakKeyDictionary()
        failures: weakref.WeakKeyDictionary[Any, BaseException] = weakref.WeakKeyDictionary()

        def on_created(session: Any) -> None:
            try:
                handles[session] = bind_live_session(backend, session)
            except SessionPersistenceError as error:
                failures[session] = error
                raise

        def on_event(session: Any, event: SessionEvent) -> None:
            handle = handles.get(session)
            if handle is not None:
                handle.admit_live(event)

        async def on_flush(session: Any) -> None:
            failure = failures.get(session)
            if failure is not None:
                raise failure
            handle = handles.get(session)
            if handle is not None:
                await handle.flush()

        def on_disposed(session: Any) -> None:
            failures.pop(session, None)
            handle = handles.pop(session, None)
            if handle is not None:
                ctx.start_soon(handle.close, name=f"close session {session.id}")

        ctx.provide("sessionPersistence", backend)
        ctx.on("session/created", on_created)
        ctx.on("session/event", on_event)
        ctx.on("session/flush", on_flush)
        ctx.on("session/disposed", on_disposed)
        ctx.effect(backend.aclose, "drain and close session-persistence-postgres")
        ctx.start_soon(backend.ensure_schema, name="session-persistence-postgres schema")
