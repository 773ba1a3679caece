"""One idle poll per ``dsh serve`` process, not one per stream (D47, issue 36).

An idle ``GET /sessions/{id}/stream`` waits on its wake-up alone; the process's one poll asks
the store, every ``poll_interval``, for the ends of all the followed sessions in one call (one
statement on PostgreSQL) and wakes only those stored past what their streams have seen. So
what idle streams cost a poll does not grow with the streams held, and a write no wake-up
announced (another store handle, outside the server) still reaches its stream.

Real Hypercorn on loopback, real PostgreSQL (a fresh schema per test). The counts are taken by
wrapping the real methods (each wrapper calls the real one): ``read_from`` of the persistence
service (a follower's read, one ``SELECT`` each) and the PostgreSQL pool's ``run`` (every
statement of the session store).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from persistence.helpers import user

from dsh_host._persistence.backend import PersistenceService
from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions
from dsh_host._server.serve import bind_socket, serve

from .harness import Server, write_composition

psycopg = pytest.importorskip("psycopg")

from dsh_session_persistence_postgres import _backend as pg_backend  # noqa: E402
from dsh_session_persistence_postgres import _pool as pg_pool  # noqa: E402
from psycopg import sql  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

#: The poll interval of these servers (seconds): short, so a window holds many polls.
POLL = 0.1


@dataclass
class Counts:
    """Calls of the real methods, since the last :meth:`reset`."""

    read_from: int = 0
    statements: int = 0

    def reset(self) -> None:
        self.read_from = self.statements = 0


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """Count ``PersistenceService.read_from`` and the PostgreSQL pool's statements."""
    found = Counts()
    read_from = PersistenceService.read_from
    run = pg_pool.ConnectionPool.run

    async def counted_read_from(self: Any, *args: Any, **kwargs: Any) -> Any:
        found.read_from += 1
        return await read_from(self, *args, **kwargs)

    async def counted_run(self: Any, fn: Any) -> Any:
        found.statements += 1
        return await run(self, fn)

    monkeypatch.setattr(PersistenceService, "read_from", counted_read_from)
    monkeypatch.setattr(pg_pool.ConnectionPool, "run", counted_run)
    return found


@pytest.fixture
def pg_env(monkeypatch: pytest.MonkeyPatch, pg_dsn: str, pg_prefix: str) -> str:
    """The server's store: a schema of its own on the test PostgreSQL (its name returned)."""
    schema = f"{pg_prefix}_serve"
    monkeypatch.setenv("DSH_POSTGRES_DSN", pg_dsn)
    monkeypatch.setenv("DSH_POSTGRES_SCHEMA", schema)
    return schema


@asynccontextmanager
async def pg_server(tmp: Path) -> AsyncIterator[Server]:
    """An in-process ``dsh serve`` over PostgreSQL (``configs/postgres.yml``), polling every
    :data:`POLL` seconds; the model is never asked (no turn runs)."""
    workspace = tmp / "ws"
    workspace.mkdir(exist_ok=True)
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "unused"}]}))
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp, base="postgres.yml")), [], f"scripted:{script}", None
        ),
        default_workspace=str(workspace.resolve()),
        poll_interval=POLL,
    )
    sock = bind_socket("127.0.0.1", 0)
    stop = anyio.Event()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with anyio.create_task_group() as group:
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
                try:
                    yield Server(url, client, workspace, tmp / "unused-root")
                finally:
                    stop.set()
    finally:
        sock.close()


@asynccontextmanager
async def streams_open(server: Server, session_ids: list[str]) -> AsyncIterator[list[Any]]:
    """A stream open on each session (its first frame received); each one's line iterator."""
    async with contextlib.AsyncExitStack() as stack:
        lines: list[Any] = []
        for session_id in session_ids:
            response = await stack.enter_async_context(
                server.client.stream("GET", f"/sessions/{session_id}/stream")
            )
            assert response.status_code == 200, await response.aread()
            it = response.aiter_lines()
            assert await it.__anext__() == ": dsh event stream"
            lines.append(it)
        yield lines


async def next_event(lines: Any) -> dict[str, Any]:
    """The data of the stream's next event (comment lines skipped)."""
    async for line in lines:
        if line.startswith("data: "):
            data: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return data
    raise AssertionError("the stream ended before its next event")


