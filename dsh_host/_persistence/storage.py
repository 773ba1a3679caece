"""The storage seam: the one interface a session storage backend implements.

A backend (JSONL files, PostgreSQL, SQLite, the in-memory one below) stores
one append-only log per session. It implements :class:`SessionStorage` and
nothing else: the host composes any storage into the ``sessionPersistence``
service (:class:`~dsh_host._persistence.backend.PersistenceService`) with its single
write handle, the 200 ms write-behind window, the flush barrier, admission,
poisoning and the live-session binding. docs/storage.md walks through writing one.

What a storage promises, method by method:

* :meth:`~SessionStorage.encode` — the stored JSON of one admitted event, at
  ``append`` time (raise :class:`SessionAppendRejectedError` to refuse it).
* :meth:`~SessionStorage.check_new` — raise :class:`SessionAlreadyExistsError`
  if a log is stored for the header's id (``create`` writes nothing yet).
* :meth:`~SessionStorage.materialize` — publish header + first batch
  *all-or-nothing, durably*, and take write ownership; the returned *lease*
  is the storage's own per-session state (a lock, a descriptor, a connection).
* :meth:`~SessionStorage.acquire` — take ownership of a stored session at
  once (:class:`SessionAlreadyOwnedError`, never waiting) and read its log
  under it.
* :meth:`~SessionStorage.append` — store a batch durably, all-or-nothing,
  continuing the log exactly. An empty batch asks only for pending repairs
  (a torn tail) and is otherwise a no-op. On failure raise
  :class:`SessionWriteError` with nothing stored; set its ``unknown_state``
  when what reached the disk can no longer be known (a failed fsync: the host
  poisons the handle), or raise :class:`SessionOwnershipLostError` when the
  lock is gone (the host refuses further writes).
* :meth:`~SessionStorage.release` — give ownership up. Idempotent.
* :meth:`~SessionStorage.load` / :meth:`~SessionStorage.list` — reads, no lock.
* :meth:`~SessionStorage.close` — free shared resources (a pool).

The host never calls two writes of one lease at once, and never a write
after ``release``. Blocking calls belong on a worker thread
(``anyio.to_thread.run_sync``, or :func:`dsh_host._persistence.offload.run_sync` on a hot
path) so the storage runs under asyncio and trio.
Ownership must die with the process (``flock``, an advisory lock held by a
connection): a crashed writer never blocks its successor.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from dsh_host._persistence.persistence import (
    ArtifactLocation,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionAppendRejectedError,
    SessionListing,
    SessionLoad,
    SessionNotFoundError,
    SessionOwnershipLostError,
    UnreadableListing,
)
from dsh_host._session.events import SessionEvent, encode_event
from dsh_host._session.header import SessionHeader

__all__ = [
    "L",
    "MemoryStorage",
    "Pending",
    "SessionStorage",
    "SupportsCurrentRevision",
    "SupportsHeldBy",
    "SupportsReadFrom",
    "SupportsRoot",
    "SupportsStoredEnds",
    "encode_json",
]

#: A storage's lease: its own state for one owned session (lock, descriptor, connection).
L = TypeVar("L")


@dataclass(frozen=True, slots=True)
class Pending:
    """One admitted event waiting to be stored: the typed event and its stored JSON."""

    event: SessionEvent
    json: bytes

    @property
    def seq(self) -> int:
        return self.event.seq


class SessionStorage(Protocol[L]):
    """Where session logs live. ``L`` is the storage's lease type (see the module doc)."""

    @property
    def name(self) -> str:
        """The plugin name, for log lines and error groups."""
        ...

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """Where this session's log lives (or will). No I/O; ``header`` may be partial."""
        ...

    def encode(self, event: SessionEvent, wire: dict[str, Any] | None) -> bytes:
        """The stored JSON of an admitted event (``wire``: the plain form it was given in)."""
        ...

    async def check_new(self, header: SessionHeader) -> None:
        """Raise :class:`SessionAlreadyExistsError` if a log is stored for ``header.id``."""
        ...

    async def materialize(self, header: SessionHeader, batch: Sequence[Pending]) -> L:
        """Publish header + ``batch`` durably, all-or-nothing, and take ownership.

        Raise :class:`SessionAlreadyExistsError` if someone else stored the id first.
        """
        ...

    async def acquire(self, session_id: str) -> tuple[L, SessionLoad]:
        """Take ownership of a stored session (or raise at once) and read it under the lock."""
        ...

    async def append(self, lease: L, batch: Sequence[Pending]) -> None:
        """Store ``batch`` durably, all-or-nothing (empty: finish pending repairs only)."""
        ...

    async def release(self, lease: L) -> None:
        """Give up ownership. Idempotent; never raises for an already lost lease."""
        ...

    async def load(self, session_id: str) -> SessionLoad:
        """The stored log, no lock (:class:`SessionNotFoundError` when there is none)."""
        ...

    async def list(
        self, unreadable: builtins.list[UnreadableListing] | None
    ) -> builtins.list[SessionListing]:
        """Every stored header; a damaged one goes to ``unreadable`` when given, else raises."""
        ...

    async def close(self) -> None:
        """Free shared resources (pools). Leases are released before. Idempotent."""
        ...


# -- optional capabilities: a storage implements any of them by having the method; the host
#    checks with isinstance (these are runtime-checkable) where it would otherwise do without.


@runtime_checkable
class SupportsReadFrom(Protocol):
    """Reads only the stored events with ``seq >= from_seq`` (a follower's poll).

    Without it the host reads the log whole (and skips even that when
    :class:`SupportsCurrentRevision` says nothing changed)."""

    async def read_from(self, session_id: str, from_seq: int) -> tuple[SessionEvent, ...]: ...


