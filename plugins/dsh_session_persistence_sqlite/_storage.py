"""Session logs in one SQLite file: the storage seam's worked example (docs/storage.md).

Everything the ``sessionPersistence`` service promises beyond storage —
admission, the 200 ms window, the flush barrier, poisoning, one write handle
per id, live-session binding — is the host's
(:class:`~dsh_host._persistence.backend.PersistenceService`). This module only
stores:

* **Durability.** The database runs in WAL mode with ``synchronous=FULL``
  (both read back after they are set): a ``COMMIT`` returns once the WAL is
  fsynced. A batch is one ``BEGIN IMMEDIATE … COMMIT`` transaction, so it is
  stored whole or not at all; a crash mid-batch leaves the previous commit.
* **Contiguity.** ``PRIMARY KEY (session_id, seq)`` refuses a seq stored
  twice, and each append first checks, inside its transaction, that the
  stored log ends right before the batch (a stale writer is refused before
  anything changes).
* **Single writer.** SQLite's own lock is per transaction, not per session,
  so ownership is an ``flock`` on a sidecar file per session
  (``<db>.locks/<sha256(id)>.lock``), taken without waiting. The kernel drops
  it when the owner's process dies, SIGKILL included. Replacing or removing
  the lock file under a live owner is noticed at its next write
  (:class:`SessionOwnershipLostError`).
* **Threads.** Every SQLite call runs on a worker thread
  (``anyio.to_thread.run_sync``) over one writer and one reader connection,
  each used by one thread at a time, so the storage runs under asyncio and trio.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import sqlite3
import stat
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar

import anyio
import anyio.to_thread
import msgspec

from dsh_host.sdk import (
    ArtifactLocation,
    Pending,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionFormatUnsupportedError,
    SessionHandleClosedError,
    SessionHeader,
    SessionListing,
    SessionLoad,
    SessionLock,
    SessionNotFoundError,
    SessionOwnershipLostError,
    SessionPersistenceError,
    SessionWriteError,
    UnreadableListing,
    decode_stored_header,
    decode_stored_rows,
    encode_json,
    pack_stored_rows,
)

__all__ = ["SCHEMA_VERSION", "JournalMode", "SqliteLease", "SqliteStorage"]

T = TypeVar("T")

#: The version of the tables below (``meta.schema_version``); a newer one is refused.
SCHEMA_VERSION: Final = 1

JournalMode = Literal["wal", "delete", "truncate", "persist"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    header TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    seq INTEGER NOT NULL CHECK (seq >= 0),
    event TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT, WITHOUT ROWID;
"""


class SqliteLease:
    """What the storage holds for one owned session: its ``flock``ed lock file."""

    __slots__ = ("lock", "next_seq", "session_id")

    def __init__(self, session_id: str, lock: SessionLock, next_seq: int) -> None:
        self.session_id = session_id
        #: The held lock (``SessionLock``, the host's one ``flock`` owner); released on close.
        self.lock = lock
        #: How many events are stored (the seq the next batch starts at).
        self.next_seq = next_seq


