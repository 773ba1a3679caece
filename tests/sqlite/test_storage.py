"""What the SQLite storage adds to the shared contract: durability settings, files, ownership
lost under a live handle, a stale writer, a process killed inside its transaction, format gates
and the plugin row. Real files, real SQLite, real processes; nothing asserts on timing."""

from __future__ import annotations

import json
import signal
import sqlite3
import stat
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh_session_persistence_sqlite import SqliteSessionPersistence
from persistence.helpers import header, log, plain

from dsh_host import Row, open_host
from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionOwnershipLostError,
    SessionPersistenceError,
)
from dsh_host._session.events import event_to_builtins
from dsh_host.errors import BootError

pytestmark = pytest.mark.anyio


def db(tmp_path: Path) -> Path:
    return tmp_path / "store" / "sessions.sqlite3"


async def stored(path: Path, session_id: str) -> list[object]:
    backend = SqliteSessionPersistence(str(path))
    try:
        load = await (await backend.open(session_id, "read")).read()
    finally:
        await backend.aclose()
    return [plain(event_to_builtins(e)) for e in load.events]


async def test_commits_are_fsynced_wal_and_the_files_are_private(tmp_path: Path) -> None:
    path = db(tmp_path)
    backend = SqliteSessionPersistence(str(path))
    handle = await backend.create(header("dur"))
    handle.append(log(1))
    await handle.flush()
    writer = backend.storage._writer  # the connection every commit goes through
    assert writer is not None
    assert writer.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    await handle.close()
    await backend.aclose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert await stored(path, "dur") == plain(log(1))


async def test_a_symlink_in_place_of_the_database_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    path = db(tmp_path)
    path.parent.mkdir(mode=0o700)
    path.symlink_to(target)
    backend = SqliteSessionPersistence(str(path))
    with pytest.raises(SessionPersistenceError, match="is a symbolic link"):
        await backend.create(header("link"))
    await backend.aclose()
    assert target.read_bytes() == b"", "nothing was written through the link"


async def test_a_file_that_is_not_a_database_is_refused_with_its_name(tmp_path: Path) -> None:
    path = db(tmp_path)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"not a database, just some bytes that are long enough" * 40)
    backend = SqliteSessionPersistence(str(path))
    with pytest.raises(SessionPersistenceError, match=f'"{path}": cannot open it'):
        await backend.list()
    await backend.aclose()


async def test_replacing_the_lock_file_under_a_live_handle_loses_ownership(
    tmp_path: Path,
) -> None:
    path = db(tmp_path)
    backend = SqliteSessionPersistence(str(path))
    handle = await backend.create(header("lock"))
    handle.append(log(1)[:3])
    await handle.flush()
    locks = [Path(p) async for p in anyio.Path(f"{path}.locks").iterdir()]
    assert len(locks) == 1
    locks[0].unlink()
    locks[0].write_bytes(b"")  # someone "cleaned up": a second writer could lock this inode
    handle.append(log(1)[3:])
    with pytest.raises(SessionOwnershipLostError, match="removed or replaced"):
        await handle.flush()
    with pytest.raises(SessionOwnershipLostError):
        await handle.flush()  # refused again, without touching the store
    with pytest.raises(SessionOwnershipLostError):
        await handle.close()  # events it could not store are reported
    await backend.aclose()
    assert await stored(path, "lock") == plain(log(1)[:3]), "nothing written without ownership"


async def test_a_stale_writer_is_refused_before_it_writes(tmp_path: Path) -> None:
    """A row stored behind the owner's back (its lock bypassed): the owner's next batch is
    refused whole, inside its transaction, and nothing of it is stored."""
    path = db(tmp_path)
    events = log(1)
    backend = SqliteSessionPersistence(str(path))
    handle = await backend.create(header("stale"))
    handle.append(events[:2])
    await handle.flush()
    with sqlite3.connect(path) as other:
        other.execute(
            "INSERT INTO events (session_id, seq, event) VALUES ('stale', 2, ?)",
            (json.dumps(events[2]),),
        )
    handle.append(events[2:])
    with pytest.raises(SessionOwnershipLostError, match="another writer wrote this session"):
        await handle.flush()
    await handle.abandon()
    await backend.aclose()
    with sqlite3.connect(path) as check:
        (count,) = check.execute("SELECT count(*) FROM events").fetchone()
    assert count == 3, "the refused batch left no row"