async def write_outside(dsn: str, schema: str, session_id: str, text: str) -> int:
    """Append a user message to the session through another store handle (no wake-up reaches
    the server: not its process, no queue, no NOTIFY); its seq."""
    async with pg_backend.PostgresSessionPersistence(dsn, schema=schema) as store:
        handle = await store.open(session_id, "write")
        seq = int(handle.next_seq)
        handle.append([user(seq, text)])
        await handle.flush()
        await handle.close()
    return seq


@pytest.mark.parametrize("held", [10, 100])
async def test_idle_streams_cost_one_statement_a_poll_whatever_their_number(
    tmp_path: Path, pg_env: str, counts: Counts, held: int
) -> None:
    """``held`` idle streams over ten poll intervals: no stream reads its session (nothing
    changed), and the store sees at most one statement a poll (plus slack for the window's
    edges), with 10 streams as with 100; once the streams are gone, none. Before D47 every
    stream read its session at every interval: ``held`` × 10 reads."""
    async with pg_server(tmp_path) as server:
        sessions = [await server.create() for _ in range(held)]
        async with streams_open(server, sessions):
            await anyio.sleep(3 * POLL)  # every stream is in its idle wait
            counts.reset()
            await anyio.sleep(10 * POLL)
            window = (counts.read_from, counts.statements)
        # The streams have ended: the poll stops with the last one. How soon the server sees
        # a client go is not this test's business, so quiet is waited for (a poll that never
        # stops never gets there: the hang guard fails it).
        deadline = anyio.current_time() + 60
        while True:
            counts.reset()
            await anyio.sleep(5 * POLL)
            if (counts.read_from, counts.statements) == (0, 0):
                break
            assert anyio.current_time() < deadline, f"still polling: {counts}"
    assert window[0] == 0, f"{window[0]} reads by {held} idle streams in 10 polls"
    assert window[1] <= 10 + 2, f"{window[1]} statements for {held} idle streams in 10 polls"


async def test_a_write_outside_the_server_reaches_its_idle_stream_alone(
    tmp_path: Path, pg_dsn: str, pg_env: str, counts: Counts
) -> None:
    """Another store handle appends to one followed session: no wake-up tells the server, yet
    its idle stream shows the event (the poll saw the session's end move), and only that
    stream read the store; the others stay idle."""
    async with pg_server(tmp_path) as server:
        sessions = [await server.create() for _ in range(5)]
        async with streams_open(server, sessions) as lines:
            await anyio.sleep(3 * POLL)
            counts.reset()
            seq = await write_outside(pg_dsn, pg_env, sessions[2], "written outside")
            data = await next_event(lines[2])
            assert (data["seq"], data["type"]) == (seq, "user/message")
            assert data["data"]["content"][0]["text"] == "written outside"
            await anyio.sleep(3 * POLL)
            assert counts.read_from == 1  # the woken stream's read; no other stream read
            # Another one, later: the poll goes on (and the stream shows it once).
            second = await write_outside(pg_dsn, pg_env, sessions[2], "and again")
            assert (await next_event(lines[2]))["seq"] == second == seq + 1


async def test_a_store_outage_ends_the_streams_and_the_poll_survives_it(
    tmp_path: Path, pg_dsn: str, pg_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's events table vanishes (renamed away) while streams wait idle: the poll's
    statement fails (one log line); every idle stream is woken, reads, and ends on the error
    (its client reconnects with Last-Event-ID), as a stream ended on an outage before D47.
    Once the table is back, the poll still runs: a write outside the server reaches a new
    stream."""
    events = sql.Identifier(pg_env, "events")
    caplog.set_level(logging.INFO, logger="dsh.server")
    async with pg_server(tmp_path) as server:
        sessions = [await server.create() for _ in range(3)]
        async with streams_open(server, sessions) as lines:
            await anyio.sleep(3 * POLL)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER TABLE {} RENAME TO gone").format(events))
            try:
                for stream in lines:  # each stream ends: the iterator is exhausted
                    assert [line async for line in stream if line.startswith("data:")] == []
                await anyio.sleep(5 * POLL)  # a poll with nobody idle: it stops
            finally:
                with psycopg.connect(pg_dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("ALTER TABLE {}.gone RENAME TO events").format(
                        sql.Identifier(pg_env)))
        polls = [r.getMessage() for r in caplog.records if "idle poll" in r.getMessage()]
        assert len([m for m in polls if "failed" in m]) == 1, polls
        ended = [r for r in caplog.records if "stream of session" in r.getMessage()]
        assert len(ended) == len(sessions)
        async with streams_open(server, sessions[:1]) as again:
            seq = await write_outside(pg_dsn, pg_env, sessions[0], "after the outage")
            assert (await next_event(again[0]))["seq"] == seq
