"""Connections: psycopg's *blocking* API, driven from worker threads.

Why not ``psycopg.AsyncConnection``? It is built on asyncio and fails under trio
(``RuntimeError: no running event loop``), and the host runs on trio by default
and must also run on asyncio (D2). So every database call here is a
plain synchronous psycopg call made on an anyio worker thread
(``anyio.to_thread.run_sync``), which behaves the same on both backends. One
connection is used by one thread at a time: the pool hands a connection to one
caller, and a write handle's connection is only used by its single active write.

Cancellation: a thread call is never abandoned (anyio waits for it before
delivering the cancellation), so the caller always learns whether a statement
committed. A call stuck on a dead network ends through the TCP keepalives set
here (about a minute), not through cancellation.

The pool is deliberately small: ``psycopg_pool`` is not a dependency of this
project, and the backend needs only "at most N idle connections, reuse them,
drop broken ones".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["ConnectionPool", "describe_dsn", "writer_conninfo"]

T = TypeVar("T")

#: Identifies our backends in ``pg_stat_activity`` unless the DSN names another.
APPLICATION_NAME: Final = "dsh-session-persistence-postgres"

#: Added when the DSN does not choose: notice a dead peer within about a minute.
_KEEPALIVES: Final = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for error messages (``host=… port=… dbname=… user=…``)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    shown = [f"{key}={params[key]}" for key in ("host", "port", "dbname", "user") if key in params]
    return " ".join(shown) if shown else "<libpq defaults>"


def writer_conninfo(dsn: str, *, connect_timeout: float) -> str:
    """The DSN with our session settings added.

    ``synchronous_commit=on`` travels as a startup option, so it wins over any
    role or database default (and over the DSN's own options) and costs no
    round trip: a commit on these connections returns only once its WAL record
    is flushed to disk. Keepalives, a connect timeout and an application name
    are added only where the DSN does not choose.
    """
    params: dict[str, Any] = dict(conninfo_to_dict(dsn))
    # Appended last, so it also overrides a ``-c synchronous_commit=...`` in the DSN.
    params["options"] = (str(params.get("options", "")) + " -c synchronous_commit=on").strip()
    params.setdefault("application_name", APPLICATION_NAME)
    params.setdefault("connect_timeout", str(max(1, round(connect_timeout))))
    for key, value in _KEEPALIVES.items():
        params.setdefault(key, value)
    return make_conninfo("", **params)


def connect(conninfo: str) -> psycopg.Connection[Any]:
    """Open one autocommit connection (blocking: call it on a worker thread)."""
    return psycopg.Connection.connect(conninfo, autocommit=True)


def usable(conn: psycopg.Connection[Any]) -> bool:
    """Whether a connection can go back to the pool."""
    if conn.closed or conn.broken:
        return False
    return conn.info.transaction_status == pq.TransactionStatus.IDLE


class ConnectionPool:
    """At most ``size`` connections in use at once; idle ones are kept for reuse."""

    def __init__(self, conninfo: str, size: int) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.conninfo = conninfo
        self.size = size
        self._slots = anyio.Semaphore(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False

    @asynccontextmanager
    async def connection(self, *, fresh: bool = False) -> AsyncIterator[psycopg.Connection[Any]]:
        """Borrow a connection (``fresh``: a new one, not an idle one).

        It returns to the pool only if it is healthy and idle.
        """
        if self._closed:
            raise RuntimeError("the PostgreSQL connection pool is closed")
        async with self._slots:
            conn = None if fresh or not self._idle else self._idle.pop()
            if conn is None or not usable(conn):
                if conn is not None:
                    await anyio.to_thread.run_sync(conn.close)
                conn = await anyio.to_thread.run_sync(connect, self.conninfo)
            try:
                yield conn
            finally:
                if not self._closed and usable(conn):
                    self._idle.append(conn)
                else:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(conn.close)

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn(conn)`` on a worker thread with a borrowed connection.

        An idle connection can die unnoticed (a server restart, an idle timeout);
        the first use then fails with the connection marked broken. That attempt
        is repeated once on a new connection, so ``fn`` must be safe to repeat: the
        backend passes only reads and single transactions (which roll back when
        their connection dies).
        """
        async with self.connection() as conn:
            try:
                return await anyio.to_thread.run_sync(fn, conn)
            except psycopg.OperationalError:
                if not conn.broken:
                    raise
        async with self.connection(fresh=True) as conn:
            return await anyio.to_thread.run_sync(fn, conn)

    async def aclose(self) -> None:
        """Close idle connections; borrowed ones are closed when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await anyio.to_thread.run_sync(conn.close)
