"""The write handle every persistence backend shares, and its write-behind.

Every backend's write handle promises the same thing (the seam in
:mod:`dsh_host._persistence.persistence`): ``append`` validates a batch and makes it
visible at once but not durable; ``flush`` is the durability barrier; a fixed
window writes buffered events in the background. Only *how a batch reaches
storage* differs between backends, and that is the storage's
(:class:`~dsh_host._persistence.storage.SessionStorage`): :class:`WriteHandle`
composes any storage with the admission checks, the queue, poisoning and the
lifecycle, so a backend writes no handle of its own.

:class:`WriteBehind` decides *when* batches are written
(D7; docs/storage.md):

* **Window.** The first event admitted into an empty queue arms a fixed 200 ms
  window. Later events join it without moving the deadline: bounded coalescing,
  not a debounce, so a steady trickle of events is still written every 200 ms.
* **Expiry.** When the window expires and no write is running, the *whole*
  queue becomes one batch. If a write is running, the expiry is remembered and
  the next batch starts as soon as that write settles. Events admitted during
  a write form the next batch with their own window, which keeps its remaining
  time when the write ends.
* **Background failure.** The batch goes back in front of newer events (order
  is never lost), the window is cancelled and automatic writing pauses; the
  failure is logged once (until a write succeeds again, so a full disk is not
  reported every 200 ms). The next admitted event (with a fresh window) or an
  explicit flush retries.
* **Barrier (flush).** Concurrent flushes share one barrier. It cancels the
  window, waits for a running write, then writes until the queue is empty,
  including events admitted meanwhile. A failure is retained, pauses automatic
  writing and is raised to every flush caller (not logged). Admission to the
  barrier closes before it resolves, so a later event arms its own window.

At most one write runs at a time, so storage never sees two batches of one
handle concurrently and batches arrive in admission order (the serialized
drain). All state lives on the event loop; the storage may hop to a thread.

The clock and the sleep are injectable so tests can drive the window with a
manual clock instead of asserting on wall time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

import anyio
from msgspec import UNSET

from dsh_host._jsonsafe import NonJsonValueError, to_json_builtins
from dsh_host._persistence.persistence import (
    EventLike,
    SessionAppendRejectedError,
    SessionHandleClosedError,
    SessionHandlePoisonedError,
    SessionLoad,
    SessionOwnershipLostError,
    SessionWriteError,
)
from dsh_host._persistence.storage import L, Pending, SessionStorage
from dsh_host._session.errors import InvalidSessionEventError
from dsh_host._session.events import SessionEvent, decode_event
from dsh_host._session.header import SessionHeader
from dsh_host._session.packed import PackedLog, packed_copy
from dsh_host._session.session import Session

__all__ = [
    "RETIRED_EVENT_TYPES",
    "WINDOW_SECONDS",
    "HandleOwner",
    "Once",
    "Spawn",
    "WriteBehind",
    "WriteHandle",
    "header_meta",
    "reject_retired",
    "window_sleep_until",
]

T = TypeVar("T")

#: The fixed coalescing window (seconds). Fixed, not configurable (D7).
WINDOW_SECONDS: Final = 0.2

#: Starts a background task running ``fn()`` (a host's ``ctx.start_soon`` or a task
#: group's ``start_soon``; both accept a zero-argument async callable).
Spawn = Callable[[Callable[[], Coroutine[Any, Any, Any]]], object]

#: Event types DSH retired before v3: they never enter a log (docs/storage.md).
RETIRED_EVENT_TYPES: Final = frozenset({"request/header-delta", "mode/set"})


async def window_sleep_until(deadline: float) -> None:
    """The window's wait. Module-level, and looked up by each window as it starts, so a test
    can take control of when windows expire in a whole host (``monkeypatch.setattr``)."""
    await anyio.sleep_until(deadline)


# --------------------------------------------------------------------------- admission


def reject_retired(session_id: str, kind: object, seq: object, data: object) -> None:
    """Refuse the shapes DSH retired (DSH's exact texts, plus v3's ``system``).

    ``data`` is the event's typed payload or its wire mapping. The session core
    refuses these shapes at ``Session.append`` already; this check covers events
    handed to a backend directly (a resumer's batch, a typed event built by hand).
    """
    if kind in RETIRED_EVENT_TYPES:
        raise SessionAppendRejectedError(
            f'session "{session_id}" contains unsupported legacy {kind} event at seq {seq}'
        )
    if kind != "request/header":
        return
    if isinstance(data, Mapping):
        reason, header = data.get("reason"), data.get("header")
        has_system = isinstance(header, Mapping) and "system" in header
    else:
        reason, header = getattr(data, "reason", None), getattr(data, "header", None)
        has_system = getattr(header, "system", UNSET) is not UNSET
    if reason == "fallback":
        raise SessionAppendRejectedError(
            f'session "{session_id}" contains unsupported legacy request/header reason '
            f'"fallback" at seq {seq}'
        )
    if has_system:
        raise SessionAppendRejectedError(
            f'session "{session_id}": request/header at seq {seq} carries header.system, which '
            "DSH v3 retired (v3 readers refuse such a log); log the system prompt as a "
            "system/message event instead"
        )


def header_meta(header: SessionHeader | Mapping[str, Any]) -> dict[str, Any]:
    """A header handed to ``create`` as plain JSON (not yet validated as a header)."""
    if isinstance(header, SessionHeader):
        return header.to_json()
    if not isinstance(header, Mapping):
        raise SessionAppendRejectedError(
            f"session header must be a SessionHeader or a mapping, got {type(header).__qualname__}"
        )
    try:
        meta: dict[str, Any] = to_json_builtins(header, "session metadata")
    except NonJsonValueError as error:
        raise SessionAppendRejectedError(
            f"session metadata must be losslessly JSON-serializable: {error.problem} at "
            f"{error.path}"
        ) from error
    return meta


# --------------------------------------------------------------------------- once


class _Settled:
    """A one-shot "it has ended" signal: :meth:`set` once, :meth:`wait` any number of times.

    The :class:`anyio.Event` behind it is made by the first waiter only, and a wait after
    :meth:`set` returns at once: most barriers and writes have no waiter (the checkpoint
    policy runs three a step, one caller each), so they cost no event and no scheduler
    round trip.
    """

    __slots__ = ("_event", "done")

    def __init__(self) -> None:
        self.done = False
        self._event: anyio.Event | None = None

    async def wait(self) -> None:
        if self.done:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def set(self) -> None:
        self.done = True
        if self._event is not None:
            self._event.set()


class Once:
    """An async step run once, by its first caller, shielded from cancellation.

    Later callers wait for that run instead of racing it (two closers would
    release a lock under a running write; a binding a flush and a release both
    need must not run twice). A failure of the run is its first caller's.
    """

    __slots__ = ("_ran",)

    def __init__(self) -> None:
        self._ran: _Settled | None = None

    @property
    def done(self) -> bool:
        """The step ran to its end (successfully or not)."""
        return self._ran is not None and self._ran.done

    async def run(self, step: Callable[[], Awaitable[None]]) -> None:
        ran = self._ran
        if ran is not None:
            await ran.wait()  # at once when done (every flush of a bound session asks)
            return
        ran = self._ran = _Settled()
        try:
            with anyio.CancelScope(shield=True):
                await step()
        finally:
            ran.set()


# --------------------------------------------------------------------------- the controller


class _Barrier(_Settled):
    """One shared flush: every concurrent caller waits for it to settle (:meth:`wait`)."""

    __slots__ = ("abandoned", "error")

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None
        #: The task running the barrier was cancelled; waiters start their own.
        self.abandoned = False


class WriteBehind(Generic[T]):
    """The pending queue, the window, the single active write and the flush barrier.

    ``write(batch)`` persists one batch all-or-nothing (raising leaves nothing
    written). It is called with an empty batch only by a flush with nothing
    pending when ``wants_empty_write()`` says so. ``spawn`` starts the window's
    background task; without it (``None``), or when it refuses (the host is
    shutting down), buffered items wait for a flush. ``report(exc)`` logs a
    background failure.
    """

    def __init__(
        self,
        *,
        write: Callable[[Sequence[T]], Awaitable[None]],
        spawn: Spawn | None,
        report: Callable[[BaseException], None],
        wants_empty_write: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = anyio.current_time,
        sleep_until: Callable[[float], Awaitable[Any]] | None = None,
        window: float = WINDOW_SECONDS,
    ) -> None:
        self._write = write
        self._spawn = spawn
        self._report = report
        self._wants_empty_write = wants_empty_write
        self._clock = clock
        self._sleep_until = sleep_until
        self._window = window
        self.pending: list[T] = []
        #: The batch being written (set when its write ends), or None.
        self._active: _Settled | None = None
        self._deadline: float | None = None
        self._sleeper: anyio.CancelScope | None = None
        self._expired = False
        self._paused = False
        self._reported = False
        self._barrier: _Barrier | None = None

    # ----------------------------------------------------------------- state

    @property
    def writing(self) -> bool:
        """A batch is being written right now."""
        return self._active is not None

    @property
    def window_armed(self) -> bool:
        return self._deadline is not None

    @property
    def paused(self) -> bool:
        """Automatic writing stopped after a failure (until the next event or flush)."""
        return self._paused

    @property
    def idle(self) -> bool:
        """Nothing pending, nothing being written, no flush running."""
        return not self.pending and self._active is None and self._barrier is None

    # ------------------------------------------------------------- admission

    def admit(self, items: Sequence[T]) -> None:
        """Queue ``items`` (already validated) behind everything admitted before."""
        if not items:
            return
        was_empty = not self.pending
        self.pending.extend(items)
        if self._barrier is not None:
            return  # the running barrier drains them; no window of their own
        if self._paused:
            self._paused = False
            self._arm()
        elif was_empty:
            self._arm()

    def _arm(self) -> None:
        """Open a window ending one window from now.

        At most one sleeper task is alive per controller: a sleeper still waiting
        for an earlier deadline (windows only move forward) sleeps on to the new
        one when it wakes, so arming costs no task spawn and disarming no
        cancellation (the checkpoint policy arms and disarms three windows a step).
        """
        if self._spawn is None:
            self._deadline = None
            return
        self._deadline = deadline = self._clock() + self._window
        if self._sleeper is not None:
            return
        scope = self._sleeper = anyio.CancelScope()
        try:
            self._spawn(functools.partial(self._run_window, scope, deadline))
        except Exception:  # e.g. the host is shutting down: the items wait for a flush
            self.cancel_window()

    def _disarm(self) -> None:
        """Close the window without waking its sleeper (it ends at its deadline if nothing
        was armed again by then)."""
        self._deadline = None

    def cancel_window(self) -> None:
        """Disarm the window and cancel its sleeping task: nothing is written by it."""
        self._deadline = None
        sleeper, self._sleeper = self._sleeper, None
        if sleeper is not None:
            sleeper.cancel()

    async def _run_window(self, scope: anyio.CancelScope, deadline: float) -> None:
        sleep = self._sleep_until or window_sleep_until
        expired = False
        with scope:
            while True:
                await sleep(deadline)
                current = self._deadline
                if current == deadline:
                    expired = True
                    break
                if current is None:
                    break  # disarmed (a flush drained the batch) and not armed again
                deadline = current  # re-armed meanwhile: a later deadline
        if self._sleeper is scope:
            self._sleeper = None  # a window armed from here on gets a sleeper of its own
        if not expired or scope.cancel_called or self._barrier is not None:
            return
        self._deadline = None
        if self._active is not None:
            self._expired = True  # the writer picks the batch up when it settles
            return
        await self._background_writes()

    async def _background_writes(self) -> None:
        while self.pending and self._barrier is None:
            try:
                await self._write_one()
            except Exception as exc:
                if self._barrier is not None:
                    return  # a flush is waiting for this write; it retries the batch
                self.cancel_window()
                self._paused = True
                self._expired = False
                if not self._reported:
                    self._reported = True
                    self._report(exc)
                return
            if not self._expired:
                return  # a newer batch (if any) keeps its own window
            self._expired = False

    async def _write_one(self) -> None:
        """Write the whole queue as one batch; on any failure put it back in front."""
        batch, self.pending = self.pending, []
        active = self._active = _Settled()
        try:
            await self._write(batch)
        except BaseException:
            self.pending[:0] = batch
            raise
        finally:
            self._active = None
            active.set()
        self._reported = False

    # --------------------------------------------------------------- barrier

    async def flush(self) -> None:
        """Write everything admitted so far (and meanwhile); return once it is stored."""
        while self._barrier is not None:
            shared = self._barrier
            await shared.wait()
            if shared.error is not None:
                raise shared.error
            if not shared.abandoned:
                return
        barrier = self._barrier = _Barrier()
        try:
            self._disarm()
            self._paused = False
            self._expired = False
            if self._active is not None:
                # Its failure (if any) already put the batch back; we retry it below.
                await self._active.wait()
            wrote = False
            while self.pending:
                try:
                    await self._write_one()
                except Exception as exc:
                    self._paused = True
                    barrier.error = exc
                    raise
                wrote = True
            if not wrote and self._wants_empty_write():
                try:
                    await self._write([])
                except Exception as exc:
                    barrier.error = exc
                    raise
        except BaseException:
            if barrier.error is None:
                # Cancelled: let waiters run their own barrier, and keep the
                # queue moving if nobody flushes again.
                barrier.abandoned = True
                if self.pending and not self._paused:
                    self._arm()
            raise
        finally:
            self._barrier = None  # closes admission before anyone resumes
            barrier.set()


# --------------------------------------------------------------------------- the handle


class HandleOwner(Protocol):
    """What a write handle needs from the service that made it."""

    @property
    def name(self) -> str: ...

    @property
    def logger(self) -> logging.Logger: ...

    @property
    def spawn(self) -> Spawn | None: ...

    def forget(self, handle: Any) -> None:
        """Stop tracking ``handle`` as the owner of its session (it released ownership)."""
        ...


class WriteHandle(Generic[L]):
    """The one :class:`~dsh_host._persistence.persistence.SessionWriteHandle`, over any storage.

    It validates and admits batches, keeps them in the write-behind queue until
    stored, and holds the storage's lease (ownership) from the first durable
    batch (``create``) or from ``open(id, "write")`` until ``close``.

    The events themselves are kept once: a handle opened for a stored session
    holds the stored events until a live session is bound to it
    (:meth:`bind`); from then on the log *is* that session's ``events`` and the
    handle keeps only a count (``next_seq``) and the durable cursor.
    """

    mode: Literal["write"] = "write"

    def __init__(
        self,
        owner: HandleOwner,
        storage: SessionStorage[L],
        header: SessionHeader,
        *,
        lease: L | None = None,
        load: SessionLoad | None = None,
    ) -> None:
        self._owner = owner
        self._storage = storage
        self._header = header
        self._lease = lease
        events = packed_copy(load.events) if load is not None else PackedLog()
        #: The log while no session is bound (None once one is: its events are the log);
        #: packed like a session's, docs/decisions.md D37.
        self._own: PackedLog | None = events
        self._bound: Session | None = None
        self._accepted = len(events)
        #: Durable count: the first ``cursor`` events are stored.
        self._cursor = len(events)
        #: What a crash left after the stored log; repaired by the first write.
        self._torn = load.torn_tail if load is not None else None
        #: Why this handle may not write any more: a poisoned fsync or a lost lock.
        self._problem: BaseException | None = None
        self._closed = False
        self._closing = Once()
        #: Its live session left the store: the release under way is this handle's last act.
        self._detached = False
        self._batcher: WriteBehind[Pending] = WriteBehind(
            write=self._write,
            spawn=owner.spawn,
            report=self._report,
            wants_empty_write=self._wants_empty_write,
        )

    # -- what every handle shows (the seam documents each)

    @property
    def next_seq(self) -> int:
        return self._accepted

    @property
    def durable_seq(self) -> int:
        return self._cursor

    @property
    def id(self) -> str:
        return self._header.id

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def detached(self) -> bool:
        """The live session it persisted left the store (its release is due or running)."""
        return self._detached

    def detach(self) -> None:
        """Mark the handle as released by its binding: its session is gone, so a new
        ``open(id, "write")`` in this process finishes this close first instead of being
        refused (the lock is not held for anyone any more, only not yet let go)."""
        self._detached = True

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def lease(self) -> L | None:
        """The storage's per-session state while this handle owns the session."""
        return self._lease

    @property
    def materialized(self) -> bool:
        """The session is stored (its header at least)."""
        return self._lease is not None

    @property
    def write_behind(self) -> WriteBehind[Pending]:
        """The controller deciding when batches are written (for inspection)."""
        return self._batcher

    @property
    def bound(self) -> Session | None:
        """The live session whose events are this handle's log, if any."""
        return self._bound

    def accepted_events(self) -> Sequence[SessionEvent]:
        """Every event this handle holds: stored at open plus appended since."""
        if self._own is not None:
            return self._own
        assert self._bound is not None
        return self._bound.events[: self._accepted]

    def bind(self, session: Session) -> None:
        """Make ``session``'s events this handle's log (the caller checked it reproduces it)."""
        self._bound = session
        self._own = None

    # -- admission

    def _unusable(self) -> BaseException | None:
        """A fresh error for each refusal (re-raising one object would grow its traceback)."""
        problem = self._problem
        if problem is None:
            return None
        if isinstance(problem, SessionOwnershipLostError):
            error: BaseException = SessionOwnershipLostError(str(problem))
        else:
            error = SessionHandlePoisonedError(
                f'write handle of session "{self.id}" is unusable after a failed fsync '
                f"({problem}); what reached the disk is unknown — reopen the session to "
                "continue from what is really stored"
            )
        error.__cause__ = problem
        return error

    def _check_usable(self) -> None:
        if self._closed:
            raise SessionHandleClosedError(
                f'write handle of session "{self.id}" is closed; open the session again'
            )
        problem = self._unusable()
        if problem is not None:
            raise problem

    def _admit_event(self, event: EventLike, index: int) -> Pending:
        if isinstance(event, SessionEvent):
            reject_retired(self.id, event.type, event.seq, event.data)
            return Pending(event, self._storage.encode(event, None))
        where = f'session "{self.id}" append at index {index}'
        if not isinstance(event, Mapping):
            raise SessionAppendRejectedError(
                f"{where}: expected a SessionEvent or a mapping, got {type(event).__qualname__}"
            )
        try:
            wire: dict[str, Any] = to_json_builtins(event, where)
        except NonJsonValueError as error:
            raise SessionAppendRejectedError(
                "session event batch is not losslessly JSON-serializable because it contains "
                f'non-JSON-serializable data (event type "{event.get("type")}"): '
                f"{error.problem} at {error.path}"
            ) from error
        reject_retired(self.id, wire.get("type"), wire.get("seq"), wire.get("data"))
        try:
            typed = decode_event(wire, where=where)
        except InvalidSessionEventError as error:
            raise SessionAppendRejectedError(str(error)) from error
        return Pending(typed, self._storage.encode(typed, wire))

    def append(self, events: Sequence[EventLike]) -> None:
        """Accept a contiguous batch: validated here, ordered and visible, not durable."""
        prepared = [self._admit_event(event, index) for index, event in enumerate(events)]
        if not prepared:
            return
        self._check_usable()
        expected = self._accepted
        for index, item in enumerate(prepared):
            typed = item.event
            if typed.seq != expected + index:
                raise SessionAppendRejectedError(
                    f'append seq mismatch for "{self.id}": expected {expected + index} at index '
                    f'{index}, got {typed.seq} (event type "{typed.type}")'
                )
        if self._own is not None:
            self._own.extend(item.event for item in prepared)
        else:
            assert self._bound is not None
            live = self._bound.events
            if len(live) < expected + len(prepared) or any(
                live[item.seq] is not item.event and live[item.seq] != item.event
                for item in prepared
            ):
                raise self._not_the_live_session()
        self._accepted += len(prepared)
        self._batcher.admit(prepared)

    def _not_the_live_session(self) -> SessionAppendRejectedError:
        return SessionAppendRejectedError(
            f'session "{self.id}" is bound to a live session: append to the session, '
            "not to its write handle"
        )

    def admit_live(self, event: SessionEvent) -> None:
        """Route one live ``session/event``: events this handle already has are skipped.

        The common case (the bound session's next event, the handle usable) runs
        :meth:`append`'s checks for one event in the same order without building a
        batch; anything else takes :meth:`append` itself, with its exact refusals.
        """
        seq = event.seq
        expected = self._accepted
        if seq < expected:
            return
        bound = self._bound
        if bound is None or seq != expected or self._closed or self._problem is not None:
            self.append([event])
            return
        reject_retired(self._header.id, event.type, seq, event.data)
        pending = Pending(event, self._storage.encode(event, None))
        # The bound session's newest event is the common case: no snapshot of its log needed.
        if bound.last_event is not event or bound.seq != seq + 1:
            live = bound.events
            if len(live) <= seq or (live[seq] is not event and live[seq] != event):
                raise self._not_the_live_session()
        self._accepted = seq + 1
        self._batcher.admit((pending,))

    # -- writing

    def _wants_empty_write(self) -> bool:
        """A flush with nothing buffered still writes: to publish, or to repair a torn tail."""
        return self._lease is None or self._torn is not None

    async def _write(self, batch: Sequence[Pending]) -> None:
        problem = self._unusable()
        if problem is not None:
            raise problem
        try:
            if self._lease is None:
                self._lease = await self._storage.materialize(self._header, batch)
            else:
                await self._storage.append(self._lease, batch)
        except SessionOwnershipLostError as error:
            self._problem = error
            raise
        except SessionWriteError as error:
            if error.unknown_state is not None:
                self._problem = error.unknown_state
            raise
        self._cursor += len(batch)
        self._torn = None

    def _report(self, error: BaseException) -> None:
        self._owner.logger.warning(
            '%s: background write for session "%s" failed (buffered events retained): %s',
            self._owner.name,
            self.id,
            error,
        )

    def flush(self) -> Coroutine[Any, Any, None]:
        """Return once everything appended so far is durable (see the seam): awaiting it
        awaits the write-behind's barrier itself, after this handle's check, with no frame
        of the handle's own in between (docs/decisions.md D50)."""
        self._check_usable()
        return self._batcher.flush()

    async def read(self) -> SessionLoad:
        """Stored plus appended events, as this handle sees them (no closers)."""
        if self._closed:
            raise SessionHandleClosedError(f'write handle of session "{self.id}" is closed')
        return SessionLoad(
            header=self._header,
            events=self._stored_copy(),
            revision=f"written:{self._cursor}" if self._lease is not None else "unmaterialized",
            location=self._storage.locate(self._header),
            torn_tail=self._torn,
            source_version=self._format_version(),
        )

    def _stored_copy(self) -> Sequence[SessionEvent]:
        """``accepted_events()`` as a log of its own: the packed pages shared (D37)."""
        if self._own is not None:
            return self._own.copy()
        assert self._bound is not None
        backing = self._bound.events.lineage
        if isinstance(backing, PackedLog):
            return backing.copy(self._accepted)
        return tuple(self.accepted_events())

    def _format_version(self) -> int:
        """The format version of the log this handle writes: its lease's ``version`` when the
        storage keeps one per session (JSONL: a v4 log continues in v4 whatever the root
        writes), else the storage's ``write_version`` for a session not stored yet, else 3
        (the core's format). ``read`` reports it, so a write handle and a read handle of the
        same log agree on what it is."""
        owner = self._lease if self._lease is not None else self._storage
        version = getattr(owner, "version" if self._lease is not None else "write_version", None)
        return version if type(version) is int else 3

    # -- lifecycle

    async def close(self) -> None:
        """Final drain, then release ownership. Idempotent, also under concurrency.

        The drain is shielded from cancellation: a close that is cancelled still
        writes what was appended. A second caller while a close runs waits for
        that close to finish instead of racing it (two closers would release the
        lock under a running write). A failed drain still releases. A handle
        whose lock was lost raises that loss when events are not known stored.
        """
        if not self._closed:
            await self._closing.run(self._close_once)

    async def _close_once(self) -> None:
        error: BaseException | None = None
        try:
            if self._problem is None:
                if not self._batcher.idle or self._torn is not None:
                    await self._batcher.flush()
            elif isinstance(self._problem, SessionOwnershipLostError):
                if self._cursor < self._accepted:
                    error = self._unusable()
        finally:
            await self.abandon()
        if error is not None:
            raise error

    async def abandon(self) -> None:
        """Release ownership without draining. Idempotent."""
        self._batcher.cancel_window()
        self._closed = True
        self._owner.forget(self)
        lease, self._lease = self._lease, None
        if lease is not None:
            with anyio.CancelScope(shield=True):
                await self._storage.release(lease)

    async def __aenter__(self) -> WriteHandle[L]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