class SqliteStorage:
    """Session logs in the SQLite database at ``path`` (created, mode 0600, on first use)."""

    name = "session-persistence-sqlite"

    def __init__(
        self,
        path: str,
        *,
        journal_mode: JournalMode = "wal",
        busy_timeout_ms: int = 5000,
    ) -> None:
        if journal_mode not in ("wal", "delete", "truncate", "persist"):
            raise ValueError(
                f"journal_mode must be wal, delete, truncate or persist, got {journal_mode!r}"
            )
        self.path = os.path.abspath(os.path.expanduser(path))
        #: The directory holding the database and its lock files (D15 checks it).
        self.root = os.path.dirname(self.path)
        self.lock_dir = f"{self.path}.locks"
        self.journal_mode = journal_mode
        self.busy_timeout_ms = busy_timeout_ms
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._writer_lock = threading.Lock()
        self._reader_lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._store_id = ""
        self._closed = False

    # -- connections (worker threads only)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,  # autocommit: transactions are explicit
            check_same_thread=False,  # one thread at a time, under _writer_lock/_reader_lock
        )
        try:
            conn.execute(f"PRAGMA journal_mode={self.journal_mode}")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA trusted_schema=OFF")
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            if mode != self.journal_mode or synchronous != 2:
                raise SessionPersistenceError(
                    f'SQLite session store "{self.path}" runs journal_mode={mode}, '
                    f"synchronous={synchronous} after asking for {self.journal_mode} and FULL (2); "
                    "its file system may not support it — put the database on a local disk"
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_file(self) -> None:
        """The directory (0700) and the database file (0600), never through a symlink (D20)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        try:
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise SessionPersistenceError(
                    f'SQLite session store "{self.path}" is a symbolic link; refusing to open it '
                    "— point config.path at the database file itself"
                ) from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SessionPersistenceError(
                    f'SQLite session store "{self.path}" is not a regular file'
                )
        finally:
            os.close(fd)
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)  # the new file's name survives power loss
        finally:
            os.close(dir_fd)

    def _ensure_open(self) -> None:
        """Open both connections and create or check the schema, once."""
        with self._open_lock:
            if self._closed:
                raise SessionHandleClosedError(f"{self.name} is closed")
            if self._writer is not None:
                return
            try:
                self._create_file()
            except OSError as error:
                raise SessionPersistenceError(
                    f'SQLite session store "{self.path}" cannot be created: '
                    f"{error.strerror or error}; point the row's `root` (or --root) at a "
                    "directory you can write"
                ) from None
            try:
                writer = self._connect()
            except sqlite3.Error as error:
                raise self._error("cannot open it", error) from error
            try:
                self._store_id = self._migrate(writer)
                reader = self._connect()
            except sqlite3.Error as error:
                writer.close()
                raise self._error("cannot open it", error) from error
            except BaseException:
                writer.close()
                raise
            self._writer, self._reader = writer, reader

    def _migrate(self, conn: sqlite3.Connection) -> str:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            version = int(rows.get("schema_version", SCHEMA_VERSION))
            if version > SCHEMA_VERSION:
                raise SessionFormatUnsupportedError(
                    f'SQLite session store "{self.path}" has schema v{version}, newer than the '
                    f"v{SCHEMA_VERSION} this harness reads: upgrade the harness to open it",
                    location=self.path,
                )
            store_id = rows.get("store_id") or uuid.uuid4().hex
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?), "
                "('store_id', ?)",
                (str(SCHEMA_VERSION), store_id),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return store_id

    def _error(self, what: str, error: sqlite3.Error) -> SessionPersistenceError:
        return SessionPersistenceError(
            f'SQLite session store "{self.path}": {what}: {error} (is it an SQLite database '
            "this harness wrote, on a local disk?)"
        )

    async def _run(
        self, lock: Literal["reader", "writer"], fn: Callable[[sqlite3.Connection], T]
    ) -> T:
        """``fn(conn)`` on a worker thread, holding that connection for the call.

        SQLite errors that ``fn`` does not turn into seam errors itself become
        :class:`SessionPersistenceError` naming the database.
        """

        def call() -> T:
            self._ensure_open()
            guard, conn = (
                (self._writer_lock, self._writer)
                if lock == "writer"
                else (self._reader_lock, self._reader)
            )
            assert conn is not None
            with guard:
                try:
                    return fn(conn)
                except sqlite3.Error as error:
                    raise self._error("a query failed", error) from error

        return await anyio.to_thread.run_sync(call)

    # -- names

    def where(self, session_id: str) -> str:
        return f"{self.path}#{session_id}"

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        sid = header.id if isinstance(header, SessionHeader) else str(header["id"])
        return ArtifactLocation("sqlite", self.where(sid))

    def _revision(self, count: int) -> str:
        return f"sqlite:{self._store_id}:{count}"

    # -- ownership: an flock per session that dies with the process

    def _lock_path(self, session_id: str) -> str:
        digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
        return os.path.join(self.lock_dir, f"{digest}.lock")

    def _lock(self, session_id: str) -> SessionLock:
        """Own ``session_id`` now (the same ``flock`` rules as every file-backed store,
        :class:`SessionLock`) or raise :class:`SessionAlreadyOwnedError`."""
        try:
            os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        except OSError as error:
            raise SessionPersistenceError(
                f'session "{session_id}": cannot create the lock directory "{self.lock_dir}": '
                f"{error.strerror or error}"
            ) from None
        try:
            return SessionLock.acquire_file(self._lock_path(session_id), session_id)
        except OSError as error:  # SessionLock's own refusals are not OSErrors
            raise SessionPersistenceError(
                f'session "{session_id}": cannot open its lock file '
                f'"{self._lock_path(session_id)}": {error.strerror or error}'
            ) from None

    # -- the storage seam

    def encode(self, event: SessionEvent, wire: dict[str, Any] | None) -> bytes:
        return encode_json(event)

    async def check_new(self, header: SessionHeader) -> None:
        sid = header.id

        def exists(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone()
            return row is not None

        if await self._run("reader", exists):
            raise SessionAlreadyExistsError(
                f'session "{sid}" already has a persisted log in SQLite ({self.where(sid)}); '
                "load/resume it instead of creating"
            )

    async def materialize(self, header: SessionHeader, batch: Sequence[Pending]) -> SqliteLease:
        """Lock the session, then insert header + batch in one transaction."""
        sid = header.id
        header_json = encode_json_header(header)
        rows = [(sid, p.seq, p.json.decode("utf-8")) for p in batch]

        def publish(conn: sqlite3.Connection) -> SqliteLease:
            lease = SqliteLease(sid, self._lock(sid), 0)
            try:
                with self._transaction(conn, lease, rows):
                    try:
                        conn.execute(
                            "INSERT INTO sessions (id, header, created_at) VALUES (?, ?, ?)",
                            (sid, header_json, header.created_at),
                        )
                    except sqlite3.IntegrityError:
                        raise SessionAlreadyExistsError(
                            f'session "{sid}" already has a persisted log in SQLite '
                            f"({self.where(sid)}); load/resume it instead of creating"
                        ) from None
                    conn.executemany(
                        "INSERT INTO events (session_id, seq, event) VALUES (?, ?, ?)", rows
                    )
            except BaseException:
                self._unlock(lease)
                raise
            lease.next_seq = len(rows)
            return lease

        return await self._run("writer", publish)

    async def acquire(self, session_id: str) -> tuple[SqliteLease, SessionLoad]:
        """Take the session's lock (or fail at once), then read its log under it."""

        def take(conn: sqlite3.Connection) -> tuple[SqliteLease, SessionLoad]:
            lease = SqliteLease(session_id, self._lock(session_id), 0)
            try:
                load = self._read_sync(conn, session_id)
            except BaseException:
                self._unlock(lease)
                raise
            lease.next_seq = len(load.events)
            return lease, load

        return await self._run("writer", take)

    async def append(self, lease: SqliteLease, batch: Sequence[Pending]) -> None:
        """One ``BEGIN IMMEDIATE`` transaction: check the stored tail, insert, commit (fsync)."""
        if not batch:
            return  # nothing to repair: a crash never leaves half a transaction
        rows = [(lease.session_id, p.seq, p.json.decode("utf-8")) for p in batch]

        def store(conn: sqlite3.Connection) -> None:
            lease.lock.check()
            with self._transaction(conn, lease, rows):
                (count,) = conn.execute(
                    "SELECT count(*) FROM events WHERE session_id = ?", (lease.session_id,)
                ).fetchone()
                if count != lease.next_seq:
                    raise SessionOwnershipLostError(
                        f'session "{lease.session_id}": write ownership lost — {count} event(s) '
                        f"are stored but this handle wrote {lease.next_seq}; another writer "
                        "wrote this session. Reopen it to continue from what is really stored."
                    )
                conn.executemany(
                    "INSERT INTO events (session_id, seq, event) VALUES (?, ?, ?)", rows
                )
            lease.next_seq += len(rows)

        await self._run("writer", store)

    @contextlib.contextmanager
    def _transaction(
        self, conn: sqlite3.Connection, lease: SqliteLease, rows: Sequence[tuple[str, int, str]]
    ) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; any failure rolls back and says nothing was stored."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            raise SessionWriteError(
                f'failed to store {len(rows)} event(s) of session "{lease.session_id}" in '
                f'"{self.path}" (nothing was written): {error}'
            ) from error
        try:
            yield
            conn.execute("COMMIT")
        except BaseException as failure:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as rollback:
                # A failed COMMIT may have failed its fsync: what reached the disk is unknown.
                raise SessionWriteError(
                    f'failed to store {len(rows)} event(s) of session "{lease.session_id}" in '
                    f'"{self.path}", and rolling back failed too: {failure}; rollback: {rollback}',
                    unknown_state=rollback,
                ) from failure
            if isinstance(failure, sqlite3.Error):
                raise SessionWriteError(
                    f'failed to store {len(rows)} event(s) of session "{lease.session_id}" in '
                    f'"{self.path}" (nothing was written): {failure}'
                ) from failure
            raise

    def _unlock(self, lease: SqliteLease) -> None:
        lease.lock.release()  # closing the descriptor drops the flock

    async def release(self, lease: SqliteLease) -> None:
        self._unlock(lease)

    # -- reads

    def _read_sync(
        self, conn: sqlite3.Connection, session_id: str, from_seq: int = 0,
        limit: int | None = None,
    ) -> SessionLoad:
        where = self.where(session_id)
        conn.execute("BEGIN")  # one snapshot for the header and the events
        try:
            row = conn.execute("SELECT header FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFoundError(f'session "{session_id}" not found')
            header = decode_stored_header(session_id, row[0], where=where)
            cursor = conn.execute(
                "SELECT seq, event FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq "
                "LIMIT ?",  # -1: all of them
                (session_id, from_seq, -1 if limit is None else limit),
            )
            events: Sequence[SessionEvent]
            if limit is None:  # a whole read: row by row into a packed log (D37)
                events = pack_stored_rows(session_id, cursor, from_seq, where=where)
            else:
                events = tuple(decode_stored_rows(session_id, cursor, from_seq, where=where))
        finally:
            conn.execute("COMMIT")
        return SessionLoad(
            header=header,
            events=events,
            revision=self._revision(from_seq + len(events)),
            location=ArtifactLocation("sqlite", where),
        )

    async def load(self, session_id: str) -> SessionLoad:
        return await self._run("reader", lambda conn: self._read_sync(conn, session_id))

    async def read_from(
        self, session_id: str, from_seq: int, limit: int | None = None
    ) -> tuple[SessionEvent, ...]:
        """Only the rows from ``from_seq`` on are read (at most ``limit`` of them)."""
        load = await self._run(
            "reader", lambda conn: self._read_sync(conn, session_id, from_seq, limit)
        )
        return tuple(load.events)

    async def walked_tail(self, session_id: str) -> tuple[int | None, ArtifactLocation | None]:
        """After a walk of the log with :meth:`read_from` to its end: 0 (a table of rows has no
        torn tail: every stored event is a whole row) and where it is. ``dsh sessions verify``
        then reads the log in pages instead of whole (D33)."""
        return 0, ArtifactLocation("sqlite", self.where(session_id))

    async def current_revision(self, session_id: str) -> str | None:
        """The revision a read would report now (None: not stored): one count, no rows read."""

        def count(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT (SELECT count(*) FROM events e WHERE e.session_id = s.id) "
                "FROM sessions s WHERE s.id = ?",
                (session_id,),
            ).fetchone()

        row = await self._run("reader", count)
        return None if row is None else self._revision(int(row[0]))

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]:
        """Each stored session's next seq, one query per 500 ids, in one worker-thread call
        (D47): the largest seq is a look-up in the ``(session_id, seq)`` key, not a count."""
        ids = list(session_ids)

        def ends(conn: sqlite3.Connection) -> dict[str, int]:
            out: dict[str, int] = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                marks = ", ".join("?" * len(chunk))
                rows = conn.execute(
                    "SELECT s.id, COALESCE((SELECT max(e.seq) FROM events e "
                    f"WHERE e.session_id = s.id) + 1, 0) FROM sessions s WHERE s.id IN ({marks})",
                    chunk,
                ).fetchall()
                out.update((str(sid), int(end)) for sid, end in rows)
            return out

        return await self._run("reader", ends) if ids else {}

    async def list(
        self, unreadable: builtins.list[UnreadableListing] | None
    ) -> builtins.list[SessionListing]:
        def rows(conn: sqlite3.Connection) -> builtins.list[Any]:
            return conn.execute(
                "SELECT s.id, s.header, (SELECT count(*) FROM events e WHERE e.session_id = s.id) "
                "FROM sessions s ORDER BY s.created_at, s.id"
            ).fetchall()

        out: builtins.list[SessionListing] = []
        for sid, text, count in await self._run("reader", rows):
            location = ArtifactLocation("sqlite", self.where(sid))
            try:
                header = decode_stored_header(sid, text, where=location.path)
            except SessionPersistenceError as error:
                if unreadable is None:
                    raise
                unreadable.append(UnreadableListing(sid, location, error))
                continue
            out.append(SessionListing(header, self._revision(int(count)), location))
        return out

    async def close(self) -> None:
        def close() -> None:
            with self._open_lock, self._writer_lock, self._reader_lock:
                self._closed = True
                for conn in (self._writer, self._reader):
                    if conn is not None:
                        conn.close()
                self._writer = self._reader = None

        await anyio.to_thread.run_sync(close)


def encode_json_header(header: SessionHeader) -> str:
    """The stored header: the session core's JSON of it."""
    return msgspec.json.encode(header.to_json()).decode("utf-8")
