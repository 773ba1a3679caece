"""The persistence seam: what every session storage backend promises.

A backend (JSONL files, PostgreSQL) stores one append-only log per
session and hands it back as a *physically valid, contiguous* prefix. It never
invents events: crash closers are computed by the reader (:attr:`SessionLoad.closers`
in memory for inspection; the resumer appends them through its write handle).

The two halves of durability are separate on purpose (D7):

* :meth:`SessionWriteHandle.append` — the batch is *accepted, ordered and
  visible* to reads through this backend instance. It is **not durable**: the
  backend may buffer it.
* :meth:`SessionWriteHandle.flush` — the durability barrier. When it returns,
  everything appended before the call survives a crash (power loss included,
  as far as the disk honours fsync).

Ownership: a session has at most one write handle per backend instance, and a
backend that can be shared between processes also excludes other processes
(JSONL: ``flock`` on ``session.lock``; PostgreSQL: an advisory lock). A second
writer gets :class:`SessionAlreadyOwnedError` at once; nobody waits.

Errors, all rooted in :class:`dsh_host.errors.DshError`::

    SessionPersistenceError
    ├── SessionNotFoundError             no stored log (and no handle) for that id
    ├── SessionAlreadyExistsError        create() on an id that is tracked or stored
    ├── SessionAlreadyOwnedError         another handle / process holds write ownership
    ├── SessionOwnershipLostError        our lock was taken away under a live handle
    ├── SessionHandleClosedError         use of a handle after close()
    ├── SessionHandlePoisonedError       an fsync failed earlier; reopen to continue
    ├── SessionAppendRejectedError       a batch that may not enter the log (seq gap, non-JSON)
    ├── SessionWriteError                a write/fsync failed (rolled back; cause attached)
    │   └── SessionRollbackError         ... and rolling back failed too (both errors kept)
    ├── SessionPersistenceCorruptionError   stored bytes are damaged (names file and offset)
    ├── SessionFormatUnsupportedError    stored by a newer/older harness; nothing is damaged
    └── SessionGenerationError           publishing a migrated generation was refused
        ├── SessionGenerationSourceChangedError   the source changed while migrating
        └── SessionGenerationConflictError        a different target already exists

A backend implements storage only: :class:`~dsh_host._persistence.storage.SessionStorage`
(the one page a backend author reads, docs/storage.md). The host composes it
into this seam: :class:`~dsh_host._persistence.backend.PersistenceService` (the
service, one write handle per id) and
:class:`~dsh_host._persistence.write_behind.WriteHandle` (admission, the 200 ms
window, the serialized drain); :mod:`dsh_host._persistence.binding` binds live
sessions to them. :class:`SnapshotReadHandle`, :func:`decode_stored_event`,
:func:`check_from_seq` and :func:`with_closers` below are read-side helpers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, overload, runtime_checkable

import msgspec

from dsh_host._jsonsafe import MAX_SAFE_INTEGER, may_hold_unsafe_int
from dsh_host._session.errors import (
    InvalidSessionEventError,
    InvalidSessionHeaderError,
    UnknownEventTypeError,
)
from dsh_host._session.events import SessionEvent, decode_event, decode_event_line
from dsh_host._session.header import SESSION_FORMAT_VERSION, SessionHeader, parse_session_header
from dsh_host._session.packed import PackedLog
from dsh_host.errors import DshError

if TYPE_CHECKING:
    from dsh_host._cancel import CancelToken

__all__ = [
    "ArtifactLocation",
    "EventLike",
    "OpenMode",
    "SessionAlreadyExistsError",
    "SessionAlreadyOwnedError",
    "SessionAppendRejectedError",
    "SessionFormatUnsupportedError",
    "SessionGenerationConflictError",
    "SessionGenerationError",
    "SessionGenerationSourceChangedError",
    "SessionHandleClosedError",
    "SessionHandlePoisonedError",
    "SessionListing",
    "SessionLoad",
    "SessionLockUnsafeError",
    "SessionNotFoundError",
    "SessionOwnershipLostError",
    "SessionPersistence",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionReadHandle",
    "SessionRollbackError",
    "SessionWriteError",
    "SessionWriteHandle",
    "SnapshotReadHandle",
    "StoredEvent",
    "StoredHeader",
    "TornTail",
    "UnreadableListing",
    "check_from_seq",
    "decode_stored_event",
    "decode_stored_header",
    "decode_stored_rows",
    "format_refusal",
    "pack_stored_rows",
    "with_closers",
]

#: How a session is opened: ``"read"`` takes no lock and writes nothing;
#: ``"write"`` takes exclusive ownership.
OpenMode = Literal["read", "write"]

#: A stored event, decoded and validated by the session core's registry. Backends
#: keep events in their wire form (``{type, seq, time, data, ...}``, camelCase
#: keys) and convert at this seam with ``decode_event`` / ``event_to_builtins``.
StoredEvent = SessionEvent

#: A stored session header (``version, id, createdAt, cwd?, parentSession?,
#: isSeeded, origin?, delegationDepth?, agentPreset?``).
StoredHeader = SessionHeader

#: What ``append`` accepts: core events, or their wire form as plain mappings.
EventLike = SessionEvent | Mapping[str, Any]


# --------------------------------------------------------------------------- errors


class SessionPersistenceError(DshError):
    """Base of every error raised by a persistence backend."""

    code: ClassVar[str] = "SESSION_PERSISTENCE"


class SessionNotFoundError(SessionPersistenceError):
    """No stored log exists for the id (``session "<id>" not found``)."""

    code = "SESSION_NOT_FOUND"


class SessionAlreadyExistsError(SessionPersistenceError):
    """``create`` on an id this backend already tracks or has stored."""

    code = "SESSION_ALREADY_EXISTS"


class SessionAlreadyOwnedError(SessionPersistenceError):
    """Another handle (in this process or another one) owns writing to this session.

    Raised immediately: ownership is never waited for and never expires, so a
    live but wedged owner keeps excluding writers until its process exits.
    """

    code = "SESSION_ALREADY_OWNED"


class SessionLockUnsafeError(SessionPersistenceError):
    """A session's lock file is a symlink or not a regular file; nothing was created or
    locked."""

    code = "SESSION_LOCK_UNSAFE"


class SessionOwnershipLostError(SessionPersistenceError):
    """The lock backing a live write handle was removed or replaced underneath it."""

    code = "SESSION_OWNERSHIP_LOST"


class SessionHandleClosedError(SessionPersistenceError):
    """A handle was used after :meth:`close`."""

    code = "SESSION_HANDLE_CLOSED"


class SessionHandlePoisonedError(SessionPersistenceError):
    """An fsync failed on this handle; later appends fail until the session is reopened.

    After a failed fsync the kernel may already have dropped the dirty pages
    and cleared the error, so a retried fsync can report success for data that
    never reached the disk (PostgreSQL's "fsyncgate", 2018). The only honest
    continuation is to reopen and re-read what is really stored.
    """

    code = "SESSION_HANDLE_POISONED"


class SessionAppendRejectedError(SessionPersistenceError, ValueError):
    """A batch may not enter the log: not contiguous, not lossless JSON, or a retired shape."""

    code = "SESSION_APPEND_REJECTED"


class SessionWriteError(SessionPersistenceError):
    """Writing or syncing a batch failed; the stored log was rolled back to its prior length.

    The underlying ``OSError`` is the ``__cause__``; its text ends the message.
    ``unknown_state`` is set (to the error after which it happened) when what
    reached the disk can no longer be known — a failed fsync: the write handle
    is then poisoned (:class:`SessionHandlePoisonedError`).
    """

    code = "SESSION_WRITE_FAILED"

    def __init__(self, message: str, *, unknown_state: BaseException | None = None) -> None:
        super().__init__(message)
        self.unknown_state = unknown_state


class SessionRollbackError(SessionWriteError):
    """A failed append could not be rolled back either.

    ``errors`` holds both failures in order: ``(append_error, rollback_error)``.
    """

    code = "SESSION_ROLLBACK_FAILED"

    def __init__(self, message: str, errors: tuple[BaseException, BaseException]) -> None:
        super().__init__(message, unknown_state=errors[1])
        self.errors = errors


class SessionPersistenceCorruptionError(SessionPersistenceError):
    """Stored bytes are damaged in a way a crash cannot explain; nothing was repaired.

    ``path`` and ``offset`` (byte offset in the stored file, when known) say
    where; the message says what to do.
    """

    code = "SESSION_PERSISTENCE_CORRUPTION"

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class SessionFormatUnsupportedError(SessionPersistenceError):
    """The log was written in a format this build does not read (nothing is damaged).

    ``location`` is the stored artifact, when there is one.
    """

    code = "SESSION_FORMAT_UNSUPPORTED"

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.location = location


class SessionGenerationError(SessionPersistenceError):
    """Publishing a migrated (current-format) generation of a session was refused."""

    code = "SESSION_GENERATION"


class SessionGenerationSourceChangedError(SessionGenerationError):
    """The older generation changed while it was being migrated; nothing was published."""

    code = "SESSION_GENERATION_SOURCE_CHANGED"


class SessionGenerationConflictError(SessionGenerationError):
    """The current-generation target exists and is not the migration being published."""

    code = "SESSION_GENERATION_CONFLICT"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ArtifactLocation:
    """Where a backend keeps (or will keep) a session: a hint, not an authorization.

    ``kind`` is the backend family (``"jsonl"``, ``"postgres"``); ``path`` is an
    absolute file path for file backends, a ``schema.table#id`` style name otherwise.
    """

    kind: str
    path: str


@dataclass(frozen=True, slots=True)
class TornTail:
    """What a crash left after the last complete durable batch.

    ``truncate_to`` is the byte length a write handle cuts the file back to
    before its next batch; ``recovered`` is how many complete events were
    decoded from the torn bytes (they are part of :attr:`SessionLoad.events`
    and are re-written as their own batch before new data). ``size`` is the
    file length that was read. Backends without byte-level tails never report one.
    """

    truncate_to: int
    recovered: int
    size: int


@dataclass(frozen=True, slots=True)
class SessionLoad:
    """A stored session as read: header, contiguous events, and what a crash left.

    ``events`` is exactly what storage holds (including events recovered from
    a torn tail), never repaired. ``closers`` are the synthetic events that
    would balance an interrupted turn (``interrupted_turn_closers``): filled in
    by ``inspect`` (in memory only) and empty on a plain read. A resumer
    appends them through its write handle.

    ``source_version`` is the on-disk format version that was decoded; when it
    is older than the current one, ``events`` were migrated in memory.
    """

    header: StoredHeader
    #: A tuple, or a :class:`~dsh_host._session.packed.PackedLog` (a write handle's read and
    #: the stores' whole reads: older pages held encoded, docs/decisions.md D37).
    events: Sequence[StoredEvent]
    revision: str
    location: ArtifactLocation | None = None
    torn_tail: TornTail | None = None
    closers: tuple[StoredEvent, ...] = ()
    source_version: int = 3

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def last_seq(self) -> int | None:
        """The seq of the last stored event, or None for an empty log."""
        return self.events[-1].seq if self.events else None

    @property
    def next_seq(self) -> int:
        """The seq the next appended event must carry (closers not counted)."""
        return len(self.events)

    @property
    def balanced(self) -> tuple[StoredEvent, ...]:
        """``events + closers``: the log as a resumer will have it after repair."""
        return (*self.events, *self.closers)


@dataclass(frozen=True, slots=True)
class SessionListing:
    """One entry of :meth:`SessionPersistence.list`: the header, read without the events."""

    header: StoredHeader
    revision: str
    location: ArtifactLocation | None = None
    source_version: int = 3


@dataclass(frozen=True, slots=True)
class UnreadableListing:
    """A stored session whose header :meth:`SessionPersistence.list` could not read.

    Reported (instead of failing the whole listing) only when the caller passes
    ``unreadable=[]``: ``session_id`` is the best guess at its id (a JSONL
    session's directory name, decoded), ``error`` what reading it raised.
    """

    session_id: str
    location: ArtifactLocation | None
    error: SessionPersistenceError


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class SessionReadHandle(Protocol):
    """A read-only view of one stored session. Takes no lock, writes nothing."""

    @property
    def id(self) -> str: ...

    @property
    def mode(self) -> Literal["read"]: ...

    async def read(self) -> SessionLoad:
        """The stored log as of :meth:`SessionPersistence.open` (no closers)."""
        ...

    async def close(self) -> None:
        """Release the view. Idempotent."""
        ...


@runtime_checkable
class SessionWriteHandle(Protocol):
    """Exclusive write access to one session.

    Appends must continue the log exactly (``event.seq == next_seq + i``).
    Events are accepted in their wire form (:data:`StoredEvent`) or as the
    session core's typed events, which the backend encodes.
    """

    @property
    def id(self) -> str: ...

    @property
    def mode(self) -> Literal["write"]: ...

    @property
    def header(self) -> StoredHeader: ...

    @property
    def next_seq(self) -> int:
        """The seq the next appended event must carry (stored + buffered)."""
        ...

    @property
    def durable_seq(self) -> int:
        """How many events are known durable (the stored cursor)."""
        ...

    def append(self, events: Sequence[EventLike]) -> None:
        """Accept a contiguous batch: ordered and visible, **not durable**.

        Validation happens here, synchronously: a rejected batch never enters
        the buffer (:class:`SessionAppendRejectedError`). An empty batch is a no-op.
        """
        ...

    async def flush(self) -> None:
        """The durability barrier: returns once everything appended so far is durable.

        Concurrent calls share one drain. On a session with nothing stored yet
        and nothing buffered, publishes a header-only log. Raises the write
        error if persisting fails; the unwritten batch stays buffered.
        """
        ...

    async def read(self) -> SessionLoad:
        """Stored plus appended events, as this handle sees them (no closers)."""
        ...

    async def close(self) -> None:
        """Final flush, then release ownership. Idempotent."""
        ...


@runtime_checkable
class SessionPersistence(Protocol):
    """The ``sessionPersistence`` service."""

    async def create(self, header: SessionHeader | Mapping[str, Any]) -> SessionWriteHandle:
        """Register a new session and return its write handle. Writes nothing.

        The log appears on the first durable batch (or an explicit flush of the
        empty handle). Rejects ids already tracked or stored
        (:class:`SessionAlreadyExistsError`) and invalid headers, without
        reserving the id.
        """
        ...

    @overload
    async def open(
        self, session_id: str, mode: Literal["read"], *, token: CancelToken | None = None
    ) -> SessionReadHandle: ...

    @overload
    async def open(
        self, session_id: str, mode: Literal["write"], *, token: CancelToken | None = None
    ) -> SessionWriteHandle: ...

    async def open(
        self, session_id: str, mode: OpenMode, *, token: CancelToken | None = None
    ) -> SessionReadHandle | SessionWriteHandle:
        """Open a stored session. ``"write"`` takes ownership or raises at once."""
        ...

    async def list(
        self,
        *,
        token: CancelToken | None = None,
        unreadable: list[UnreadableListing] | None = None,
    ) -> list[SessionListing]:
        """Every stored session's header (read from the header alone).

        A session whose header is damaged fails the listing, unless ``unreadable``
        is given: then it is appended there and the others are still listed.
        """
        ...

    async def inspect(self, session_id: str, *, token: CancelToken | None = None) -> SessionLoad:
        """A read plus the closers an interrupted turn needs, synthesized in memory only."""
        ...

    async def read_from(
        self,
        session_id: str,
        from_seq: int,
        *,
        limit: int | None = None,
        token: CancelToken | None = None,
    ) -> tuple[StoredEvent, ...]:
        """Stored events with ``seq >= from_seq`` (no closers; ``()`` at or past the end); at
        most ``limit`` of them (a page) when it is given."""
        ...

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """Where this session's current log lives (or will). Performs no I/O."""
        ...

    async def aclose(self) -> None:
        """Drain and release every handle this instance owns (service teardown)."""
        ...


# --------------------------------------------------------------------------- shared read side


class SnapshotReadHandle:
    """A :class:`SessionReadHandle` over a log decoded at open: no lock, no writes."""

    mode: Literal["read"] = "read"

    def __init__(self, load: SessionLoad) -> None:
        self._load = load
        self._closed = False

    @property
    def id(self) -> str:
        return self._load.id

    async def read(self) -> SessionLoad:
        if self._closed:
            raise SessionHandleClosedError(f'read handle of session "{self.id}" is closed')
        return self._load

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> SnapshotReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def decode_stored_event(
    raw: Mapping[str, Any] | str,
    *,
    session_id: str,
    seq: object,
    where: str,
    parsed_plain: bool = False,
) -> StoredEvent:
    """One stored event through the core registry (the vocabulary check).

    ``where`` names the stored artifact (a file, ``schema.table#id``). A type
    this harness does not know is "written by a newer harness", not damage.
    ``parsed_plain`` is :func:`decode_event`'s (a reader's promise about ``raw``).
    """
    try:
        return decode_event(raw, where=f"stored event at seq {seq}", parsed_plain=parsed_plain)
    except UnknownEventTypeError as error:
        raise SessionFormatUnsupportedError(
            f'session "{session_id}" contains event type "{error.event_type}" (seq {seq}) '
            "unknown to this harness and not marked ignorable; refusing to interpret the log "
            f"— it was likely written by a newer harness (raw log: {where})",
            location=where,
        ) from None
    except InvalidSessionEventError as error:
        raise SessionPersistenceCorruptionError(
            f'stored session "{session_id}" failed validation: {error} (raw log: {where})',
            path=where,
        ) from error


def check_from_seq(from_seq: object) -> int:
    """``read_from``'s argument: a non-negative safe integer (DSH's text)."""
    if type(from_seq) is not int or from_seq < 0 or from_seq > MAX_SAFE_INTEGER:
        raise ValueError(f"readFrom fromSeq must be a non-negative safe integer, got {from_seq!r}")
    return from_seq


def with_closers(load: SessionLoad) -> SessionLoad:
    """``inspect``: the load plus the closers an interrupted turn needs (in memory only)."""
    # here: a header listing loads no crash repair (docs/decisions.md D44)
    from dsh_host._session.repair import interrupted_turn_closers

    return dataclasses.replace(load, closers=tuple(interrupted_turn_closers(load.events)))


def format_refusal(
    session_id: str, version: int, where: str, *, newest: int = SESSION_FORMAT_VERSION
) -> SessionFormatUnsupportedError:
    """The refusal of a header whose log format this build does not read: "upgrade the
    harness" above ``newest`` (a newer harness wrote it), "no upgrade path" below the current
    format. The one text every store gives (``where`` names the raw log)."""
    if version > newest:
        message = (
            f'session "{session_id}" uses log format v{version}, but this harness reads '
            f"DSH's logs up to format v{newest}: the log was written by a newer harness — "
            "upgrade the harness to open it"
        )
    else:
        message = (
            f'session "{session_id}" uses log format v{version}, older than the supported '
            f"v{SESSION_FORMAT_VERSION}, and this build ships no upgrade path for it"
        )
    return SessionFormatUnsupportedError(f"{message} (raw log: {where})", location=where)


def decode_stored_header(session_id: str, text: str | bytes, *, where: str) -> SessionHeader:
    """A header stored as JSON text (a database row): format gate, then validation.

    A version other than the current one is "written by another harness"
    (:class:`SessionFormatUnsupportedError`), not damage; ``where`` names the store.
    """
    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as error:
        raise SessionPersistenceCorruptionError(
            f'stored session "{session_id}" has a header that is not JSON ({where}): {error}',
            path=where,
        ) from error
    if not isinstance(raw, dict):
        raise SessionPersistenceCorruptionError(
            f'stored session "{session_id}" has a header that is not a JSON object ({where})',
            path=where,
        )
    version = raw.get("version")
    if type(version) is int and version != SESSION_FORMAT_VERSION:
        raise format_refusal(session_id, version, where)
    try:
        return parse_session_header(raw, session_id=session_id)
    except InvalidSessionHeaderError as error:
        raise SessionPersistenceCorruptionError(
            f'stored session "{session_id}" failed validation: {error} (raw log: {where})',
            path=where,
        ) from error


def decode_stored_rows(
    session_id: str, rows: Iterable[tuple[int, str | bytes]], first_seq: int, *, where: str
) -> list[StoredEvent]:
    """Stored ``(seq, json)`` rows from ``first_seq`` on, decoded; they must be contiguous.

    A row that is exactly this build's encoding of a valid event (as a text column holds
    it) is decoded in one typed pass (:func:`decode_event_line`); any other row (a jsonb
    column's normalized text, a long digit run, anything doubtful) takes the general path,
    which decides and words every refusal.
    """
    return [event for event, _ in _decoded_row_lines(session_id, rows, first_seq, where=where)]


def pack_stored_rows(
    session_id: str, rows: Iterable[tuple[int, str | bytes]], first_seq: int, *, where: str
) -> PackedLog:
    """:func:`decode_stored_rows` into a :class:`PackedLog`, the rows taken one by one (a
    cursor's): a whole read holds its older pages encoded, never every decoded event at once
    (docs/decisions.md D37)."""
    out = PackedLog()
    for event, line in _decoded_row_lines(session_id, rows, first_seq, where=where):
        out.append_decoded(event, line)  # a row decoded in one pass is packed as it is (D46)
    return out


def _decoded_row_lines(
    session_id: str, rows: Iterable[tuple[int, str | bytes]], first_seq: int, *, where: str
) -> Iterator[tuple[StoredEvent, bytes | None]]:
    """Each row's event, and the row's bytes when :func:`decode_event_line` decoded them."""
    for index, (seq, text) in enumerate(rows):
        line = text.encode("utf-8") if isinstance(text, str) else text
        event: StoredEvent | None = None
        if not may_hold_unsafe_int(line):
            event = decode_event_line(line)
        typed_from = line if event is not None else None
        if event is None:
            raw = text.decode("utf-8") if isinstance(text, bytes) else text
            event = decode_stored_event(raw, session_id=session_id, seq=seq, where=where)
        if seq != first_seq + index or event.seq != seq:
            raise SessionPersistenceCorruptionError(
                f'stored session "{session_id}" failed validation: row {first_seq + index} '
                f"has seq {seq} holding an event with seq {event.seq}; the log must be "
                f"contiguous from 0 (raw log: {where})",
                path=where,
            )
        yield event, typed_from