KILLED_IN_TRANSACTION = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO events (session_id, seq, event) VALUES ('kill', 3, '{}')"
    )
    print("inside", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("anyio_backend", ["trio", "asyncio"])
async def test_a_process_killed_inside_its_transaction_stores_nothing_of_it(
    tmp_path: Path,
) -> None:
    path = db(tmp_path)
    events = log(1)
    backend = SqliteSessionPersistence(str(path))
    handle = await backend.create(header("kill"))
    handle.append(events[:3])
    await handle.close()
    child = await anyio.run_process(
        [sys.executable, "-c", KILLED_IN_TRANSACTION, str(path)], check=False
    )
    assert child.stdout == b"inside\n", child.stderr  # the control: it got that far
    assert child.returncode == -signal.SIGKILL
    writer = await backend.open("kill", "write")  # SQLite's write lock died with the child
    assert writer.next_seq == 3
    writer.append(events[3:])
    await writer.close()
    await backend.aclose()
    assert await stored(path, "kill") == plain(events)


async def test_a_newer_schema_is_refused_not_read(tmp_path: Path) -> None:
    path = db(tmp_path)
    backend = SqliteSessionPersistence(str(path))
    handle = await backend.create(header("new"))
    await handle.close()
    await backend.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    later = SqliteSessionPersistence(str(path))
    with pytest.raises(SessionFormatUnsupportedError, match="schema v99, newer than"):
        await later.list()
    await later.aclose()


async def test_the_row_takes_dsh_camel_case_keys_and_refuses_root_with_path(
    tmp_path: Path,
) -> None:
    config = {"path": str(db(tmp_path)), "journalMode": "wal", "busyTimeoutMs": 250}
    async with open_host(
        [Row(name="sessions"), Row(name="session-persistence-sqlite", config=config)]
    ) as host:
        storage = host.ctx.sessionPersistence.storage
        assert (storage.path, storage.busy_timeout_ms) == (str(db(tmp_path)), 250)
        session = host.ctx.sessions.create("row", meta={"cwd": "/p"})
        session.append("turn/start", {"turn": 1})
        await host.ctx.sessions.flush(session)
        assert host.ctx.sessionPersistence.root == str(db(tmp_path).parent)
    assert len(await stored(db(tmp_path), "row")) == 1
    both = {"root": str(tmp_path), "path": str(db(tmp_path))}
    with pytest.raises(BootError, match="not both"):
        async with open_host(
            [Row(name="sessions"), Row(name="session-persistence-sqlite", config=both)]
        ):
            pass


def sqlite_lock_path(path: Path, session_id: str) -> Path:
    import hashlib

    digest = hashlib.sha256(session_id.encode()).hexdigest()
    return Path(f"{path}.locks") / f"{digest}.lock"


async def test_a_fifo_planted_as_the_lock_file_is_refused_as_unsafe(tmp_path: Path) -> None:
    """The SQLite store locks through the host's one ``SessionLock`` (the sdk's owner of ``flock``),
    so a lock path that is not a regular file is refused exactly as the JSONL store refuses it,
    instead of being opened and locked."""
    import os

    from dsh_host.sdk import SessionLockUnsafeError

    path = db(tmp_path)
    backend = SqliteSessionPersistence(str(path))
    try:
        handle = await backend.create(header("first"))  # creates the database and lock dir
        await handle.close()
        fifo = sqlite_lock_path(path, "fifo")
        os.mkfifo(fifo)
        planted = await backend.create(header("fifo"))
        planted.append(log(1)[:3])
        with anyio.fail_after(30), pytest.raises(SessionLockUnsafeError, match="not a regular"):
            await planted.flush()  # the session is materialized, and locked, at its first barrier
        with pytest.raises(SessionLockUnsafeError):
            await planted.close()
        assert stat.S_ISFIFO(os.stat(fifo, follow_symlinks=False).st_mode)
    finally:
        await backend.aclose()


async def test_a_second_writer_is_told_which_process_holds_the_session(tmp_path: Path) -> None:
    import os

    from dsh_host.sdk import SessionAlreadyOwnedError

    path = db(tmp_path)
    first = SqliteSessionPersistence(str(path))
    second = SqliteSessionPersistence(str(path))
    try:
        handle = await first.create(header("held"))
        handle.append(log(1)[:3])
        await handle.flush()
        holder = f"held by a live writer \\(pid {os.getpid()}\\)"
        with pytest.raises(SessionAlreadyOwnedError, match=holder):
            await second.open("held", "write")
        await handle.close()
    finally:
        await first.aclose()
        await second.aclose()
