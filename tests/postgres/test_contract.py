"""The shared backend contract (tests/persistence/contract.py) run against PostgreSQL.

A contract "store" is a PostgreSQL schema: the same store name reaches the same
rows from any backend instance or process; different names are isolated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from dsh_session_persistence_postgres import PostgresSessionPersistence
from persistence.contract import *  # noqa: F403

pytestmark = pytest.mark.anyio


class PostgresFactory:
    def __init__(self, dsn: str, prefix: str) -> None:
        self.dsn = dsn
        self.prefix = prefix

    def schema(self, store: str) -> str:
        return f"{self.prefix}_{store}"

    def make(self, store: str, spawn: Callable[..., Any] | None) -> PostgresSessionPersistence:
        return PostgresSessionPersistence(self.dsn, schema=self.schema(store), spawn=spawn)

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_postgres import PostgresSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return PostgresSessionPersistence({self.dsn!r}, schema={self.schema(store)!r}, "
            "spawn=spawn)\n"
        )


@pytest.fixture
def backend_factory(pg_dsn: str, pg_prefix: str) -> PostgresFactory:
    return PostgresFactory(pg_dsn, pg_prefix)
