"""The ``session-persistence-sqlite`` plugin: :class:`SqliteStorage` as the service, bound to
live sessions (the session layer's binder, exactly as for JSONL and PostgreSQL)."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import msgspec

from dsh_host.sdk import (
    ConfigError,
    Context,
    PersistenceService,
    Plugin,
    Spawn,
    default_session_root,
    wire_storage,
)

from ._storage import JournalMode, SqliteLease, SqliteStorage

__all__ = ["SessionPersistenceSqlite", "SqliteConfig", "SqliteSessionPersistence"]

#: The database file under the default session root when ``path`` is not set.
DEFAULT_FILE = "sessions.sqlite3"


class SqliteConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``session-persistence-sqlite`` row (DSH's camelCase accepted)."""

    #: The directory holding the database, ``<root>/sessions.sqlite3`` (``~`` expanded; what
    #: ``--root`` sets). Unset: ``$DSH_SESSION_ROOT``, else ``$XDG_DATA_HOME/dsh/sessions``
    #: (outside every workspace, D15).
    root: str | None = None
    #: The database file itself (DSH's key), instead of ``root``; set at most one of the two.
    path: str | None = None
    #: SQLite journal mode; ``wal`` (default) lets readers run beside the writer.
    journal_mode: JournalMode = "wal"
    #: How long one SQLite call waits for another process's write transaction.
    busy_timeout_ms: Annotated[int, msgspec.Meta(ge=0, le=600_000)] = 5000


class SqliteSessionPersistence(PersistenceService[SqliteLease]):
    """The ``sessionPersistence`` service over :class:`SqliteStorage` (a named constructor)."""

    storage: SqliteStorage

    def __init__(
        self,
        path: str,
        *,
        journal_mode: JournalMode = "wal",
        busy_timeout_ms: int = 5000,
        spawn: Spawn | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        storage = SqliteStorage(path, journal_mode=journal_mode, busy_timeout_ms=busy_timeout_ms)
        super().__init__(storage, spawn=spawn, logger=logger)


class SessionPersistenceSqlite(Plugin):
    """Entry point ``session-persistence-sqlite``: provides ``sessionPersistence``."""

    name = "session-persistence-sqlite"
    provides = ("sessionPersistence",)
    inject = ("sessions",)
    root_key = "root"
    Config = SqliteConfig

    def apply(self, ctx: Context, config: SqliteConfig) -> None:
        if config.root is not None and config.path is not None:
            raise ConfigError(
                "session-persistence-sqlite: set config.root (the directory of "
                f"{DEFAULT_FILE}) or config.path (the database file), not both"
            )
        path = config.path or os.path.join(config.root or default_session_root(), DEFAULT_FILE)
        def service(spawn: Spawn, logger: logging.Logger) -> SqliteSessionPersistence:
            return SqliteSessionPersistence(
                path,
                journal_mode=config.journal_mode,
                busy_timeout_ms=config.busy_timeout_ms,
                spawn=spawn,
                logger=logger,
            )

        wire_storage(ctx, name=self.name, service=service)
