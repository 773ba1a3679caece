"""PostgreSQL fixtures: a real server on 127.0.0.1:5432, a fresh schema per test.

Every test gets its own randomly named schema prefix, and every schema made
with it is dropped afterwards, so these tests run concurrently with any other
suite on the same server and never see each other's rows. The tests skip (with
the reason) only when no server answers; CI starts one (``.ci/run``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

#: Override to point the suite at another server.
DSN = os.environ.get("DSH_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test")


def _probe() -> str | None:
    try:
        with psycopg.connect(DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return f"{type(error).__name__}: {str(error).strip()}"
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    problem = _probe()
    if problem is not None:
        pytest.skip(f"no PostgreSQL server answers at {DSN!r} ({problem})")
    return DSN


def drop_schemas(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
            )
        ]
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def pg_prefix(pg_dsn: str) -> Iterator[str]:
    """A unique schema-name prefix; every schema starting with it is dropped afterwards."""
    prefix = f"dsh_t{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        drop_schemas(pg_dsn, prefix)


@pytest.fixture
def pg_schema(pg_prefix: str) -> str:
    return f"{pg_prefix}_main"
