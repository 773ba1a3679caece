"""The ``session-persistence-postgres`` plugin: the backend as a service, bound to live sessions.

Live sessions reach PostgreSQL through the session layer's binder
(:mod:`dsh_host._persistence.binding`), exactly as with the JSONL plugin:
``session/created`` binds the session to a write handle (the one a resumer
already opened, else a fresh ``create``, else — for a session stored but not
open here — an ``open(id, "write")`` whose stored events the live session must
reproduce), ``session/event`` buffers each committed event (the fixed 200 ms
window starts with the first one; its write runs as a host background task),
``session/flush`` drains and returns once the batch is committed,
``session/disposed`` drains and releases the lock. A binding failure — or a
lost lock — is raised by the session's next flush (fail closed: the checkpoint
policy then stops the turn before the next side effect). Plugin disposal drains
every handle first, so an orderly shutdown loses nothing that was appended.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated

import msgspec

from dsh_host.sdk import (
    ConfigError,
    Context,
    Plugin,
    Spawn,
    StoreUrl,
    wire_storage,
)

from ._backend import PostgresSessionPersistence

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


class SessionPersistencePostgres(Plugin):
    """Entry point ``session-persistence-postgres``: provides ``sessionPersistence``."""

    name = "session-persistence-postgres"
    provides = ("sessionPersistence",)
    store_url = StoreUrl(schemes=("postgresql", "postgres"), key="dsn")
    inject = ("sessions",)
    Config = PostgresConfig

    def apply(self, ctx: Context, config: PostgresConfig) -> None:
        dsn = resolve_dsn(config)

        def service(spawn: Spawn, logger: logging.Logger) -> PostgresSessionPersistence:
            return PostgresSessionPersistence(
                dsn,
                schema=config.schema,
                pool_size=config.pool_size,
                connect_timeout=config.connect_timeout,
                spawn=spawn,
                logger=logger,
            )

        backend = wire_storage(ctx, name=self.name, service=service)
        # Create or check the schema now, so a bad DSN or an unreachable server is logged
        # at boot rather than at the first session (which would raise it again; it is
        # idempotent and locked, so binding the live sessions first changes nothing).
        ctx.start_soon(backend.ensure_schema, name="session-persistence-postgres schema")
