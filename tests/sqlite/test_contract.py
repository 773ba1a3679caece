"""The shared backend and live-binding contracts run against the SQLite storage.

A contract "store" is one database file: the same store name reaches the same rows from any
backend instance or process; different names are isolated.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_sqlite import SqliteSessionPersistence
from persistence.contract import *  # noqa: F403
from persistence.live_contract import *  # noqa: F403
from persistence.live_contract import wire

from dsh_host import Row

pytestmark = pytest.mark.anyio


class SqliteFactory:
    def __init__(self, base: Path) -> None:
        self.base = base

    def path(self, store: str) -> str:
        return os.path.join(self.base, store, "sessions.sqlite3")

    def make(self, store: str, spawn: Callable[..., Any] | None) -> SqliteSessionPersistence:
        return SqliteSessionPersistence(self.path(store), spawn=spawn)

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_sqlite import SqliteSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return SqliteSessionPersistence({self.path(store)!r}, spawn=spawn)\n"
        )


class SqliteLive:
    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[Row]:
        config = {"path": str(self.path)}
        return [Row(name="sessions"), Row(name="session-persistence-sqlite", config=config)]

    async def stored(self, session_id: str) -> list[Any]:
        backend = SqliteSessionPersistence(str(self.path))
        try:
            return wire((await (await backend.open(session_id, "read")).read()).events)
        finally:
            await backend.aclose()


@pytest.fixture
def backend_factory(tmp_path: Path) -> SqliteFactory:
    return SqliteFactory(tmp_path)


@pytest.fixture
def live_backend(tmp_path: Path) -> SqliteLive:
    return SqliteLive(tmp_path / "store" / "sessions.sqlite3")
