"""What is specific to PostgreSQL: the schema's own guarantees, ownership over connections,
durability settings, format gates, and the revision."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from dsh_session_persistence_postgres import SCHEMA_VERSION, SessionStoreUnavailableError
from dsh_session_persistence_postgres._pool import connect, describe_dsn, writer_conninfo
from persistence.helpers import ev, header, log, plain
from psycopg import sql

from dsh_host._persistence.persistence import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionFormatUnsupportedError,
    SessionOwnershipLostError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionWriteError,
    UnreadableListing,
)
from dsh_host._session.events import event_to_builtins

from .helpers import (
    backend,
    backend_alive,
    lock_pid,
    query,
    stored_rows,
    until,
    until_gone,
)

# both backends: sockets and worker threads
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


# --------------------------------------------------------------------------- schema


async def test_schema_is_created_once_and_versioned(pg_dsn: str, pg_schema: str) -> None:
    async def first_use() -> None:
        async with backend(pg_dsn, pg_schema) as b:
            await b.list()

    async with anyio.create_task_group() as tg:  # concurrent first users serialize
        for _ in range(4):
            tg.start_soon(first_use)
    meta = dict(
        query(pg_dsn, sql.SQL("SELECT key, value FROM {}").format(table(pg_schema, "meta")))
    )
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["event_storage"] == "text"
    assert len(meta["store_id"]) == 36


async def test_a_newer_schema_is_refused_with_upgrade_advice(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        await b.list()
    query(
        pg_dsn,
        sql.SQL("UPDATE {} SET value = '99' WHERE key = 'schema_version'").format(
            table(pg_schema, "meta")
        ),
    )
    async with backend(pg_dsn, pg_schema) as b:
        with pytest.raises(SessionFormatUnsupportedError, match=r"version 99, newer .* upgrade"):
            await b.list()


async def test_the_database_refuses_gaps_duplicates_and_mutation(
    pg_dsn: str, pg_schema: str
) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("db"))
        handle.append(log(1)[:3])
        await handle.close()
    events = table(pg_schema, "events")
    insert = sql.SQL("INSERT INTO {} (session_id, seq, event) VALUES ('db', %s, '{{}}')").format(
        events
    )
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="events_prev_fkey"):
        query(pg_dsn, insert, (4,))  # seq 3 is missing: a gap
    with pytest.raises(psycopg.errors.UniqueViolation, match="events_pkey"):
        query(pg_dsn, insert, (2,))  # seq 2 exists: a second writer of the same seq
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="events_session_fkey"):
        query(
            pg_dsn,
            sql.SQL("INSERT INTO {} (session_id, seq, event) VALUES ('nobody', 0, '{{}}')").format(
                events
            ),
        )
    for statement in (
        sql.SQL("UPDATE {} SET event = '{{}}' WHERE session_id = 'db'").format(events),
        sql.SQL("DELETE FROM {} WHERE session_id = 'db' AND seq = 2").format(events),
        sql.SQL("TRUNCATE {}").format(events),
        sql.SQL("UPDATE {} SET header = '{{}}'").format(table(pg_schema, "sessions")),
        sql.SQL("DELETE FROM {}").format(table(pg_schema, "sessions")),
    ):
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            query(pg_dsn, statement)
    assert [seq for seq, _ in stored_rows(pg_dsn, pg_schema, "db")] == [0, 1, 2]


async def test_text_storage_keeps_what_jsonb_cannot(pg_dsn: str, pg_prefix: str) -> None:
    """Lone surrogates and NUL are valid in a session log; jsonb refuses them (why text)."""
    odd = {"todos": [{"content": "nul \x00 and lone \ud800 surrogate", "status": "pending"}]}
    event = ev("todo/write", 0, odd)
    async with backend(pg_dsn, f"{pg_prefix}_text") as b:
        handle = await b.create(header("odd"))
        handle.append([event])
        await handle.flush()
        await handle.close()
        load = await (await b.open("odd", "read")).read()
        assert load.events[0].data.todos[0].content == odd["todos"][0]["content"]
    async with backend(pg_dsn, f"{pg_prefix}_jsonb", storage="jsonb") as b:
        handle = await b.create(header("odd"))
        handle.append([event])
        with pytest.raises(SessionWriteError, match="nothing was written"):
            await handle.flush()
        await handle.abandon()


# --------------------------------------------------------------------------- durability


def test_writer_connections_force_synchronous_commit(pg_dsn: str) -> None:
    dsn = pg_dsn + " options='-c synchronous_commit=off' password=hunter2"
    with connect(writer_conninfo(dsn, connect_timeout=5)) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SHOW application_name").fetchone() == (
            "dsh-session-persistence-postgres",
        )
    assert "hunter2" not in describe_dsn(dsn)


async def test_append_is_not_durable_until_flush(pg_dsn: str, pg_schema: str) -> None:
    events = log(2)
    async with backend(pg_dsn, pg_schema, spawn=None) as b:  # no window: only flush writes
        handle = await b.create(header("barrier"))
        handle.append(events[:4])
        assert stored_rows(pg_dsn, pg_schema, "barrier") == []  # not even the header
        await handle.flush()
        assert len(stored_rows(pg_dsn, pg_schema, "barrier")) == 4
        handle.append(events[4:])
        assert len(stored_rows(pg_dsn, pg_schema, "barrier")) == 4
        assert handle.durable_seq == 4 and handle.next_seq == len(events)
        await handle.flush()
        stored = [json.loads(text) for _, text in stored_rows(pg_dsn, pg_schema, "barrier")]
        assert stored == plain(events)


async def test_the_window_writes_without_a_flush(pg_dsn: str, pg_schema: str) -> None:
    events = log(1)
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("window"))
        handle.append(events)
        await until(lambda: handle.durable_seq == len(events))
        assert len(stored_rows(pg_dsn, pg_schema, "window")) == len(events)


# --------------------------------------------------------------------------- ownership


async def test_killing_the_lock_connection_poisons_the_handle(pg_dsn: str, pg_schema: str) -> None:
    events = log(2)
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("poison"))
        handle.append(events[:5])
        await handle.flush()
        pid = lock_pid(handle)
        assert pid is not None
        assert query(pg_dsn, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
        await until_gone(pg_dsn, pid)
        handle.append(events[5:7])  # accepted in memory: nothing has noticed yet
        with pytest.raises(SessionOwnershipLostError, match="write ownership lost"):
            await handle.flush()
        assert handle.lease is not None and handle.lease.lost
        with pytest.raises(SessionOwnershipLostError):
            handle.append(events[7:8])
        with pytest.raises(SessionOwnershipLostError):
            await handle.flush()
        # A new writer takes over at once and sees exactly what was committed.
        async with backend(pg_dsn, pg_schema) as other:
            successor = await other.open("poison", "write")
            assert successor.next_seq == 5
            successor.append(events[5:])
            await successor.close()
        # Closing the poisoned handle reports the events it could not store.
        with pytest.raises(SessionOwnershipLostError):
            await handle.close()
        assert handle.closed
    assert len(stored_rows(pg_dsn, pg_schema, "poison")) == len(events)


async def test_a_stale_writer_cannot_overwrite_a_seq(pg_dsn: str, pg_schema: str) -> None:
    """Even a writer whose lock was bypassed cannot write a seq twice: the key refuses it."""
    events = log(1)
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("stale"))
        handle.append(events[:2])
        await handle.flush()
        query(
            pg_dsn,
            sql.SQL("INSERT INTO {} (session_id, seq, event) VALUES ('stale', 2, %s)").format(
                table(pg_schema, "events")
            ),
            (json.dumps(events[2]),),
        )
        handle.append([events[2]])
        with pytest.raises(SessionOwnershipLostError, match="seq 2 is already stored"):
            await handle.flush()
        await handle.abandon()  # its seq 2 is not ours: nothing to drain


async def test_two_creators_of_one_id_one_wins(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as a, backend(pg_dsn, pg_schema) as b:
        first = await a.create(header("race"))
        second = await b.create(header("race"))  # neither is stored yet: both pass
        first.append(log(1)[:2])
        await first.flush()  # materializes and takes the lock
        second.append(log(1)[:1])
        with pytest.raises(SessionAlreadyOwnedError):
            await second.flush()
        await first.close()
        with pytest.raises(SessionAlreadyExistsError, match="already has a persisted log"):
            await second.flush()
        # The loser released the lock it took, so the winner's session is writable again.
        again = await a.open("race", "write")
        assert again.next_seq == 2
        await again.close()
        await second.abandon()


async def test_closing_the_handle_releases_the_lock(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("rel"))
        await handle.flush()
        pid = lock_pid(handle)
        assert pid is not None and backend_alive(pg_dsn, pid)
        await handle.close()
        assert lock_pid(handle) is None
        async with backend(pg_dsn, pg_schema) as other:
            await (await other.open("rel", "write")).close()


# --------------------------------------------------------------------------- reads


async def test_revisions_follow_the_stored_length_and_the_store(
    pg_dsn: str, pg_prefix: str
) -> None:
    revisions = []
    for store in ("one", "two"):
        async with backend(pg_dsn, f"{pg_prefix}_{store}") as b:
            handle = await b.create(header("rev"))
            handle.append(log(1))
            await handle.close()
            [listing] = await b.list()
            load = await (await b.open("rev", "read")).read()
            assert load.revision == listing.revision
            revisions.append(listing.revision)
    assert revisions[0] != revisions[1]  # same id and length, different stores
    async with backend(pg_dsn, f"{pg_prefix}_one") as b:
        writer = await b.open("rev", "write")
        writer.append([ev("turn/start", writer.next_seq, {"turn": 2})])
        await writer.close()
        assert (await b.list())[0].revision != revisions[0]


async def test_read_from_fetches_only_the_suffix(pg_dsn: str, pg_schema: str) -> None:
    events = log(2)
    async with backend(pg_dsn, pg_schema) as b:
        handle = await b.create(header("suffix"))
        handle.append(events)
        await handle.close()
        assert wire(await b.read_from("suffix", 0)) == plain(events)
        assert wire(await b.read_from("suffix", 3)) == plain(events[3:])
        assert await b.read_from("suffix", len(events)) == ()
        assert await b.read_from("suffix", 10_000) == ()
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="fromSeq must be a non-negative safe integer"):
                await b.read_from("suffix", bad)  # type: ignore[arg-type]


async def test_a_read_is_one_statement_per_page_the_header_with_the_first(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: a read took the header and then the events, two statements (two round
    trips) where one does; a queued turn reads its session ~5 times. Counted on the real
    connections: every statement a read sends, its result checked against the stored rows
    (a log of more than one page too, and a session that is not stored)."""
    page = 1024  # the backend's page of rows
    small = log(2)
    big = log(1)
    big += [ev("turn/start", len(big) + i, {"turn": 2 + i}) for i in range(page + 5 - len(big))]
    async with backend(pg_dsn, pg_schema) as b:
        for name, events in (("small", small), ("big", big)):
            handle = await b.create(header(name))
            handle.append(events)
            await handle.close()
        sent: list[str] = []
        execute = psycopg.Connection.execute

        def counted(self: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(str(query))
            return execute(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", counted)
        for name, events, statements in (("small", small, 1), ("big", big, 2)):
            sent.clear()
            load = await (await b.open(name, "read")).read()
            assert wire(load.events) == plain(events)
            assert len(sent) == statements, sent
            sent.clear()
            assert wire(await b.read_from(name, 3, limit=10)) == plain(events[3:13])
            assert len(sent) == 1, sent
        sent.clear()
        writer = await b.open("big", "write")  # the lock, then one statement a page
        assert writer.next_seq == len(big)
        await writer.close()
        assert len([q for q in sent if "advisory" not in q]) == 2, sent
        with pytest.raises(SessionPersistenceError, match="not found"):
            await b.read_from("nobody", 0, limit=10)


async def test_list_is_ordered_by_creation(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        for sid, created in (("late", 30), ("early", 10), ("middle", 20)):
            handle = await b.create({**header(sid), "createdAt": created})
            await handle.close()  # an empty close publishes nothing
            handle = await b.create({**header(sid + "-x"), "createdAt": created})
            await handle.flush()
            await handle.close()
        assert [item.header.id for item in await b.list()] == ["early-x", "middle-x", "late-x"]


async def test_stored_damage_and_foreign_formats_are_reported(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        for sid in ("future", "unknown", "broken", "bad-header"):
            handle = await b.create(header(sid))
            handle.append(log(1)[:2])
            await handle.close()
    sessions, events = table(pg_schema, "sessions"), table(pg_schema, "events")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(sessions))
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(events))
        conn.execute(
            sql.SQL(
                "UPDATE {} SET header = replace(header, '\"version\":3', '\"version\":4') "
                "WHERE id = 'future'"
            ).format(sessions)
        )
        conn.execute(
            sql.SQL("UPDATE {} SET header = '[1]' WHERE id = 'bad-header'").format(sessions)
        )
        conn.execute(
            sql.SQL(
                "UPDATE {} SET event = replace(event, 'user/message', 'future/thing') "
                "WHERE session_id = 'unknown'"
            ).format(events)
        )
        conn.execute(
            sql.SQL(
                "UPDATE {} SET event = '{{\"type\":' WHERE session_id = 'broken' AND seq = 1"
            ).format(events)
        )
    async with backend(pg_dsn, pg_schema) as b:
        where = f"{pg_schema}.events#"
        with pytest.raises(SessionFormatUnsupportedError, match=r"log format v4.*upgrade") as info:
            await b.open("future", "read")
        assert info.value.location == where + "future"
        with pytest.raises(
            SessionFormatUnsupportedError, match=r'event type "future/thing" \(seq 1\)'
        ):
            await b.open("unknown", "write")
        with pytest.raises(SessionPersistenceCorruptionError, match='stored session "broken"'):
            await b.inspect("broken")
        with pytest.raises(SessionPersistenceCorruptionError, match="not a JSON object"):
            await b.open("bad-header", "read")
        # A refused open(write) keeps no lock: a second attempt meets the same refusal,
        # not SessionAlreadyOwnedError.
        with pytest.raises(SessionFormatUnsupportedError, match="future/thing"):
            await b.open("unknown", "write")
        # Listing: the damaged headers fail it, or are reported beside the readable ones.
        with pytest.raises(SessionPersistenceError):
            await b.list()
        unreadable: list[UnreadableListing] = []
        listed = await b.list(unreadable=unreadable)
        assert sorted(i.header.id for i in listed) == ["broken", "unknown"]
        assert sorted(u.session_id for u in unreadable) == ["bad-header", "future"]


async def test_a_reused_writer_connection_holds_no_old_lock(pg_dsn: str, pg_schema: str) -> None:
    async with backend(pg_dsn, pg_schema) as b:
        first = await b.create(header("one"))
        await first.flush()
        pid = lock_pid(first)
        await first.close()  # unlocks; the connection is kept for the next writer
        assert pid is not None and backend_alive(pg_dsn, pid)
        second = await b.create(header("two"))
        await second.flush()
        assert lock_pid(second) == pid  # the same server session, reused
        async with backend(pg_dsn, pg_schema) as other:
            # ...which no longer holds the lock of "one".
            await (await other.open("one", "write")).close()
        await second.close()


async def test_an_unreachable_server_is_a_typed_error_without_the_password() -> None:
    dsn = "host=127.0.0.1 port=1 user=dsh dbname=nowhere password=hunter2"
    async with backend(dsn, "dsh", connect_timeout=2) as b:
        for call in (b.list, lambda: b.open("x", "read"), lambda: b.create(header("x"))):
            with pytest.raises(SessionStoreUnavailableError, match="port=1") as info:
                await call()
            assert "hunter2" not in str(info.value)


async def test_connections_killed_while_idle_are_replaced(pg_dsn: str, pg_schema: str) -> None:
    app = f"dsh-test-{uuid.uuid4().hex[:8]}"  # tells this backend's connections apart
    async with backend(f"{pg_dsn} application_name={app}", pg_schema) as b:
        first = await b.create(header("one"))
        first.append(log(1))
        await first.close()  # leaves an idle pooled connection and a spare writer connection
        pids = [
            row[0]
            for row in query(
                pg_dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
            )
        ]
        assert len(pids) >= 2
        for pid in pids:  # a server restart, an idle timeout, an operator's kill
            query(pg_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        for pid in pids:
            await until_gone(pg_dsn, pid)
        load = await (await b.open("one", "read")).read()  # retried on a new connection
        assert len(load.events) == len(log(1))
        writer = await b.open("one", "write")  # the dead spare is replaced
        assert lock_pid(writer) not in pids
        writer.append([ev("turn/start", writer.next_seq, {"turn": 2})])
        await writer.close()
    assert len(stored_rows(pg_dsn, pg_schema, "one")) == len(log(1)) + 1


async def test_writers_given_back_at_once_keep_at_most_pool_size_spares(
    pg_dsn: str, pg_schema: str
) -> None:
    """Issue 42: each writer given back counted the spares before its unlock round trip and
    was kept after it, so writers released together were all kept (a pool of four held six
    spare connections after six sessions closed at once)."""
    app = f"dsh-test-{uuid.uuid4().hex[:8]}"  # tells these connections apart
    dsn = f"{pg_dsn} application_name={app}"
    size = 2
    async with backend(dsn, pg_schema, pool_size=size) as b:
        conninfo = writer_conninfo(dsn, connect_timeout=10)
        writers = [await anyio.to_thread.run_sync(connect, conninfo) for _ in range(6)]
        async with anyio.create_task_group() as group:
            for conn in writers:
                group.start_soon(b.storage.give_back_writer, conn)


        def kept() -> list[tuple[Any, ...]]:
            return query(
                pg_dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
            )

        # a closed connection's backend leaves pg_stat_activity shortly after, not at once
        with anyio.move_on_after(20):
            while len(kept()) > size:  # noqa: ASYNC110 - polls PostgreSQL's state
                await anyio.sleep(0.1)
        assert len(kept()) == size, kept()
