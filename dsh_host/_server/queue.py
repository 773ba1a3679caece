"""Turn jobs in PostgreSQL (``dsh serve --queue``), on procrastinate.

Why procrastinate (not pgqueuer): a job's ``lock`` keeps the jobs of one session strictly
one at a time, its ``queueing_lock`` refuses a second queued job for the same session at the
database, workers heartbeat and stalled jobs (a worker that died mid-job) can be found and
retried, a running job can be asked to abort, and it runs on psycopg 3 like the PostgreSQL
persistence row. All of that is what a turn queue needs; none of it is ours.

A ``POST /sessions/{id}/turns`` defers one ``dsh.turn`` job (locked by the session id). Exactly
one worker takes it and runs the turn while holding the session's advisory lock (the write
handle of the persistence row). If that worker dies, procrastinate's heartbeat goes stale; every
worker looks for stalled jobs and retries them, and the next worker to take the job resumes the
session once PostgreSQL has released the dead connection's lock (until then the job is retried):
the resume repairs the interrupted turn as always (``TOOL_OUTCOME_UNKNOWN`` / ``NOT_STARTED``,
nothing replayed). With ``after_repair: stop`` the job ends there; with ``continue`` it runs a
new turn whose prompt (:data:`~.runtime.AFTER_REPAIR_PROMPT`) points the model at the repair.
Only asyncio: procrastinate and psycopg's async connections run on asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import weakref
from typing import Any, Final, TypeAlias

import anyio
import procrastinate
import psycopg
import psycopg_pool
from procrastinate.exceptions import AlreadyEnqueued, UniqueViolation
from psycopg import sql

from dsh_host._persistence.persistence import SessionAlreadyOwnedError

__all__ = [
    "JOB_POOL_MAX_SIZE",
    "JOB_POOL_MIN_SIZE",
    "ONE_TURN_AT_A_TIME",
    "TURN_INDEXES",
    "TURN_TASK",
    "TurnQueue",
]

log = logging.getLogger("dsh.server.queue")

TURN_TASK: Final = "dsh.turn"

#: The unique indexes through which PostgreSQL, not a process, decides which ``POST /turns``
#: of a session is accepted: the insert of the job is the decision, in the same statement.
#: procrastinate's ``queueing_lock`` allows one *queued* job per session, but a second one
#: may be queued as soon as the first is running, and both would carry the same turn number
#: (read from the log before either ran): two 202s for one turn, the second prompt never run.
#: So: at most one job per session queued *or running*, and each turn number of a session
#: is taken by one job only (a cancelled or failed job frees its number: its turn never ran
#: or is repaired by the next resume; a succeeded one keeps it).
TURN_INDEXES: Final = ("dsh_turn_one_active_per_session", "dsh_turn_one_job_per_turn")
ONE_TURN_AT_A_TIME: Final = (
    f"CREATE UNIQUE INDEX IF NOT EXISTS {TURN_INDEXES[0]} ON procrastinate_jobs (lock) "
    f"WHERE task_name = '{TURN_TASK}' AND status IN ('todo', 'doing')",
    f"CREATE UNIQUE INDEX IF NOT EXISTS {TURN_INDEXES[1]} ON procrastinate_jobs "
    f"(lock, (args->>'turn')) WHERE task_name = '{TURN_TASK}' "
    "AND status IN ('todo', 'doing', 'succeeded')",
)


#: The bounds of procrastinate's connection pool in each process (the API's defers and job
#: queries, the worker's fetches and heartbeats); its LISTEN connection is apart.
JOB_POOL_MIN_SIZE: Final = 1
JOB_POOL_MAX_SIZE: Final = 4

#: A pooled connection given back less than this many seconds ago is handed out again without
#: a liveness round trip (see :func:`_job_pool`).
RECENT_S: Final = 5.0


def _job_pool(**kwargs: Any) -> psycopg_pool.AsyncConnectionPool:
    """procrastinate's pool, with fewer round trips per job query.

    procrastinate checks every connection it borrows (an empty query) and runs each query in
    a transaction of its own (``BEGIN``, the query, ``COMMIT``): four round trips for one
    single-statement query. Its connections here are autocommit (each query is one statement:
    the same transaction, one round trip) and a connection given back less than
    :data:`RECENT_S` ago is not checked (one idle longer, which a server or a proxy may have
    closed meanwhile, still is, and is replaced when dead).
    """
    returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    async def check(conn: Any) -> None:
        if time.monotonic() - returned.get(conn, float("-inf")) >= RECENT_S:
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)

    async def configure(conn: Any) -> None:
        # Not ``autocommit`` in the pool's connection kwargs: procrastinate opens its LISTEN
        # connection with those kwargs plus its own ``autocommit=True``.
        await conn.set_autocommit(True)

    async def reset(conn: Any) -> None:
        returned[conn] = time.monotonic()

    return psycopg_pool.AsyncConnectionPool(
        **{**kwargs, "check": check, "configure": configure, "reset": reset}
    )


#: A flush announced on the relay: the session, and the seq after the last event the flush
#: stored (None: not known, the wake-up is for every stream of the session).
Flush: TypeAlias = tuple[str, int | None]


def _coalesce(sessions: dict[str, int | None], flush: Flush) -> None:
    """Fold one flush into the sessions of the next NOTIFY: one per session, in the order of
    its first flush, with the furthest end (none when a flush of it did not tell its end)."""
    session_id, end = flush
    if session_id not in sessions:
        sessions[session_id] = end
    else:
        known = sessions[session_id]
        sessions[session_id] = None if known is None or end is None else max(known, end)


def _payload(session_id: str, end: int | None) -> str:
    """A NOTIFY's payload: ``"<id> <end>"``, or ``"<id>"`` when the end is not known (a
    session id holds no space: ``SESSION_ID_PATTERN``, so :func:`_announced` splits it
    unambiguously; docs/decisions.md D51)."""
    return session_id if end is None else f"{session_id} {end}"


def _announced(payload: str) -> Flush:
    """The flush a NOTIFY's payload announces (:func:`_payload`; an older server's bare
    session id has no end)."""
    session_id, _, end = payload.partition(" ")
    return session_id, int(end) if end.isdigit() else None


class TurnQueue:
    """The procrastinate app of one server process: deferring jobs and running a worker."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        concurrency: int = 4,
        heartbeat: float = 2.0,
        stalled_after: float = 6.0,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.concurrency = concurrency
        self.heartbeat = heartbeat
        self.stalled_after = stalled_after
        options = f"-c search_path={schema}"
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(
                conninfo=dsn,
                kwargs={"options": options},
                min_size=JOB_POOL_MIN_SIZE,
                max_size=JOB_POOL_MAX_SIZE,
                pool_factory=_job_pool,
            )
        )
        self._runner: Any = None
        self._on_abort: Any = None
        #: the backend that sends this process's NOTIFYs (its own wake-ups are not relayed back)
        self._relay_pid: int | None = None

        @self.app.task(
            name=TURN_TASK,
            retry=procrastinate.RetryStrategy(
                max_attempts=1000, wait=1, retry_exceptions={SessionAlreadyOwnedError}
            ),
        )
        async def turn_job(
            session_id: str, kind: str, prompt: str | list[Any] | None, turn: int
        ) -> None:
            assert self._runner is not None, "the worker runs only inside a started runtime"
            # procrastinate aborts a job (an API cancel, the worker shutting down) by cancelling
            # its task. A turn is never cut off like that: the cancel is turned into the agent's
            # own cooperative cancel, and the job waits for the turn to end (turn/end written,
            # the session flushed and released) before it reports the abort.
            inner = asyncio.ensure_future(self._runner(session_id, kind, prompt, turn))
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                if inner.done():
                    raise
                self._on_abort(session_id)
                while not inner.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(inner)
                raise

        self._task = turn_job

    async def init_schema(self) -> None:
        """Create the queue's tables in ``schema`` once (serialized between workers)."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            key = f"dsh-serve-queue:{self.schema}"
            await conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
            try:
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                )
                found = await (await conn.execute(
                    "SELECT to_regclass(%s)", (f"{self.schema}.procrastinate_jobs",)
                )).fetchone()
                await conn.execute(
                    sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema))
                )
                if found is None or found[0] is None:
                    await conn.execute(self.app.schema_manager.get_schema())
                for statement in ONE_TURN_AT_A_TIME:
                    await conn.execute(sql.SQL(statement))
            finally:
                await conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))

    # ------------------------------------------------------------------ API side
    async def defer(
        self, session_id: str, kind: str, prompt: str | list[Any] | None, turn: int
    ) -> bool:
        """Queue one job for the session's turn ``turn`` (``prompt``: its text, or its content
        blocks as JSON when it carries attachments); False when PostgreSQL refuses it: the
        session has a job queued or running, or turn ``turn`` was taken by another job (the
        insert is the decision: see :data:`ONE_TURN_AT_A_TIME`)."""
        try:
            await self._task.configure(lock=session_id, queueing_lock=session_id).defer_async(
                session_id=session_id, kind=kind, prompt=prompt, turn=turn
            )
        except AlreadyEnqueued:
            return False
        except UniqueViolation as exc:
            if exc.constraint_name in TURN_INDEXES:
                return False
            raise
        return True

    async def busy_sessions(self) -> dict[str, str]:
        """Sessions with a job waiting (``queued``) or running (``running``), on any worker."""
        busy: dict[str, str] = {}
        for status, shown in (("todo", "queued"), ("doing", "running")):
            for job in await self.app.job_manager.list_jobs_async(task=TURN_TASK, status=status):
                if job.lock:
                    busy[job.lock] = shown
        return busy

    async def abort(self, session_id: str) -> bool:
        """Cancel the session's job: one still queued never starts (procrastinate marks it
        ``cancelled`` before any worker takes it: nothing of its turn is written), the worker
        running one is asked to cancel the turn. False when the session has no job."""
        done = False
        for status in ("doing", "todo"):
            jobs = await self.app.job_manager.list_jobs_async(
                task=TURN_TASK, status=status, lock=session_id
            )
            for job in jobs:
                if job.id is not None:
                    # abort=True covers both states, and a queued job taken meanwhile
                    cancel = self.app.job_manager.cancel_job_by_id_async
                    done = await cancel(job.id, abort=True) or done
        return done

    # ------------------------------------------------------------------ event wake-ups
    @property
    def channel(self) -> str:
        return f"dsh_serve_events:{self.schema}"

    async def relay_flushes(self, flushed: Any) -> None:
        """NOTIFY every worker of each session this process flushed (``flushed``: a receive
        stream of :data:`Flush`, the end being the seq after the last event the flush stored):
        their streams re-read the table at once instead of at the next poll. The flushes that
        queued up while a NOTIFY was on its way go out together, one notification per session
        carrying the furthest end, in one statement (a stream re-reads from its own cursor, so
        one wake-up after several flushes shows them all). The end lets a worker leave a
        stream that has read that far already asleep (docs/decisions.md D51)."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            self._relay_pid = conn.info.backend_pid
            async for flush in flushed:
                sessions: dict[str, int | None] = {}
                _coalesce(sessions, flush)
                with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream):
                    while True:
                        _coalesce(sessions, flushed.receive_nowait())
                await conn.execute(
                    "SELECT pg_notify(%s, s) FROM unnest(%s::text[]) AS s",
                    (self.channel, [_payload(*flush) for flush in sessions.items()]),
                )

    async def listen(self, wake: Any) -> None:
        """Call ``wake(session_id, end)`` for every flush another worker announces (this
        process's own NOTIFYs come back too: its streams were woken at the flush itself)."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            async for notice in conn.notifies():
                if notice.pid != self._relay_pid:
                    wake(*_announced(notice.payload))

    # ------------------------------------------------------------------ worker side
    async def work(self, runner: Any, on_abort: Any) -> None:
        """Run the worker (and the stalled-job rescue) until cancelled.

        ``runner(session_id, kind, prompt, turn)`` runs a job; ``on_abort(session_id)`` cancels
        the turn it runs.
        """
        self._runner, self._on_abort = runner, on_abort
        async with anyio.create_task_group() as group:
            group.start_soon(self._rescue_stalled)
            await self.app.run_worker_async(
                name=f"dsh-serve@{socket.gethostname()}:{os.getpid()}",
                concurrency=self.concurrency,
                wait=True,
                install_signal_handlers=False,
                listen_notify=True,
                fetch_job_polling_interval=1.0,
                abort_job_polling_interval=0.5,
                update_heartbeat_interval=self.heartbeat,
                stalled_worker_timeout=self.stalled_after,
                delete_jobs="never",
            )
            group.cancel_scope.cancel()

    async def _rescue_stalled(self) -> None:
        """Retry the jobs of workers whose heartbeat went stale (they died mid-job)."""
        while True:
            await anyio.sleep(self.heartbeat)
            try:
                stalled = await self.app.job_manager.get_stalled_jobs(
                    task_name=TURN_TASK, seconds_since_heartbeat=self.stalled_after
                )
                for job in stalled:
                    log.warning("retrying job %s of session %s: its worker stopped", job.id,
                                job.lock)
                    await self.app.job_manager.retry_job(job)
            except Exception:  # another worker retried it first, or the database hiccuped
                log.info("stalled-job rescue: will look again", exc_info=True)