@runtime_checkable
class SupportsCurrentRevision(Protocol):
    """The revision a read of the session would report now, without reading its events
    (None for a session it does not find): lets readers skip re-reading an unchanged log."""

    async def current_revision(self, session_id: str) -> str | None: ...


@runtime_checkable
class SupportsStoredEnds(Protocol):
    """The seq after the last stored event of each of many sessions, in one call and without
    reading their events: what a server's idle poll asks every ``poll_interval`` (D47).

    An id the answer leaves out is one the storage cannot tell without a read (its log is not
    stored, or is not at a point it can vouch for): the caller reads that session."""

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]: ...


@runtime_checkable
class SupportsHeldBy(Protocol):
    """Who holds the session's write lock now (None: nobody, as far as it can tell)."""

    async def held_by(self, session_id: str) -> str | None: ...


@runtime_checkable
class SupportsRoot(Protocol):
    """A file storage's directory: the host refuses a composition whose tools could write it
    (D15)."""

    @property
    def root(self) -> str: ...


def encode_json(event: SessionEvent) -> bytes:
    """The default stored JSON of an event (what :meth:`SessionStorage.encode` may return)."""
    try:
        return encode_event(event)
    except (TypeError, ValueError, msgspec.EncodeError) as error:
        raise SessionAppendRejectedError(
            "session event batch is not losslessly JSON-serializable because it contains "
            f'non-JSON-serializable data (event type "{event.type}"): {error}'
        ) from error


# --------------------------------------------------------------------------- in memory


@dataclass(slots=True)
class _MemoryLog:
    header: SessionHeader
    events: builtins.list[SessionEvent]
    revision: int = 0
    owner: object | None = None


@dataclass(eq=False, slots=True)
class _MemoryLease:
    session_id: str
    released: bool = False


class MemoryStorage:
    """Session logs in a dict: shared by every service built over the same instance.

    Nothing survives the process, so "durable" means "stored in the dict";
    ownership excludes other leases over the same instance. Useful for tests
    and for embedding, and the smallest complete example of the seam.
    """

    name = "session-persistence-memory"

    def __init__(self) -> None:
        self._logs: dict[str, _MemoryLog] = {}

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        sid = header.id if isinstance(header, SessionHeader) else header.get("id")
        return ArtifactLocation("memory", f"memory#{sid}")

    def encode(self, event: SessionEvent, wire: dict[str, Any] | None) -> bytes:
        return encode_json(event)

    async def check_new(self, header: SessionHeader) -> None:
        if header.id in self._logs:
            raise SessionAlreadyExistsError(
                f'session "{header.id}" already has a persisted log in memory; load/resume it '
                "instead of creating"
            )

    async def materialize(self, header: SessionHeader, batch: Sequence[Pending]) -> _MemoryLease:
        await self.check_new(header)
        lease = _MemoryLease(header.id)
        self._logs[header.id] = _MemoryLog(header, [p.event for p in batch], owner=lease)
        return lease

    async def acquire(self, session_id: str) -> tuple[_MemoryLease, SessionLoad]:
        log = self._log(session_id)
        if log.owner is not None:
            raise SessionAlreadyOwnedError(
                f'session "{session_id}" is being written by another handle of this store; '
                "ownership is never waited for — retry after that writer closes"
            )
        lease = log.owner = _MemoryLease(session_id)
        return lease, self._snapshot(log)

    async def append(self, lease: _MemoryLease, batch: Sequence[Pending]) -> None:
        log = self._logs.get(lease.session_id)
        if lease.released or log is None or log.owner is not lease:
            raise SessionOwnershipLostError(
                f'session "{lease.session_id}": write ownership lost — the in-memory log is '
                "owned by another handle"
            )
        if batch and batch[0].seq != len(log.events):
            raise SessionOwnershipLostError(
                f'session "{lease.session_id}": write ownership lost — {len(log.events)} '
                f"event(s) are stored but the batch starts at seq {batch[0].seq}; another "
                "writer wrote this session"
            )
        log.events.extend(p.event for p in batch)
        log.revision += bool(batch)

    async def release(self, lease: _MemoryLease) -> None:
        lease.released = True
        log = self._logs.get(lease.session_id)
        if log is not None and log.owner is lease:
            log.owner = None

    async def load(self, session_id: str) -> SessionLoad:
        return self._snapshot(self._log(session_id))

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]:
        """Each stored session's next seq (a look-up each; D47)."""
        return {
            sid: len(log.events)
            for sid in session_ids
            if (log := self._logs.get(sid)) is not None
        }

    async def list(
        self, unreadable: builtins.list[UnreadableListing] | None
    ) -> builtins.list[SessionListing]:
        out = [
            SessionListing(log.header, self._revision(log), self.locate(log.header))
            for log in self._logs.values()
        ]
        out.sort(key=lambda item: (item.header.created_at, item.header.id))
        return out

    async def close(self) -> None:
        return None

    def _log(self, session_id: str) -> _MemoryLog:
        log = self._logs.get(session_id)
        if log is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        return log

    def _revision(self, log: _MemoryLog) -> str:
        return f"memory:{id(self)}:{log.header.id}:{len(log.events)}"

    def _snapshot(self, log: _MemoryLog) -> SessionLoad:
        return SessionLoad(
            header=log.header,
            events=tuple(log.events),
            revision=self._revision(log),
            location=self.locate(log.header),
        )
