"""The server's engine: plugin hosts, turns in the background, event wake-ups, metrics.

One plugin host runs per (composition, workspace) pair, booted on first use and
kept until the server stops: the rows taking the workspace term (the built-in tools) work in one
workspace, so a session created with another workspace gets its own host. The
default composition's host at the default workspace boots at start-up (a bad
composition fails ``dsh serve`` at once) and serves every read.

A turn is run by resuming the session for write (the persistence backend's
ownership: ``flock`` for JSONL, the advisory lock for PostgreSQL), running the
turn, and closing the agent, which flushes and releases the session. Between
turns nothing is held, so any process sharing the store may run the next one.
The composition a session was created with is recorded in its header as
``agentPreset``; its workspace is the header's ``cwd``.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from dsh_host._agent.errors import ApprovalDecisionError
from dsh_host._agent.keys import AGENT
from dsh_host._agent.loop import Agent
from dsh_host._composition_edits import with_term
from dsh_host._front.runner import (
    Overrides,
    Plan,
    TermsRefused,
    composition_digest,
    configured_route,
    plan_continuation,
    portable_spec,
    terms_of,
)
from dsh_host._jsonsafe import json_dec_hook, to_json_builtins
from dsh_host._loader import LocatedRow, PluginHost, open_host
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._persistence.persistence import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionListing,
    SessionLoad,
    SessionNotFoundError,
)
from dsh_host._persistence.storage import SupportsCurrentRevision
from dsh_host._session.approvals import pending_approvals, waiting_calls, waiting_root
from dsh_host._session.events import SessionEvent, TurnEndReason, turn_end_kind
from dsh_host._session.events.data import CompositionTerms, RunTerms
from dsh_host._session.header import SessionHeader, new_session_id
from dsh_host._session.keys import SESSIONS
from dsh_host._session.messages import ContentBlock
from dsh_host._session.summary import SummaryFold, last_turn
from dsh_host._session.terms import record_terms, recorded_terms
from dsh_host.errors import DshError

from . import views
from .metrics import ServerMetrics

if TYPE_CHECKING:
    from .queue import Flush, TurnQueue

__all__ = [
    "AFTER_REPAIR_PROMPT",
    "SESSION_ID_PATTERN",
    "STORE_OUTAGE_CODES",
    "ApiError",
    "RunningTurn",
    "ServeOptions",
    "ServerRuntime",
    "is_store_outage",
    "open_runtime",
]

log = logging.getLogger("dsh.server")

#: The prompt of the turn a worker starts after repairing a session whose turn a dead worker
#: left open (``after_repair: continue``): the repair's results are in the history above it.
AFTER_REPAIR_PROMPT: Final = (
    "The previous turn was interrupted before it finished (the process running it stopped). "
    "The tool results above show what was repaired: a call marked as not started did not run; "
    "a call whose outcome is unknown may or may not have taken effect. Check before repeating "
    "anything, then continue the task."
)


#: Session ids a client may choose (``POST /sessions {id}``): a letter or digit, then letters,
#: digits, ``.``, ``_``, ``-``; at most 128 characters. Every such id is one URL path segment
#: and one file name as it is, so what was created can always be addressed again (an id with
#: ``/`` could be stored but never reached through ``/sessions/{id}``). Generated ids fit.
SESSION_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class ApiError(DshError):
    """An error the API reports as ``{"error": {"code", "message"}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code  # type: ignore[misc]  # an instance's code, not the class default


@dataclass(frozen=True)
class ServeOptions:
    """How a ``dsh serve`` process runs (built by the command from its flags)."""

    #: composition name -> its rows (model row and ``approval: defer`` already applied);
    #: the first one is the default
    compositions: Mapping[str, Sequence[LocatedRow]]
    default_workspace: str
    #: directories a session's workspace may be in (the default workspace always may)
    workspace_roots: tuple[str, ...] = ()
    token: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    #: seconds a request body may take to arrive whole (408 after)
    body_timeout: float = 30.0
    #: after repairing a turn a dead worker left open: stop there, or run a new turn
    after_repair: Literal["stop", "continue"] = "stop"
    #: how often a stream re-reads the store for events another process wrote (seconds)
    poll_interval: float = 0.5
    #: turn jobs in PostgreSQL (``--queue``): the DSN and schema of the job queue
    queue_dsn: str | None = None
    queue_schema: str = "dsh_queue"
    #: turns one worker process runs at once, and when a silent worker counts as dead (seconds)
    queue_concurrency: int = 4
    stalled_after: float = 6.0
    #: composition name -> its identity in the run terms (the file and the digest of its rows
    #: as loaded, as ``dsh run`` records it); a composition missing here is identified by its
    #: name and the digest of the rows it is served with
    identities: Mapping[str, CompositionTerms] = field(default_factory=dict)
    #: the ``--model`` spec the compositions were built with (recorded when it rebuilds alone)
    model_spec: str | None = None

    @property
    def default_composition(self) -> str:
        return next(iter(self.compositions))

    def identity(self, name: str) -> CompositionTerms:
        found = self.identities.get(name)
        if found is not None:
            return found
        return CompositionTerms(name=name, digest=composition_digest(self.compositions[name]))


@dataclass(frozen=True, slots=True)
class StoredSummary:
    """What a session summary reads from the stored log (its status adds what runs now)."""

    #: the summary's fields but ``status``
    fields: dict[str, Any]
    #: the calls waiting for a decision (``GET /approvals`` rows)
    approvals: tuple[dict[str, Any], ...]
    #: a turn was left open by a process that stopped (the read added closers)
    interrupted: bool
    #: the stored header, as JSON
    header: dict[str, Any]
    #: the header and run terms every operation is admitted by (:meth:`ServerRuntime.admit`)
    admission: tuple[SessionHeader, RunTerms | None] | None = None
    #: a delegating call waits on a child session's asks (D36): the session awaits approval too
    waits_on_child: bool = False

    @classmethod
    def of(cls, load: SessionLoad) -> StoredSummary:
        fold = SummaryFold()
        fold.feed(load.events)
        return cls.folded(load.header, fold, load.closers)

    @classmethod
    def folded(
        cls, header: SessionHeader, fold: SummaryFold, closers: Sequence[SessionEvent] = ()
    ) -> StoredSummary:
        """From a :class:`SummaryFold` fed the whole log (``closers``: a read's for an open
        turn): what a walk of the log page by page gives (D33)."""
        fields = views.session_fields(fold.summary(header, closers))
        approvals = tuple(pending_approvals(fold.last_events(), header.id))
        waits = bool(waiting_calls(fold.last_events(), header.id))
        return cls(
            fields, approvals, bool(closers), header.to_json(), (header, fold.terms), waits
        )


@dataclass
class RunningTurn:
    """A turn running in this process."""

    agent: Agent
    turn: int
    #: the ``sessionPersistence`` service of the host running it (it holds the write handle)
    store: Any
    started: float = field(default_factory=time.monotonic)
    #: the store's end when the turn was registered; set once it moved, or the turn ended
    start_end: int = 0
    #: set when the store holds the turn's start, or the turn ended (``start_stored`` tells)
    stored: anyio.Event = field(default_factory=anyio.Event)
    start_stored: bool = False
    #: why the turn failed (an exception its body raised), once it ended
    failure: BaseException | None = None
    #: the event type whose storing makes the start stored (``user/message`` for a turn with
    #: a prompt: a flush that holds only ``turn/start`` is not yet the prompt stored)
    start_type: str | None = None
    #: the store's end after the turn's last flush this process saw succeed (``_flushed``)
    flushed_end: int | None = None

    def durable_end(self) -> int | None:
        """The seq after the last event the store holds (the write handle's durable cursor);
        None once the handle is released (the store then has everything)."""
        handle = self.store.owner(self.agent.id)
        return None if handle is None else int(handle.durable_seq)

    def start_is_stored(self) -> bool:
        """The store holds the turn's start: events past ``start_end`` and, when the turn has
        a prompt, its ``user/message`` among them (a slice of this turn's events, not the log)."""
        end = self.durable_end() or 0
        if end <= self.start_end:
            return False
        if self.start_type is None:
            return True
        events = self.agent.session.events
        first = bisect.bisect_left(events, self.start_end, key=lambda e: e.seq)
        last = bisect.bisect_left(events, end, lo=first, key=lambda e: e.seq)
        return any(e.type == self.start_type for e in events[first:last])


class ServerRuntime:
    """Hosts, running turns and the wake-ups streams wait on (see the module docstring)."""

    def __init__(self, options: ServeOptions, group: TaskGroup) -> None:
        self.options = options
        self.metrics = ServerMetrics()
        self._group = group
        self._hosts: dict[tuple[str, str], PluginHost] = {}
        self._booting: dict[tuple[str, str], anyio.Event] = {}
        self._closing = anyio.Event()
        self._running: dict[str, RunningTurn] = {}
        self._claimed: set[str] = set()
        self._wakeups: dict[str, anyio.Event] = {}
        self._reader: PluginHost | None = None
        self._queue: TurnQueue | None = None
        self._busy_elsewhere: dict[str, str] = {}
        #: what listings read from each stored session, by id, with the revision it was read at
        self._stored: dict[str, tuple[str, StoredSummary]] = {}
        self._flushes: MemoryObjectSendStream[Flush] | None = None
        #: the streams waiting idle, by session: each one's token -> the last seq it has
        #: seen; the idle poll (D47) asks the store for these sessions' ends
        self._idle: dict[str, dict[object, int]] = {}
        self._polling = False
        #: the idle poll's last attempt failed (its failures are logged once per outage)
        self._poll_failing = False

    # ------------------------------------------------------------------ hosts
    async def start(self) -> None:
        """Boot the default host (the reader): a bad composition fails here."""
        self._reader = await self.host(
            self.options.default_composition, self.options.default_workspace
        )
        if self.options.queue_dsn is not None:
            from .queue import TurnQueue

            self._queue = TurnQueue(
                self.options.queue_dsn,
                self.options.queue_schema,
                concurrency=self.options.queue_concurrency,
                heartbeat=max(self.options.stalled_after / 3, 0.5),
                stalled_after=self.options.stalled_after,
            )
            await self._queue.init_schema()
            await self._group.start(self._queue_task, self._queue)

    async def _queue_task(self, queue: TurnQueue, *, task_status: TaskStatus[None]) -> None:
        send: MemoryObjectSendStream[Flush]
        receive: MemoryObjectReceiveStream[Flush]
        send, receive = anyio.create_memory_object_stream(max_buffer_size=1000)
        async with queue.app.open_async(), anyio.create_task_group() as group:
            group.start_soon(queue.relay_flushes, receive)
            group.start_soon(queue.listen, self._wake)
            self._flushes = send
            task_status.started()
            group.start_soon(queue.work, self.run_job, self.cancel_here)
            await self._closing.wait()
            group.cancel_scope.cancel()

    @property
    def store(self) -> Any:
        """The ``sessionPersistence`` service every read goes through."""
        assert self._reader is not None, "start() first"
        service = self._reader.ctx.get(SESSION_PERSISTENCE)
        if service is None:
            raise ApiError(
                500,
                "NO_PERSISTENCE",
                "the composition stores no sessions (no row provides sessionPersistence); "
                "serve a composition with a persistence row",
            )
        return service

    async def host(
        self, composition: str, workspace: str, rows: Sequence[LocatedRow] | None = None
    ) -> PluginHost:
        """The host of ``composition`` working in ``workspace`` (or of exactly ``rows``: a
        session's composition patched to its recorded terms), booted on first use."""
        if rows is None:
            rows = with_term(self.options.compositions[composition], "workspace", workspace)
        key = (composition, composition_digest(rows))
        while key not in self._hosts:
            booting = self._booting.get(key)
            if booting is not None:
                await booting.wait()
                continue
            self._booting[key] = done = anyio.Event()
            try:
                self._hosts[key] = await self._group.start(self._host_task, list(rows))
            finally:
                del self._booting[key]
                done.set()
        return self._hosts[key]

    async def _host_task(
        self, rows: list[LocatedRow], *, task_status: TaskStatus[PluginHost]
    ) -> None:
        async with open_host(rows) as host:
            host.ctx.on("agent/step-end", lambda _step: self.metrics.steps.inc())
            self.metrics.time_flushes(host.ctx.service(SESSIONS), self._flushed)
            task_status.started(host)
            await self._closing.wait()

    def close(self) -> None:
        """Stop every host (running turns end ``aborted``, cause ``disposed``)."""
        self._closing.set()

    # ------------------------------------------------------------------ wake-ups
    def _wake(self, session_id: str, end: int | None = None) -> None:
        """Wake the streams waiting on the session. ``end``: the seq after the last event the
        wake-up announces as stored; when every stream waiting idle on the session has seen
        up to it, none is woken (each would read and find nothing new: docs/decisions.md D51).
        Later events come with a wake-up of their own, and the idle poll (D47) catches any
        that none announces."""
        if end is not None:
            followers = self._idle.get(session_id)
            if followers and all(after + 1 >= end for after in followers.values()):
                return
        waiting = self._wakeups.pop(session_id, None)
        if waiting is not None:
            waiting.set()

    def _flushed(self, session: Any) -> None:
        """A flush succeeded: streams wake (they show only what the store holds, so an append
        alone is nothing to show yet); in queue mode the other workers' streams are told that
        the table has new events."""
        running = self._running.get(session.id)
        if running is not None and not running.start_stored and running.start_is_stored():
            running.start_stored = True
            running.stored.set()
        end = running.durable_end() if running is not None else None
        if running is not None:
            running.flushed_end = end
        self._wake(session.id, end)
        if self._flushes is not None:
            # the end rides along (docs/decisions.md D51): a stream elsewhere that has read
            # past it already (woken by an earlier NOTIFY, after this flush) is not woken again
            with contextlib.suppress(anyio.WouldBlock):  # a burst: the poll catches up
                self._flushes.send_nowait((session.id, end))

    async def wait_for_events(self, session_id: str, after: int, at_most: float) -> bool:
        """Wait until the session may have stored events past seq ``after`` (the last one the
        caller has seen): True when woken, False after ``at_most`` seconds without a wake-up.

        A wake-up comes from this process's flushes (:meth:`_flushed`), in queue mode from
        the other workers' (their NOTIFY), and from the one idle poll of the process (D47),
        which catches what no wake-up announced (a relay burst dropped, a writer outside the
        servers) within about ``poll_interval``. A woken caller reads (``events_after``) and
        may find nothing new."""
        wakeup = self._wakeups.setdefault(session_id, anyio.Event())
        token = object()
        self._idle.setdefault(session_id, {})[token] = after
        self._start_idle_poll()
        try:
            with anyio.move_on_after(at_most):
                await wakeup.wait()
        finally:
            followers = self._idle.get(session_id)
            if followers is not None:
                followers.pop(token, None)
                if not followers:
                    del self._idle[session_id]
        return wakeup.is_set()

    def _start_idle_poll(self) -> None:
        """Run the idle poll while a stream waits idle (it ends when none does)."""
        if not self._polling and not self._closing.is_set():
            self._polling = True
            self._group.start_soon(self._idle_poll)

    async def _idle_poll(self) -> None:
        """Every ``poll_interval``, while streams wait idle: one call to the store for the
        ends of all their sessions (``stored_ends``: one statement on PostgreSQL), waking
        only the sessions stored past what one of their streams has seen, or whose end the
        store cannot tell without a read (D47). A session running a turn here is not asked
        for: its write handle's durable cursor is what the store holds.

        A store that fails the call wakes every idle stream: each reads, and ends on the
        outage as its read says (its client reconnects), or goes on when the read succeeds.
        The failure is one log line per outage; the poll goes on."""
        try:
            while self._idle and not self._closing.is_set():
                with anyio.move_on_after(self.options.poll_interval):
                    await self._closing.wait()
                if self._closing.is_set():
                    return
                seen = {
                    session_id: min(followers.values())
                    for session_id, followers in self._idle.items()
                    if followers
                }
                ends: dict[str, int] = {}
                asked: list[str] = []
                for session_id in seen:
                    running = self._running.get(session_id)
                    end = running.durable_end() if running is not None else None
                    if end is None:
                        asked.append(session_id)
                    else:  # a turn running here: its write handle knows what is stored
                        ends[session_id] = end
                if asked:
                    try:
                        ends.update(await self._stored_ends(asked))
                    except Exception as exc:
                        if not self._poll_failing:
                            self._poll_failing = True
                            what = f"the idle poll of {len(asked)} followed session(s) failed"
                            _log_failure(f"{what}; their streams read the store now", exc)
                    else:
                        if self._poll_failing:
                            self._poll_failing = False
                            log.info("the idle poll reads the store again")
                for session_id, after in seen.items():
                    end = ends.get(session_id)
                    if end is None or end > after + 1:
                        self._wake(session_id)
        finally:
            self._polling = False

    async def _stored_ends(self, session_ids: list[str]) -> dict[str, int]:
        """The store's ``stored_ends`` (D47); a store without it tells none (each is read)."""
        ask = getattr(self.store, "stored_ends", None)
        if ask is None:
            return {}
        ends: dict[str, int] = await ask(session_ids)
        return ends

    # ------------------------------------------------------------------ reads
    async def inspect(self, session_id: str) -> SessionLoad:
        try:
            load: SessionLoad = await self.store.inspect(session_id)
        except SessionNotFoundError:
            raise ApiError(404, "SESSION_NOT_FOUND", f'no stored session "{session_id}"') from None
        return load

    async def events_after(
        self, session_id: str, after: int, limit: int | None = None
    ) -> Sequence[SessionEvent]:
        """The stored events with ``seq > after`` (at most ``limit``: a page), and only those:
        nothing is shown that the store may not hold (a write that fails, on a full disk say,
        is rolled back, and the repair may store other events under the same seqs).

        While a turn runs here the events come from memory, but only up to the write handle's
        durable cursor: the same events the store holds, without reading the log (a follower
        of a 100k-event session costs a slice, not a read). Otherwise they are read from the
        store (a store that can tell its revision answers an idle follower without a read).
        """
        running = self._running.get(session_id)
        end = running.durable_end() if running is not None else None
        if running is not None and end is not None:
            events = running.agent.session.events
            start = bisect.bisect_right(events, after, key=lambda e: e.seq)
            stop = bisect.bisect_left(events, end, lo=start, key=lambda e: e.seq)
            if limit is not None:
                stop = min(stop, start + limit)
            return events[start:stop]
        try:
            found: Sequence[SessionEvent] = await self.store.read_from(
                session_id, after + 1, limit=limit
            )
        except SessionNotFoundError:
            raise ApiError(404, "SESSION_NOT_FOUND", f'no stored session "{session_id}"') from None
        return found

    async def stored_end(self, session_id: str) -> int:
        """The seq of the last event the store holds (-1: none yet): where a new follower
        starts. A turn running here answers from its write handle; otherwise a store that can
        tell it from what it read last (JSONL: its cursor, reading only the bytes appended
        since), else the session's summary, read again only when its revision changed. 404 for
        an unknown session."""
        running = self._running.get(session_id)
        end = running.durable_end() if running is not None else None
        if end is not None:
            return end - 1
        next_seq = getattr(self.store, "stored_next_seq", None)
        if next_seq is not None:
            try:
                stored_end: int | None = await next_seq(session_id)
            except SessionNotFoundError:
                raise ApiError(
                    404, "SESSION_NOT_FOUND", f'no stored session "{session_id}"'
                ) from None
            if stored_end is not None:
                return stored_end - 1
        stored = await self.stored_summary(session_id)
        return int(stored.fields["events"]) - 1

    def running(self, session_id: str) -> RunningTurn | None:
        return self._running.get(session_id)

    async def status(self, session_id: str, stored: StoredSummary) -> str:
        """``running`` (here, or held by another process), ``queued``, ``awaiting-approval``,
        ``interrupted`` (needs a repair), ``idle``: from what runs here, the job queue, and
        the stored log.

        A log with an open turn is ``interrupted`` only when nobody holds the session: while
        another process runs a turn, the open turn is that turn, not a crash's leftover
        (only a storage that cannot tell who holds a session is taken at its log's word).
        """
        if session_id in self._running or session_id in self._claimed:
            return "running"
        if session_id in self._busy_elsewhere:
            return self._busy_elsewhere[session_id]
        if stored.approvals or stored.waits_on_child:
            return "awaiting-approval"
        if stored.interrupted:
            if await self.store.held_by(session_id) is not None:
                return "running"
            return "interrupted"
        return "idle"

    async def refresh(self) -> None:
        """Learn which sessions have a job queued or running on any worker (queue mode)."""
        if self._queue is not None:
            self._busy_elsewhere = await self._queue.busy_sessions()

    async def summary(self, load: SessionLoad) -> dict[str, Any]:
        stored = self._remember(load)
        return {**stored.fields, "status": await self.status(load.id, stored)}

    def _remember(self, load: SessionLoad) -> StoredSummary:
        """What ``load`` says of its session, kept under the revision it was read at."""
        stored = StoredSummary.of(load)
        self._stored[load.id] = (load.revision, stored)
        return stored

    async def stored_summary(self, session_id: str) -> StoredSummary:
        """What the session's log says, read again only when its revision changed since this
        process last read it (the inspector's session page polls it); a store that cannot tell
        a revision without reading is read every time. 404 for an unknown session."""
        remembered = self._stored.get(session_id)
        store = self.store
        if remembered is not None and isinstance(store, SupportsCurrentRevision):
            if await store.current_revision(session_id) == remembered[0]:
                return remembered[1]
        self.metrics.logs_read.inc()
        walked = await self._walk_summary(session_id)
        if walked is not None:
            return walked
        return self._remember(await self.inspect(session_id))

    async def _walk_summary(self, session_id: str) -> StoredSummary | None:
        """The summary from a walk of the log page by page, holding a page and the summary's
        folds, not the log (D33). None when only a full read can say: a store that cannot
        tell a walk ended at a complete record or its revision, a torn tail, an open turn
        (the closers a read adds)."""
        store: Any = self.store
        if getattr(store, "walked_tail", None) is None or not hasattr(store, "current_revision"):
            return None
        revision = await store.current_revision(session_id)
        if revision is None:
            return None  # the full read says 404
        header = await store.stored_header(session_id)
        fold = SummaryFold()
        async for page in store.walk(session_id):
            fold.feed(page)
        trailing, _ = await store.walked_tail(session_id)
        if trailing != 0 or fold.turn_open:
            return None
        stored = StoredSummary.folded(header, fold)
        self._stored[session_id] = (revision, stored)
        return stored

    async def summaries(self) -> list[dict[str, Any]]:
        """Every stored session's summary, most recently updated first (an unreadable log is a
        row with its ``problem``). A log is read only when its revision changed since this
        process last read it: the inspector polls this, and a root of long sessions would
        otherwise be read whole every time."""
        rows: list[dict[str, Any]] = []
        for listing, stored in await self._listed():
            if isinstance(stored, Exception):
                header = listing.header
                rows.append({"id": header.id, "status": "unreadable", "problem": str(stored),
                             "createdAt": header.created_at, "updatedAt": header.created_at})
            else:
                status = await self.status(listing.header.id, stored)
                rows.append({**stored.fields, "status": status})
        rows.sort(key=lambda r: (r["updatedAt"], r["id"]), reverse=True)
        return rows

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """Every pending approval across the stored sessions, oldest ask first."""
        rows = [
            row
            for _, stored in await self._listed()
            if not isinstance(stored, Exception)  # one unreadable log must not hide the others'
            for row in stored.approvals
        ]
        rows.sort(key=lambda r: (r["askedAt"], r["sessionId"], r["callId"]))
        self.metrics.pending_approvals.set(len(rows))
        return rows

    async def _listed(self) -> list[tuple[SessionListing, StoredSummary | Exception]]:
        """Each stored session with what was read from it (or why it could not be read)."""
        listings = await self.store.list(unreadable=[])
        out: list[tuple[SessionListing, StoredSummary | Exception]] = []
        for listing in listings:
            session_id = listing.header.id
            remembered = self._stored.get(session_id)
            if remembered is not None and remembered[0] == listing.revision:
                out.append((listing, remembered[1]))
                continue
            self.metrics.logs_read.inc()
            try:
                load = await self.store.inspect(session_id)
            except Exception as exc:
                self._stored.pop(session_id, None)
                out.append((listing, exc))
                continue
            out.append((listing, self._remember(load)))
        listed = {listing.header.id for listing in listings}
        for gone in [session_id for session_id in self._stored if session_id not in listed]:
            del self._stored[gone]
        return out

    # ------------------------------------------------------------------ writes
    def check_workspace(self, workspace: str | None, *, session_id: str | None = None) -> str:
        """The absolute workspace a session works in; refused outside the allowed roots, for a
        new session and for every operation on a stored one (``session_id``)."""
        if workspace is None:
            return self.options.default_workspace
        path = os.path.realpath(workspace)
        roots = (self.options.default_workspace, *self.options.workspace_roots)
        if not any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            whose = f'session "{session_id}" works in ' if session_id is not None else ""
            raise ApiError(
                400,
                "WORKSPACE_REFUSED",
                f"{whose}workspace {workspace!r} is outside the directories this server allows "
                f"({', '.join(roots)}); start dsh serve with --allow-workspace DIR to add one",
            )
        if not os.path.isdir(path):
            raise ApiError(400, "WORKSPACE_REFUSED", f"workspace {workspace!r} is not a directory")
        return path

    def check_composition(self, name: str | None) -> str:
        if name is None:
            return self.options.default_composition
        if name not in self.options.compositions:
            known = ", ".join(self.options.compositions)
            raise ApiError(
                400,
                "UNKNOWN_COMPOSITION",
                f"unknown composition {name!r}; this server runs {known}",
            )
        return name

    async def create_session(
        self, *, workspace: str | None, composition: str | None, session_id: str | None
    ) -> SessionLoad:
        """Create and store an empty session (its header), ready for its first turn."""
        if session_id is not None and re.fullmatch(SESSION_ID_PATTERN, session_id) is None:
            raise ApiError(
                400,
                "INVALID_SESSION_ID",
                f"session id {session_id!r} is not allowed: use 1-128 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit (or send no id to get one)",
            )
        name = self.check_composition(composition)
        path = self.check_workspace(workspace)
        rows = with_term(self.options.compositions[name], "workspace", path)
        if configured_route(rows) is None:  # no demo in its place (D22 in docs/decisions.md)
            raise ApiError(
                400,
                "NO_MODEL",
                f"composition {name!r} names no model and this server was started without "
                "--model; restart dsh serve with --model SPEC (or a composition whose agent "
                "row names one) to create sessions",
            )
        host = await self.host(name, path)
        if session_id is not None:
            try:
                await self.store.inspect(session_id)
            except SessionNotFoundError:
                pass
            else:
                raise SessionAlreadyExistsError(f'a session "{session_id}" is already stored')
        sessions = host.ctx.service(SESSIONS)
        session = sessions.create(
            session_id or new_session_id(), meta={"cwd": path, "agentPreset": name}
        )
        spec = self.options.model_spec
        own = spec is not None and any(r.row.id == "model" for r in rows)
        record_terms(session, terms_of(
            rows, composition=self.options.identity(name),
            spec=portable_spec(spec) if own and spec else None, by="dsh serve",
        ))
        try:
            await sessions.flush(session)  # stores the header and the terms
        finally:
            sessions.detach(session)
        return await self.inspect(session.id)

    async def fork_session(
        self, source_id: str, *, at: int | None, turn: int | None, child_id: str | None
    ) -> tuple[SessionLoad, dict[str, Any]]:
        """Fork a stored session at a turn boundary into a new stored one (the source is only
        read); the child and the fork record (boundary, effects ledger; D27)."""
        from dsh_host._persistence.fork import fork_stored

        if child_id is not None and re.fullmatch(SESSION_ID_PATTERN, child_id) is None:
            raise ApiError(
                400,
                "INVALID_SESSION_ID",
                f"session id {child_id!r} is not allowed: use 1-128 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit (or send no id to get one)",
            )
        await self.inspect(source_id)  # 404 when there is no such session
        result = await fork_stored(self.store, source_id, at=at, turn=turn, child_id=child_id)
        return await self.inspect(result.session_id), result.to_json()

    def _claim(self, session_id: str) -> None:
        """Reserve the session for one turn in this process (no await between check and set)."""
        if session_id in self._claimed or session_id in self._running:
            raise ApiError(
                409, "SESSION_BUSY", f'session "{session_id}" is running a turn; wait or cancel it'
            )
        self._claimed.add(session_id)

    def _admit(self, load: SessionLoad) -> tuple[str, Plan]:
        return self.admit(load.id, load.header, recorded_terms(load.events))

    def refusal(self, session_id: str, stored: StoredSummary) -> dict[str, str] | None:
        """Why operations on the session would be refused (``{code, message}``), or None: the
        inspector offers no action for such a session."""
        if stored.admission is None:
            return None
        try:
            self.admit(session_id, *stored.admission)
        except ApiError as exc:
            return {"code": exc.code, "message": str(exc)}
        return None

    def admit(
        self, session_id: str, header: SessionHeader, recorded: RunTerms | None
    ) -> tuple[str, Plan]:
        """The one check every operation on a stored session passes (turns, decisions,
        continuations, queue jobs, cancel): its workspace must be one this server allows (400
        ``WORKSPACE_REFUSED``), and it continues under its recorded terms -- its composition
        patched back to them -- or not at all (409 ``TERMS_REFUSED``)."""
        name = header.agent_preset if isinstance(header.agent_preset, str) else None
        if name is not None and name not in self.options.compositions:
            raise ApiError(
                409,
                "UNKNOWN_COMPOSITION",
                f'session "{session_id}" was created with composition {name!r}, which this '
                "server does not run",
            )
        name = name or self.options.default_composition
        workspace = recorded.workspace if recorded is not None else None
        if workspace is None:
            workspace = header.cwd if isinstance(header.cwd, str) else None
        path = self.check_workspace(workspace, session_id=session_id)
        rows = with_term(self.options.compositions[name], "workspace", path)
        try:
            plan = plan_continuation(
                rows, session_id=session_id, recorded=recorded,
                composition=self.options.identity(name), overrides=Overrides(), cwd=path,
                by="dsh serve",
            )
        except TermsRefused as exc:
            raise ApiError(409, "TERMS_REFUSED", str(exc)) from None
        return name, plan

    async def _resume(self, load: SessionLoad) -> tuple[Agent, Any]:
        """The session resumed for write under its recorded terms, and the persistence service
        holding its handle."""
        name, plan = self._admit(load)
        host = await self.host(name, plan.terms.workspace or "", plan.rows)
        agent: Agent = await host.ctx.service(AGENT).resume(load.id)
        if plan.record is not None:  # a session that predates its terms: what is assumed
            record_terms(agent.session, plan.record)
        return agent, host.ctx.get(SESSION_PERSISTENCE)

    async def start_turn(self, session_id: str, prompt: str | list[ContentBlock]) -> int:
        """Start a turn in the background; return its number once the session is held.

        In queue mode the turn becomes a job that exactly one worker takes; a prompt with
        attachments travels in the job as its JSON content blocks (the bytes inside, D29), after
        the session's model was asked whether it reads them (D31).
        """
        self._claim(session_id)
        try:
            load = await self.inspect(session_id)
            if pending_approvals(load.events, session_id) or waiting_calls(
                load.events, session_id
            ):  # a delegating call waiting on its child's asks waits too (D36)
                raise ApiError(
                    409,
                    "AWAITING_APPROVAL",
                    f'session "{session_id}" is awaiting approval; decide its pending calls '
                    "(POST /sessions/{id}/approvals/{callId}, or those of the child session "
                    "its call waits on) before a new turn",
                )
            if self._queue is not None:
                queued: str | list[Any] = prompt if isinstance(prompt, str) else (
                    await self._queued_blocks(load, prompt)
                )
                return await self._enqueue(session_id, "turn", queued, last_turn(load.events))
            agent, store = await self._resume(load)
        except BaseException:
            self._claimed.discard(session_id)
            raise
        return await self._launch(agent, store, lambda: agent.run_turn(prompt), "user/message")

    async def decide(
        self,
        session_id: str,
        call_id: str,
        decision: Literal["allow", "deny"],
        *,
        reason: str | None,
        args_digest: str | None,
        decided_by: str,
    ) -> tuple[str, int] | None:
        """Record a decision; when no call waits any more, continue the turn in the background.

        Returns the continuing session and turn number, or None when other calls still wait.
        A child session a parent's delegating call waits on (D36) is not continued alone (it
        would run without its declared role): the decision is recorded in it, and the top
        waiting parent continues, whose delegating call re-attaches to the child.
        """
        self._claim(session_id)
        try:
            load = await self.inspect(session_id)  # read under the claim: no turn starts meanwhile
            root = await self._waiting_root(load)
            agent, store = await self._resume(load)
            try:
                await agent.decide(
                    call_id, decision, reason=reason, decided_by=decided_by,
                    args_digest=args_digest,
                )
            except ApprovalDecisionError as exc:
                await agent.aclose()
                raise ApiError(409, "APPROVAL_NOT_PENDING", str(exc)) from None
            if root is not None:
                await agent.aclose()
                self._claimed.discard(session_id)
                if agent.pending_approvals():
                    return None
                return root, await self._continue(root)
            if agent.pending_approvals() or self._queue is not None:
                await agent.aclose()
                if agent.pending_approvals():
                    self._claimed.discard(session_id)
                    return None
                return session_id, await self._enqueue(
                    session_id, "continue", None, agent.last_turn
                )
        except BaseException:
            self._claimed.discard(session_id)
            raise
        return session_id, await self._launch(agent, store, agent.continue_turn)

    async def _continue(self, session_id: str) -> int:
        """Continue ``session_id``'s turn awaiting approval (a parent whose delegating call
        waits on a child that was just decided, D36); the continuing turn's number."""
        self._claim(session_id)
        try:
            agent, store = await self._resume(await self.inspect(session_id))
            if self._queue is not None:
                await agent.aclose()
                return await self._enqueue(session_id, "continue", None, agent.last_turn)
        except BaseException:
            self._claimed.discard(session_id)
            raise
        return await self._launch(agent, store, agent.continue_turn)

    async def _waiting_root(self, load: SessionLoad) -> str | None:
        """The top parent waiting on ``load``'s session (``waiting_root``, D36), or None."""
        chain = waiting_root(load)
        try:
            wanted = next(chain)
            while True:
                try:
                    parent: SessionLoad | None = await self.store.inspect(wanted)
                except SessionNotFoundError:
                    parent = None
                wanted = chain.send(parent)
        except StopIteration as done:
            return cast("str | None", done.value)

    async def _queued_blocks(self, load: SessionLoad, prompt: list[ContentBlock]) -> list[Any]:
        """A prompt's blocks as a job carries them (JSON), once the session's agent has said
        its model reads their attachments (raises AttachmentError otherwise, D31)."""
        agent, _store = await self._resume(load)
        try:
            await agent.refuse_unreadable(prompt)
        finally:
            await agent.aclose()
        blocks: list[Any] = to_json_builtins(prompt, "prompt")
        return blocks

    async def _enqueue(
        self, session_id: str, kind: str, prompt: str | list[Any] | None, last: int
    ) -> int:
        """Queue the session's next turn (number ``last + 1``) as a job; release the claim."""
        assert self._queue is not None
        # Released first: the job may start on this very process before defer() returns.
        self._claimed.discard(session_id)
        # PostgreSQL decides (unique indexes on the job table): no check here could, as two
        # processes may both pass it before either inserts.
        if not await self._queue.defer(session_id, kind, prompt, last + 1):
            raise ApiError(
                409, "SESSION_BUSY",
                f'session "{session_id}" has a turn queued or running (or turn {last + 1} was '
                "just taken); read the session and retry",
            )
        return last + 1

    async def run_job(
        self,
        session_id: str,
        kind: str,
        prompt: str | list[Any] | None,
        turn: int,
    ) -> None:
        """Run one turn job here (queue mode), holding the session for its whole length.

        When the log shows turn ``turn`` already started, the job ran before: if that turn was
        left open (its worker died), the resume has just repaired it, and it is never run again
        (``after_repair`` says what follows); if it ended, there is nothing left to do.
        """
        try:
            self._claim(session_id)
        except ApiError as exc:  # busy in this process: the job is retried later
            raise SessionAlreadyOwnedError(str(exc)) from None
        try:
            load = await self.inspect(session_id)
            agent, store = await self._resume(load)
        except BaseException:
            self._claimed.discard(session_id)
            raise
        body: Callable[[], Awaitable[TurnEndReason]] | None
        if agent.last_turn < turn:
            body = agent.continue_turn if kind == "continue" else partial(
                agent.run_turn, _job_prompt(prompt)
            )
        elif not load.closers:
            body = None  # the turn ran to its end before (e.g. the job was aborted at shutdown)
        elif self.options.after_repair == "continue":
            log.warning("session %s: turn %d was interrupted; repaired, continuing", session_id,
                        turn)
            body = partial(agent.run_turn, AFTER_REPAIR_PROMPT)
        else:
            log.warning("session %s: turn %d was interrupted; repaired, stopping there",
                        session_id, turn)
            body = None
        if body is None:
            self._claimed.discard(session_id)
            await agent.aclose()
            return
        self._register(agent, store)
        await self._drive(agent, body)

    def cancel_here(self, session_id: str) -> None:
        """Cancel the session's turn if it runs in this process (no-op otherwise)."""
        running = self._running.get(session_id)
        if running is not None:
            running.agent.cancel()

    def _register(self, agent: Agent, store: Any, start_type: str | None = None) -> int:
        turn = agent.last_turn + 1
        running = RunningTurn(agent, turn, store, start_type=start_type)
        running.start_end = running.durable_end() or 0
        self._running[agent.id] = running
        self._claimed.discard(agent.id)
        self.metrics.turns_started.inc()
        return turn

    async def _launch(
        self,
        agent: Agent,
        store: Any,
        body: Callable[[], Awaitable[TurnEndReason]],
        start_type: str | None = None,
    ) -> int:
        """Run the turn in the background; return its number once the store holds its start.

        A 202 so means the prompt is in the log: a read right after it sees the turn, and a
        store that cannot take it (a full disk, an immutable log) is this request's 503, not a
        turn that silently stored nothing.
        """
        turn = self._register(agent, store, start_type)
        running = self._running[agent.id]
        self._group.start_soon(self._drive, agent, body)
        await running.stored.wait()
        if not running.start_stored:  # the turn ended before the store held its start
            if running.failure is not None:
                raise running.failure
            raise ApiError(503, "STORE_UNAVAILABLE",
                           f'session "{agent.id}": the store did not take the turn\'s start')
        return turn

    async def _drive(self, agent: Agent, body: Callable[[], Awaitable[TurnEndReason]]) -> None:
        kind = "error"
        running = self._running[agent.id]
        try:
            reason = await body()
            kind = turn_end_kind(reason)
        except Exception as exc:
            running.failure = exc
            _log_failure(f"turn of session {agent.id} failed", exc)
        finally:
            # the store's end once the turn is closed, when known for sure: the last flush
            # (aclose's own) stored every event the session holds (docs/decisions.md D51)
            end: int | None = None
            try:
                with anyio.CancelScope(shield=True):
                    await agent.aclose()  # flush, then release the session
                if running.flushed_end == agent.session.seq:
                    end = running.flushed_end
            except Exception as exc:
                running.failure = running.failure or exc
                _log_failure(f"closing session {agent.id} failed", exc)
            finally:
                await _released(running)
                self._running.pop(agent.id, None)
                running.stored.set()
                self.metrics.turns_ended.labels(kind=kind).inc()
                # Streams read the store now: it has it all. A stream that has already read
                # to its end (from the turn's memory, woken by that last flush) is not woken
                # for a read that would find nothing.
                self._wake(agent.id, end)

    async def cancel(self, session_id: str) -> int | None:
        """Cancel the session's running turn (on whichever worker runs it in queue mode), or
        in queue mode its turn still waiting for a worker (it never starts)."""
        self._admit(await self.inspect(session_id))  # the same rule as every other operation
        running = self._running.get(session_id)
        if running is not None:
            running.agent.cancel()
            return running.turn
        if self._queue is not None and await self._queue.abort(session_id):
            return None
        raise ApiError(409, "NOT_RUNNING", f'session "{session_id}" runs no turn')

    # ------------------------------------------------------------------ metrics
    def running_count(self) -> int:
        return len(self._running)


async def _released(running: RunningTurn) -> None:
    """Wait until the turn's write handle is let go. A detached session's handle is closed by
    the store's binding in the background; after a failed flush (a full disk) that close may
    still run when the turn's answer goes out, and the client's next request on the session
    would find it held. Closing again waits for that close (it is idempotent and releases even
    when its drain fails); its error was already reported."""
    handle = running.store.owner(running.agent.id)
    if handle is not None:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await handle.close()


def _job_prompt(prompt: str | list[Any] | None) -> str | list[ContentBlock] | None:
    """A queued job's prompt: its text, or its content blocks decoded from the job's JSON."""
    if isinstance(prompt, list):
        return msgspec.convert(prompt, list[ContentBlock], dec_hook=json_dec_hook)
    return prompt


def _log_failure(what: str, exc: BaseException) -> None:
    """One line for a store outage (the disk or the database, named by the error), the
    traceback for anything else (a bug)."""
    if is_store_outage(exc):
        log.error("%s: %s: %s", what, type(exc).__name__, exc)
    else:
        log.error("%s", what, exc_info=exc)


#: Error codes of a store that cannot take or give data now (the disk or the database).
STORE_OUTAGE_CODES: Final = frozenset({
    "SESSION_PERSISTENCE", "SESSION_STORE_UNAVAILABLE", "SESSION_WRITE_FAILED",
    "SESSION_ROLLBACK_FAILED", "SESSION_HANDLE_POISONED", "SESSION_OWNERSHIP_LOST",
})


def is_store_outage(exc: BaseException) -> bool:
    """An error of the disk or the database under the store, not of a request: a persistence
    error with an outage code, an ``OSError`` (disk full, an immutable or unwritable log, an
    I/O error), or a database driver's operational error (PostgreSQL unreachable, SQLite
    unable to write)."""
    if isinstance(exc, DshError):
        return getattr(exc, "code", None) in STORE_OUTAGE_CODES
    if isinstance(exc, OSError):
        return True
    kind = type(exc)
    return kind.__name__ == "OperationalError" and kind.__module__.split(".")[0] in (
        "psycopg", "sqlite3", "procrastinate")


@asynccontextmanager
async def open_runtime(options: ServeOptions) -> AsyncIterator[ServerRuntime]:
    """A started runtime; on exit every host stops (running turns end ``aborted``)."""
    # A failure is re-raised outside the task group: callers see the error itself (a
    # ConfigError from booting, say), not an ExceptionGroup around it.
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            runtime = ServerRuntime(options, group)
            try:
                await runtime.start()
                yield runtime
            except Exception as exc:
                failure = exc
            finally:
                runtime.close()
    except ExceptionGroup as errors:
        user_errors = errors.subgroup(DshError)
        if failure is None and user_errors is not None:
            failure = _first_leaf(user_errors)
        if failure is None:
            raise
    if failure is not None:
        raise failure


def _first_leaf(group: BaseExceptionGroup[Any]) -> Exception:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, Exception)
    return error
