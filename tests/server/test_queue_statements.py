"""``dsh serve --queue``: the statements a queued turn sends to PostgreSQL (issue 36, D48).

A turn's cycle costs PostgreSQL CPU in every statement, and each is a round trip of a busy
event loop. An in-process queue server on asyncio (the real PostgreSQL store, the real job
queue) runs turns one after another; every statement its connections send is counted on the
real cursors, by kind. The test's own connection (waiting for each job to be marked finished)
is left out.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql

pytest.importorskip("procrastinate")

from dsh_host._server.command import build_compositions
from dsh_host._server.queue import events_channel
from dsh_host._server.runtime import ServeOptions
from dsh_host._server.serve import bind_socket, serve

from .harness import REPO

TURNS = 6


def _kind(query: str) -> str:
    text = " ".join(query.split())
    for kind, marker in (
        ("write", "INSERT INTO"),  # an announced one ends in its NOTIFY
        ("notify", "SELECT pg_notify"),
        ("fetch", "procrastinate_fetch_job"),
        ("read", "SELECT * FROM (SELECT NULL::bigint AS seq"),
    ):
        if marker in text:
            return kind
    return text[:40]


def test_a_queued_turn_sends_no_statement_of_its_own_to_wake_the_other_workers(
    tmp_path: Path, pg_dsn: str, pg_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other workers' streams learn of a stored batch by a NOTIFY. It used to be a
    statement of its own after each flush (~2 a turn, a round trip on the relay's
    connection); the store now sends it in the statement that inserts the batch. Counted:
    no NOTIFY statement in a turn's cycle, every other kind as before (3 reads, 3 writes
    here), and a listener still gets one notification per batch stored, naming the session,
    once the rows are there."""
    sent: list[str] = []
    mine: set[int] = set()  # id() of the test's own connections: not counted

    def count(cursor: Any, query: Any) -> None:
        if id(cursor.connection) not in mine:
            sent.append(query.as_string(cursor) if isinstance(query, sql.Composable) else
                        str(query))

    sync_execute = psycopg.Cursor.execute
    async_execute = psycopg.AsyncCursor.execute

    def counted(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        count(self, query)
        return sync_execute(self, query, *args, **kwargs)

    async def async_counted(
        self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kwargs: Any
    ) -> Any:
        count(self, query)
        return await async_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", async_counted)
    monkeypatch.setenv("DSH_POSTGRES_DSN", pg_dsn)
    monkeypatch.setenv("DSH_POSTGRES_SCHEMA", f"{pg_prefix}_main")
    (tmp_path / "ws").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "done"}] * (TURNS + 1)}))
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / "postgres.yml").read_text())
    queue_schema = f"{pg_prefix}_queue"
    options = ServeOptions(
        compositions=build_compositions(str(config), [], f"scripted:{script}", None),
        default_workspace=str((tmp_path / "ws").resolve()),
        queue_dsn=pg_dsn, queue_schema=queue_schema,
    )

    async def main() -> tuple[Counter[str], list[str], str]:
        sock = bind_socket("127.0.0.1", 0)
        stop = anyio.Event()
        async with (
            await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as own,
            await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener,
            anyio.create_task_group() as group,
        ):
            mine.update({id(own), id(listener)})
            await listener.execute(
                sql.SQL("LISTEN {}").format(sql.Identifier(events_channel(queue_schema))))
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            notices: list[str] = []
            listener.add_notify_handler(lambda notice: notices.append(notice.payload))
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                created = await client.post("/sessions", json={})
                assert created.status_code == 201, created.text
                session_id = str(created.json()["id"])
                # The creation's batch was committed before the 201: its notification comes
                # with the answer to the listener's next statement.
                await listener.execute("SELECT 1")
                notices.clear()
                sent.clear()
                for turn in range(1, TURNS + 1):
                    posted = await client.post(f"/sessions/{session_id}/turns",
                                               json={"prompt": f"turn {turn}"})
                    assert posted.status_code == 202, posted.text
                    while True:  # the job marked finished: the turn's cycle is over
                        found = await (await own.execute(
                            sql.SQL("SELECT status FROM {}.procrastinate_jobs WHERE lock = %s "
                                    "AND args->>'turn' = %s").format(
                                        sql.Identifier(queue_schema)),
                            (session_id, str(turn)))).fetchone()
                        if found is not None and found[0] == "succeeded":
                            break
                        await anyio.sleep(0.01)
                kinds = Counter(_kind(query) for query in sent)
                # every batch stored was announced at its commit, before the job finished
                await listener.execute("SELECT 1")
            stop.set()
        sock.close()
        return kinds, notices, session_id

    kinds, notices, session_id = asyncio.run(main())
    per_turn = {kind: count / TURNS for kind, count in kinds.items()}
    assert per_turn.get("notify", 0) == 0, per_turn
    # the turn's own statements are all still there: the POST's read, the worker's
    # admission read and its read under the lock; three batches stored
    assert per_turn["read"] == 3, per_turn
    assert per_turn["write"] == 3, per_turn
    assert notices == [f"{notices[0].rpartition(' ')[0]} {session_id}"] * kinds["write"], (
        notices, per_turn)
    # Besides the job's fetches (their number depends on when the wake-ups come): the 3
    # reads, 3 writes, the defer, the lock, its release and the job's finish, and at most
    # one pool liveness check (13 with the NOTIFY statements)
    rest = sum(count for kind, count in per_turn.items() if kind != "fetch")
    assert rest <= 10 + 1 / TURNS, per_turn
