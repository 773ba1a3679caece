"""The PostgreSQL session storage (:class:`PostgresStorage`) and its ``sessionPersistence``.

Same seam and semantics as the JSONL backend (D7, D12); the write
handle, admission, the 200 ms window and the serialized drain are the session
layer's (:mod:`dsh_host._persistence.storage` is the interface implemented here).
What differs is where the guarantees come from:

* **Durability.** A batch is one autocommit ``INSERT`` (the first one also
  inserts the header, through a CTE) on a connection started with
  ``synchronous_commit=on``: when the statement returns, the WAL is flushed. The
  statement is the whole transaction, so a failed batch leaves nothing behind
  and nothing needs rolling back.
* **Contiguity.** The primary key ``(session_id, seq)`` and the self-referencing
  ``events_prev_fkey`` make the database refuse any seq other than the stored
  next one (see ``_schema``). The handle still checks contiguity at ``append``,
  so a bad batch is refused before it is buffered.
* **Single writer.** ``open(id, "write")`` (and, for ``create``, the first
  materialization) takes ``pg_try_advisory_lock(key)`` on a connection of its
  own (the lease), and every batch of that lease is written on that same
  connection. A batch can therefore only commit while the lock is held: if the
  connection drops, the lock is gone *and* the lease can no longer write. The
  storage then raises :class:`SessionOwnershipLostError` and the host refuses
  further writes; it never reconnects, because another worker may already own
  the session.
* **Crash repair** is the reader's, exactly as with JSONL: storage returns the
  stored rows; ``inspect`` adds closers in memory; a resumer appends them.
  There are no torn tails: a crash loses only what was never committed.

All database calls are blocking psycopg calls on worker threads (see ``_pool``).
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
import msgspec
import psycopg
from psycopg import sql

from dsh_host.sdk import (
    ArtifactLocation,
    Pending,
    PersistenceService,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionEvent,
    SessionHandleClosedError,
    SessionHeader,
    SessionListing,
    SessionLoad,
    SessionNotFoundError,
    SessionOwnershipLostError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionWriteError,
    Spawn,
    UnreadableListing,
    decode_stored_header,
    decode_stored_rows,
    encode_json,
    pack_stored_rows,
)

from ._pool import ConnectionPool, connect, describe_dsn, usable, writer_conninfo
from ._schema import EventStorage, SchemaInfo, advisory_key, ensure_schema

__all__ = [
    "PostgresLease",
    "PostgresSessionPersistence",
    "PostgresStorage",
    "SessionStoreUnavailableError",
]

_log = logging.getLogger("dsh.session-persistence-postgres")

T = TypeVar("T")

#: How long a refused ``pg_try_advisory_lock`` is retried before reporting the owner.
#: A writer whose process died holds its lock until PostgreSQL notices the closed
#: socket and ends its session — measured at up to 8 ms after SIGKILL on a local
#: server. Without this grace a supervisor that restarts a crashed worker at once
#: would be told the dead worker still owns the session. A live owner is still
#: reported after this short, fixed delay; nobody queues for a lock.
LOCK_SETTLE_SECONDS: Final = 0.1
#: Rows a whole read fetches per statement (D37: the log's rows are never held at once).
_PAGE: Final = 1024


# --------------------------------------------------------------------------- headers


def _header_text(header: SessionHeader) -> str:
    return msgspec.json.encode(header.to_json()).decode("utf-8")


class SessionStoreUnavailableError(SessionPersistenceError):
    """PostgreSQL cannot be reached (connection refused, dropped, timed out).

    The message names the server (without the password) and the schema. Nothing
    was written by the failed call; buffered events stay buffered.
    """

    code = "SESSION_STORE_UNAVAILABLE"


# --------------------------------------------------------------------------- the lease


class PostgresLease:
    """What the storage holds for one owned session: the connection carrying its lock."""

    __slots__ = ("conn", "lost", "session_id")

    def __init__(self, session_id: str, conn: psycopg.Connection[Any]) -> None:
        self.session_id = session_id
        self.conn: psycopg.Connection[Any] | None = conn
        #: The connection dropped under a write: the lock is gone with it.
        self.lost = False

    @property
    def backend_pid(self) -> int | None:
        """PID of the PostgreSQL backend holding this lease's lock (None once released)."""
        conn = self.conn
        if conn is None or conn.closed:
            return None
        return int(conn.info.backend_pid)


