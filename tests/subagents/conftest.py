"""Fixtures of the sub-agent suite: a fresh PostgreSQL schema per crash test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

#: The PostgreSQL server of the postgres suite (tests/postgres/conftest.py).
PG_DSN = os.environ.get(
    "DSH_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


@pytest.fixture
def pg_schema(backend: str) -> Iterator[str | None]:
    """A fresh schema for the postgres backend, dropped afterwards (None for the others)."""
    if backend != "postgres":
        yield None
        return
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        pytest.skip(f"no PostgreSQL server answers at {PG_DSN!r} ({error})")
    schema = f"dsh_t{uuid.uuid4().hex[:12]}_sub"
    try:
        yield schema
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
