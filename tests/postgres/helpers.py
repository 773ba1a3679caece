"""Helpers for the PostgreSQL tests: a backend with a task group, direct SQL, polling."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from dsh_session_persistence_postgres import PostgresSessionPersistence
from psycopg import sql


@asynccontextmanager
async def backend(
    dsn: str, schema: str, **options: Any
) -> AsyncIterator[PostgresSessionPersistence]:
    """A backend whose write windows run in a task group; drained and closed on exit."""
    async with anyio.create_task_group() as tg:
        options.setdefault("spawn", tg.start_soon)
        instance = PostgresSessionPersistence(dsn, schema=schema, **options)
        try:
            yield instance
        finally:
            await instance.aclose()
            tg.cancel_scope.cancel()


def query(dsn: str, statement: str | sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh autocommit connection (blocking; fine in tests)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


def stored_rows(dsn: str, schema: str, session_id: str) -> list[tuple[int, str]]:
    return [
        (int(seq), str(event))
        for seq, event in query(
            dsn,
            sql.SQL(
                "SELECT seq, event::text FROM {}.events WHERE session_id = %s ORDER BY seq"
            ).format(sql.Identifier(schema)),
            (session_id,),
        )
    ]


def backend_alive(dsn: str, pid: int) -> bool:
    return bool(query(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)))


async def until(condition: Callable[[], bool], *, limit: float = 20) -> None:
    """Wait for other tasks or processes to reach a state (bounded; not a timing assert)."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - polls state owned by others
            await anyio.sleep(0.005)


async def until_gone(dsn: str, pid: int) -> None:
    """Wait until PostgreSQL has ended backend ``pid`` (its locks are released then)."""
    await until(lambda: not backend_alive(dsn, pid))


def lock_pid(handle: Any) -> int | None:
    """The PostgreSQL backend pid holding a write handle's lock (None once released)."""
    lease = handle.lease
    return None if lease is None else lease.backend_pid