# --------------------------------------------------------------------------- the service


class PostgresStorage:
    """Session logs in PostgreSQL, shared by every process that uses the same schema.

    A :class:`~dsh_host._persistence.storage.SessionStorage`. ``pool_size`` bounds
    the connections used for reads, listing and creation; each owned session
    holds one more connection of its own (the one carrying its lock), and up
    to ``pool_size`` of those are kept, unlocked, for the next writer.
    """

    name = "session-persistence-postgres"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "dsh",
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        storage: EventStorage = "text",
    ) -> None:
        if not schema:
            raise ValueError("schema must be a non-empty PostgreSQL schema name")
        if storage not in ("text", "jsonb"):
            raise ValueError(f'storage must be "text" or "jsonb", got {storage!r}')
        self.dsn_description = describe_dsn(dsn)
        self.schema = schema
        self._storage: EventStorage = storage
        self._conninfo = writer_conninfo(dsn, connect_timeout=connect_timeout)
        self.pool = ConnectionPool(self._conninfo, pool_size)
        self._info: SchemaInfo | None = None
        self._schema_lock = anyio.Lock()
        #: Writer connections whose lock was released, kept for the next writer.
        self._spare_writers: list[psycopg.Connection[Any]] = []
        self._closed = False
        s = sql.Identifier(schema)
        cast = sql.SQL("::jsonb" if storage == "jsonb" else "")
        self.sql_insert_events = sql.SQL(
            "INSERT INTO {s}.events (session_id, seq, event) "
            "SELECT %s, t.seq, t.event{cast} FROM unnest(%s::bigint[], %s::text[]) AS t(seq, event)"
        ).format(s=s, cast=cast)
        self.sql_publish = sql.SQL(
            "WITH header AS (INSERT INTO {s}.sessions (id, header, created_at) "
            "VALUES (%s, %s, %s)) "
            "INSERT INTO {s}.events (session_id, seq, event) "
            "SELECT %s, t.seq, t.event{cast} FROM unnest(%s::bigint[], %s::text[]) AS t(seq, event)"
        ).format(s=s, cast=cast)
        # The header and the first page of events in one statement (one round trip, one
        # snapshot): the header's row has no seq and sorts first; no row at all is a session
        # not stored. A whole read fetches any further pages with _sql_events
        # (docs/decisions.md D45).
        self._sql_first = sql.SQL(
            "SELECT * FROM (SELECT NULL::bigint AS seq, header AS body FROM {s}.sessions "
            "WHERE id = %s UNION ALL (SELECT seq, event::text FROM {s}.events "
            "WHERE session_id = %s AND seq >= %s ORDER BY seq LIMIT %s)) AS r "
            "ORDER BY seq NULLS FIRST"
        ).format(s=s)
        self._sql_events = sql.SQL(
            "SELECT seq, event::text FROM {s}.events WHERE session_id = %s AND seq >= %s "
            "ORDER BY seq LIMIT %s"  # LIMIT NULL: all of them
        ).format(s=s)
        self._sql_exists = sql.SQL("SELECT 1 FROM {s}.sessions WHERE id = %s").format(s=s)
        self._sql_list = sql.SQL(
            "SELECT s.id, s.header, COALESCE((SELECT e.seq FROM {s}.events e "
            "WHERE e.session_id = s.id ORDER BY e.seq DESC LIMIT 1) + 1, 0) "
            "FROM {s}.sessions s ORDER BY s.created_at, s.id"
        ).format(s=s)
        self._sql_count = sql.SQL(
            "SELECT COALESCE((SELECT e.seq FROM {s}.events e "
            "WHERE e.session_id = s.id ORDER BY e.seq DESC LIMIT 1) + 1, 0) "
            "FROM {s}.sessions s WHERE s.id = %s"
        ).format(s=s)

        # Every followed session's next seq in one statement (the server's idle poll, D47):
        # each a backward index scan of its rows' primary key, the same look-up as _sql_count.
        self._sql_ends = sql.SQL(
            "SELECT s.id, COALESCE((SELECT e.seq FROM {s}.events e "
            "WHERE e.session_id = s.id ORDER BY e.seq DESC LIMIT 1) + 1, 0) "
            "FROM {s}.sessions s WHERE s.id = ANY(%s)"
        ).format(s=s)

    # -- plumbing

    @property
    def info(self) -> SchemaInfo:
        if self._info is None:
            raise RuntimeError("schema not loaded yet")  # pragma: no cover - internal misuse
        return self._info

    async def ensure_schema(self) -> SchemaInfo:
        """Create or migrate the schema on first use (once per instance)."""
        if self._info is not None:
            return self._info
        async with self._schema_lock:
            if self._info is None:
                storage = self._storage
                self._info = await self._db(lambda conn: ensure_schema(conn, self.schema, storage))
        return self._info

    def _unavailable(self, error: BaseException) -> SessionStoreUnavailableError:
        return SessionStoreUnavailableError(
            f"cannot reach PostgreSQL ({self.dsn_description}, schema {self.schema}): "
            f"{str(error).strip()}"
        )

    def _db_error(self, error: psycopg.Error) -> SessionPersistenceError:
        if isinstance(error, psycopg.OperationalError):
            return self._unavailable(error)
        return SessionPersistenceError(
            f"PostgreSQL refused a session-store query ({self.dsn_description}, schema "
            f"{self.schema}): {str(error).strip()}"
        )

    async def _db(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn(conn)`` on a pooled connection; database errors become typed errors."""
        try:
            return await self.pool.run(fn)
        except psycopg.Error as error:
            raise self._db_error(error) from error

    def lock_key(self, session_id: str) -> int:
        return advisory_key("dsh-session", self.info.store_id, session_id)

    def revision(self, count: int) -> str:
        """Opaque revision: the store and the number of stored events (the log only grows)."""
        return f"pg:{self.info.store_id}:{count}"

    def locate_id(self, session_id: str) -> str:
        return f"{self.schema}.events#{session_id}"

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """Where this session's rows live (no I/O)."""
        sid = header.id if isinstance(header, SessionHeader) else str(header["id"])
        return ArtifactLocation("postgres", self.locate_id(sid))

    def take_writer(self) -> psycopg.Connection[Any] | None:
        """A spare writer connection (no lock held), or None: the caller connects anew."""
        while self._spare_writers:
            conn = self._spare_writers.pop()
            if usable(conn):
                return conn
            conn.close()
        return None

    async def give_back_writer(self, conn: psycopg.Connection[Any]) -> None:
        """Release the connection's advisory lock and keep it for the next writer.

        Reconnecting costs a server process fork and authentication (several
        milliseconds, most of a resume); unlocking costs one round trip. A
        connection that cannot be unlocked cleanly is closed, which releases
        its lock all the same.
        """

        def unlock() -> bool:
            try:
                conn.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                return False
            return True

        keep = (
            not self._closed
            and len(self._spare_writers) < self.pool.size
            and usable(conn)
            and await anyio.to_thread.run_sync(unlock)
            and usable(conn)
        )
        # Counted again after the unlock: writers given back at once all pass the first
        # count while their unlocks run, and kept every one of them (issue 42: six spares
        # for a pool of four under load; docs/decisions.md D40).
        if keep and not self._closed and len(self._spare_writers) < self.pool.size:
            self._spare_writers.append(conn)
        else:
            await anyio.to_thread.run_sync(conn.close)

    def lock_connection_sync(
        self, session_id: str, spare: psycopg.Connection[Any] | None = None
    ) -> psycopg.Connection[Any]:
        """A connection holding the session's advisory lock (blocking; worker thread).

        ``spare`` is a lock-free connection to reuse; if it has died meanwhile (or
        there is none) a new one is opened. Raises :class:`SessionAlreadyOwnedError`
        when another session holds the lock after the settle grace, and
        :class:`SessionStoreUnavailableError` when PostgreSQL cannot be reached.
        """
        key = self.lock_key(session_id)
        if spare is not None:
            try:
                return self._try_lock(spare, session_id, key)
            except psycopg.OperationalError:
                pass  # the spare died while idle (a server restart, say): connect anew
        try:
            return self._try_lock(connect(self._conninfo), session_id, key)
        except psycopg.OperationalError as error:
            raise self._unavailable(error) from error

    def _try_lock(
        self, conn: psycopg.Connection[Any], session_id: str, key: int
    ) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + LOCK_SETTLE_SECONDS
        try:
            while True:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                if row and row[0]:
                    return conn
                if time.monotonic() >= deadline:
                    break
                time.sleep(LOCK_SETTLE_SECONDS / 10)
        except BaseException:
            conn.close()
            raise
        conn.close()
        raise SessionAlreadyOwnedError(
            f'session "{session_id}" is being written by another process (its PostgreSQL '
            "advisory lock is held); ownership is never waited for — retry after that "
            "writer closes or exits"
        )

    # -- decoding

    def _decode_header(self, session_id: str, text: str) -> SessionHeader:
        return decode_stored_header(session_id, text, where=self.locate_id(session_id))

    def _decode_events(
        self, session_id: str, rows: Sequence[tuple[int, str]], first_seq: int
    ) -> list[SessionEvent]:
        return decode_stored_rows(session_id, rows, first_seq, where=self.locate_id(session_id))

    # -- reading

    def _fetch_sync(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        from_seq: int = 0,
        limit: int | None = None,
    ) -> tuple[SessionHeader, Sequence[SessionEvent]]:
        first_limit = _PAGE if limit is None else limit
        rows = conn.execute(
            self._sql_first, (session_id, session_id, from_seq, first_limit), prepare=True
        ).fetchall()
        if not rows or rows[0][0] is not None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        header = self._decode_header(session_id, rows[0][1])
        del rows[0]
        if limit is None:  # a whole read: page by page into a packed log (D37)
            where = self.locate_id(session_id)
            return header, pack_stored_rows(
                session_id, self._pages(conn, session_id, from_seq, rows), from_seq, where=where
            )
        return header, self._decode_events(session_id, rows, from_seq)

    def _pages(
        self,
        conn: psycopg.Connection[Any],
        session_id: str,
        from_seq: int,
        rows: list[tuple[int, str]],
    ) -> Iterator[tuple[int, str]]:
        """Every row from ``from_seq`` on, ``rows`` (the first page, read with the header)
        and then fetched :data:`_PAGE` at a time (a result holds only its page: the whole
        log's rows are never in memory at once)."""
        while True:
            yield from rows
            if len(rows) < _PAGE:
                return
            from_seq = rows[-1][0] + 1
            rows = conn.execute(
                self._sql_events, (session_id, from_seq, _PAGE), prepare=True
            ).fetchall()

    def _load(self, header: SessionHeader, events: Sequence[SessionEvent]) -> SessionLoad:
        return SessionLoad(
            header=header,
            events=events,
            revision=self.revision(len(events)),
            location=ArtifactLocation("postgres", self.locate_id(header.id)),
        )

    # -- the storage seam

    def encode(self, event: SessionEvent, wire: dict[str, Any] | None) -> bytes:
        return encode_json(event)

    async def check_new(self, header: SessionHeader) -> None:
        sid = header.id
        self._check_open()
        await self.ensure_schema()
        stored = await self._db(lambda conn: conn.execute(self._sql_exists, (sid,)).fetchone())
        if stored is not None:
            raise SessionAlreadyExistsError(
                f'session "{sid}" already has a persisted log in PostgreSQL '
                f"({self.locate_id(sid)}); load/resume it instead of creating"
            )

    async def materialize(self, header: SessionHeader, batch: Sequence[Pending]) -> PostgresLease:
        """Take the lock on a connection of its own, then insert header + batch (one CTE)."""
        self._check_open()
        await self.ensure_schema()
        spare = self.take_writer()
        conn = await anyio.to_thread.run_sync(self.lock_connection_sync, header.id, spare)
        lease = PostgresLease(header.id, conn)
        try:
            await anyio.to_thread.run_sync(self._write_sync, lease, batch, header)
        except BaseException:
            await self.release(lease)  # never keep a lock on a session that is not ours
            raise
        return lease

    async def acquire(self, session_id: str) -> tuple[PostgresLease, SessionLoad]:
        """Take the advisory lock (or fail at once), then read the whole log under it."""
        self._check_open()
        await self.ensure_schema()
        try:
            conn, header, events = await anyio.to_thread.run_sync(
                self._open_write_sync, session_id, self.take_writer()
            )
        except psycopg.Error as error:
            raise self._db_error(error) from error
        return PostgresLease(session_id, conn), self._load(header, events)

    def _open_write_sync(
        self, session_id: str, spare: psycopg.Connection[Any] | None
    ) -> tuple[psycopg.Connection[Any], SessionHeader, Sequence[SessionEvent]]:
        # Lock first, then read: once the lock is ours nobody else can append,
        # so what we read is the whole log.
        conn = self.lock_connection_sync(session_id, spare)
        try:
            header, events = self._fetch_sync(conn, session_id)
        except BaseException:
            conn.close()  # ends the session, so the lock goes with it
            raise
        return conn, header, events

    async def append(self, lease: PostgresLease, batch: Sequence[Pending]) -> None:
        """One autocommit INSERT on the lease's own connection (nothing to repair)."""
        if batch:
            await anyio.to_thread.run_sync(self._write_sync, lease, batch, None)

    def _write_sync(
        self, lease: PostgresLease, batch: Sequence[Pending], publish: SessionHeader | None
    ) -> None:
        """Insert ``batch`` (with the header row when ``publish``) in one transaction."""
        conn = lease.conn
        sid = lease.session_id
        seqs = [p.seq for p in batch]
        texts = [p.json.decode("utf-8") for p in batch]
        try:
            if conn is None or lease.lost:
                raise psycopg.OperationalError("the connection holding the lock was released")
            if publish is None:
                conn.execute(self.sql_insert_events, (sid, seqs, texts), prepare=True)
            else:
                conn.execute(
                    self.sql_publish,
                    (sid, _header_text(publish), publish.created_at, sid, seqs, texts),
                )
        except psycopg.errors.UniqueViolation as error:
            # Publishing: any existing row (header or event; the CTE's order of checks is
            # not defined) means someone else stored this id first.
            if publish is not None:
                raise SessionAlreadyExistsError(
                    f'session "{sid}" already has a persisted log in PostgreSQL '
                    f"({self.locate_id(sid)}); load/resume it instead of creating"
                ) from None
            raise self._lost_error(
                lease,
                f"seq {seqs[0] if seqs else '?'} is already stored — another writer wrote "
                "this session",
                seqs,
            ) from error
        except psycopg.errors.ForeignKeyViolation as error:
            # Our batch starts at the stored next seq of a published session, so a missing
            # predecessor or header means rows were removed behind the append-only triggers.
            raise SessionPersistenceCorruptionError(
                f'stored session "{sid}" no longer holds what this handle wrote '
                f"({error.diag.constraint_name}: {error.diag.message_detail or error}); rows "
                "were removed outside dsh — reopen the session to see what is stored",
                path=self.locate_id(sid),
            ) from error
        except psycopg.Error as error:
            if conn is None or conn.closed or conn.broken:
                raise self._lost_error(lease, str(error).strip(), seqs) from error
            raise SessionWriteError(
                f'failed to store {len(batch)} event(s) of session "{sid}" in PostgreSQL '
                f"(nothing was written): {str(error).strip()}"
            ) from error

    def _lost_error(
        self, lease: PostgresLease, why: str, seqs: Sequence[int]
    ) -> SessionOwnershipLostError:
        lease.lost = True
        return SessionOwnershipLostError(
            f'session "{lease.session_id}": write ownership lost — {why}. Events from seq '
            f"{seqs[0] if seqs else 0} on are not known to be stored; this handle refuses "
            "further writes rather than "
            'risk two writers. Reopen the session with open(id, "write") to continue from what '
            "is really stored."
        )

    async def release(self, lease: PostgresLease) -> None:
        """Release the lock, keeping the connection for the next writer (a lost one closes)."""
        conn, lease.conn = lease.conn, None
        if conn is None:
            return
        if lease.lost:
            await anyio.to_thread.run_sync(conn.close)
        else:
            await self.give_back_writer(conn)

    async def load(self, session_id: str) -> SessionLoad:
        await self.ensure_schema()
        header, events = await self._db(lambda conn: self._fetch_sync(conn, session_id))
        return self._load(header, events)

    async def read_from(
        self, session_id: str, from_seq: int, limit: int | None = None
    ) -> tuple[SessionEvent, ...]:
        """Stored events with ``seq >= from_seq``, at most ``limit`` (only those rows are
        fetched)."""
        await self.ensure_schema()
        _header, events = await self._db(
            lambda conn: self._fetch_sync(conn, session_id, from_seq, limit)
        )
        return tuple(events)

    async def walked_tail(self, session_id: str) -> tuple[int | None, ArtifactLocation | None]:
        """After a walk of the log with :meth:`read_from` to its end: 0 (a table of rows has no
        torn tail: every stored event is a whole row) and where it is. ``dsh sessions verify``
        then reads the log in pages instead of whole (D33)."""
        return 0, ArtifactLocation("postgres", self.locate_id(session_id))

    async def current_revision(self, session_id: str) -> str | None:
        """The revision a read would report now (None: not stored): the last seq, no rows read."""
        await self.ensure_schema()
        row = await self._db(lambda conn: conn.execute(self._sql_count, (session_id,)).fetchone())
        return None if row is None else self.revision(int(row[0]))

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]:
        """Each stored session's next seq, one statement for all of them (D47); an id not
        stored is left out."""
        await self.ensure_schema()
        ids = list(session_ids)
        rows = await self._db(
            lambda conn: conn.execute(self._sql_ends, (ids,), prepare=True).fetchall()
        )
        return {str(sid): int(end) for sid, end in rows}

    async def held_by(self, session_id: str) -> str | None:
        """Who holds the session's write lock now, or None when nobody does.

        The writer's lock is a session-level advisory lock, so PostgreSQL itself lists its
        holder in ``pg_locks`` (a 64-bit key is stored as ``classid`` = its high and
        ``objid`` = its low 32 bits, ``objsubid`` 1). Reading that view takes no lock, so
        asking never makes a writer's ``pg_try_advisory_lock`` fail, unlike trying the
        lock. A writer whose process died holds it until the server notices the closed
        connection (milliseconds); until then it is reported held, as it still is.
        """
        await self.ensure_schema()
        key = self.lock_key(session_id) & 0xFFFF_FFFF_FFFF_FFFF

        def holder(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                "SELECT l.pid, a.application_name, a.client_addr::text FROM pg_locks l "
                "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND l.classid::bigint = %s AND l.objid::bigint = %s",
                (key >> 32, key & 0xFFFF_FFFF),
            ).fetchone()

        row = await self._db(holder)
        if row is None:
            return None
        pid, application, client = row
        who = f"PostgreSQL backend pid {pid}"
        if application:
            who += f", application {application!r}"
        if client:
            who += f", from {client}"
        return f"held by a live writer ({who})"

    async def list(
        self, unreadable: builtins.list[UnreadableListing] | None
    ) -> builtins.list[SessionListing]:
        """Every published session's header and revision (events are not read)."""
        await self.ensure_schema()
        rows = await self._db(lambda conn: conn.execute(self._sql_list).fetchall())
        out: list[SessionListing] = []
        for sid, text, count in rows:
            location = ArtifactLocation("postgres", self.locate_id(sid))
            try:
                header = self._decode_header(sid, text)
            except SessionPersistenceError as error:
                if unreadable is None:
                    raise
                unreadable.append(UnreadableListing(sid, location, error))
                continue
            out.append(
                SessionListing(header=header, revision=self.revision(int(count)), location=location)
            )
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise SessionHandleClosedError(f"{self.name} is closed")

    async def close(self) -> None:
        """Close the pool and the spare writer connections. Idempotent."""
        self._closed = True
        await self.pool.aclose()
        spares, self._spare_writers = self._spare_writers, []
        for conn in spares:
            await anyio.to_thread.run_sync(conn.close)


class PostgresSessionPersistence(PersistenceService[PostgresLease]):
    """The ``sessionPersistence`` service over :class:`PostgresStorage` (a named constructor).

    ``spawn`` starts a background task (``ctx.start_soon`` or a task group's
    ``start_soon``) for the 200 ms write-behind window; without it, buffered
    events wait for an explicit flush.
    """

    storage: PostgresStorage

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "dsh",
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        spawn: Spawn | None = None,
        logger: logging.Logger | None = None,
        storage: EventStorage = "text",
    ) -> None:
        super().__init__(
            PostgresStorage(
                dsn,
                schema=schema,
                pool_size=pool_size,
                connect_timeout=connect_timeout,
                storage=storage,
            ),
            spawn=spawn,
            logger=logger or _log,
        )

    async def ensure_schema(self) -> SchemaInfo:
        """Create or check the schema now (the plugin does at boot, to report a bad DSN)."""
        return await self.storage.ensure_schema()

    async def __aenter__(self) -> PostgresSessionPersistence:
        return self
