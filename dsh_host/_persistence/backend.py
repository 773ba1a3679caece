"""The ``sessionPersistence`` service, composed from any storage.

:class:`PersistenceService` is the one implementation of
:class:`~dsh_host._persistence.persistence.SessionPersistence`: it wraps a
:class:`~dsh_host._persistence.storage.SessionStorage` (JSONL, PostgreSQL, SQLite,
memory) and adds what is the same everywhere: header validation, at most one
write handle per session id and service instance (:class:`HandleRegistry`),
``open``'s mode dispatch, ``inspect``, ``read_from``, cancellation checks and
teardown. Write handles are :class:`~dsh_host._persistence.write_behind.WriteHandle`.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from dsh_host._persistence.persistence import (
    ArtifactLocation,
    OpenMode,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionAppendRejectedError,
    SessionHandleClosedError,
    SessionListing,
    SessionLoad,
    SessionNotFoundError,
    SnapshotReadHandle,
    UnreadableListing,
    check_from_seq,
    with_closers,
)
from dsh_host._persistence.storage import (
    L,
    SessionStorage,
    SupportsCurrentRevision,
    SupportsHeldBy,
    SupportsReadFrom,
    SupportsRoot,
    SupportsStoredEnds,
)
from dsh_host._persistence.write_behind import Spawn, WriteHandle, header_meta
from dsh_host._session.errors import InvalidSessionHeaderError
from dsh_host._session.events import SessionEvent
from dsh_host._session.header import (
    SessionHeader,
    header_from_meta,
)

if TYPE_CHECKING:
    from dsh_host._cancel import CancelToken

__all__ = ["HandleRegistry", "PersistenceService", "new_header"]

H = TypeVar("H", bound=WriteHandle[Any])


def new_header(header: SessionHeader | Mapping[str, Any]) -> SessionHeader:
    """Validate a header for ``create`` (errors never reserve the id): :func:`header_from_meta`,
    its refusal as :class:`SessionAppendRejectedError`."""
    try:
        return header_from_meta(header_meta(header))
    except InvalidSessionHeaderError as error:
        raise SessionAppendRejectedError(str(error)) from error


class HandleRegistry(Generic[H]):
    """The write handles one backend instance owns: at most one per session id.

    An id is reserved while its ``create`` or ``open(id, "write")`` does I/O, so
    a second one for the same id is refused at once: ownership is never waited for.
    """

    def __init__(self) -> None:
        self._owners: dict[str, H] = {}
        self._reserved: set[str] = set()

    def owner(self, session_id: str) -> H | None:
        return self._owners.get(session_id)

    def forget(self, handle: H) -> None:
        if self._owners.get(handle.id) is handle:
            del self._owners[handle.id]

    @contextlib.contextmanager
    def reserve(self, session_id: str, *, new: bool) -> Iterator[None]:
        """Hold ``session_id`` while a handle for it is made; :meth:`add` it before leaving.

        ``new``: for ``create`` (:class:`SessionAlreadyExistsError`), else for ``open``
        (:class:`SessionAlreadyOwnedError`).
        """
        if session_id in self._owners or session_id in self._reserved:
            if new:
                raise SessionAlreadyExistsError(
                    f'session "{session_id}" already exists in this backend'
                )
            raise SessionAlreadyOwnedError(
                f'session "{session_id}" already has a write handle in this process; close it '
                "before opening another"
            )
        self._reserved.add(session_id)
        try:
            yield
        finally:
            self._reserved.discard(session_id)

    def add(self, handle: H) -> H:
        """Track ``handle`` as its session's owner (its id is reserved by the caller)."""
        self._owners[handle.id] = handle
        return handle

    async def close_all(
        self, *, name: str, logger: logging.Logger
    ) -> ExceptionGroup[Exception] | None:
        """Close every handle even if some fail; the failures (logged) as one group, or None."""
        failures: list[Exception] = []
        for handle in list(self._owners.values()):
            try:
                await handle.close()
            except Exception as error:
                failures.append(error)
                logger.error("%s dispose failed for %s: %s", name, handle.id, error)
        return ExceptionGroup(f"{name} dispose failed", failures) if failures else None


class PersistenceService(Generic[L]):
    """``sessionPersistence`` over one storage; ``L`` is the storage's lease type.

    ``spawn`` starts a background task (``ctx.start_soon`` or a task group's
    ``start_soon``) for the 200 ms write-behind window; without it, buffered
    events wait for an explicit flush.
    """

    def __init__(
        self,
        storage: SessionStorage[L],
        *,
        spawn: Spawn | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.storage = storage
        #: The plugin's entry-point name (log messages, error groups).
        self.name = storage.name
        #: Starts write windows as background tasks; None: buffered events wait for a flush.
        self.spawn = spawn
        self.logger = logger or logging.getLogger(f"dsh.{storage.name}")
        self._handles: HandleRegistry[WriteHandle[L]] = HandleRegistry()
        self._closed = False
        #: session id -> (revision, next seq) of its log when ``read_from`` last read it whole
        self._read_ends: dict[str, tuple[str, int]] = {}

    def _check_open(self) -> None:
        if self._closed:
            raise SessionHandleClosedError(f"{self.name} is closed")

    # -- the seam

    async def create(self, header: SessionHeader | Mapping[str, Any]) -> WriteHandle[L]:
        """A write handle for a new session; nothing is written until its first flush."""
        typed = new_header(header)
        self._check_open()
        with self._handles.reserve(typed.id, new=True):
            await self.storage.check_new(typed)
            return self._handles.add(WriteHandle(self, self.storage, typed))

    @overload
    async def open(
        self, session_id: str, mode: Literal["read"], *, token: CancelToken | None = None
    ) -> SnapshotReadHandle: ...

    @overload
    async def open(
        self, session_id: str, mode: Literal["write"], *, token: CancelToken | None = None
    ) -> WriteHandle[L]: ...

    async def open(
        self, session_id: str, mode: OpenMode, *, token: CancelToken | None = None
    ) -> SnapshotReadHandle | WriteHandle[L]:
        """``read``: a snapshot, no lock. ``write``: take ownership or fail at once; an owner
        here whose live session has left the store (``WriteHandle.detached``) is not a writer
        any more, so its close is finished first instead."""
        if mode == "read":
            return SnapshotReadHandle(await self._load(session_id, token))
        if mode != "write":
            raise ValueError(f'open mode must be "read" or "write", got {mode!r}')
        if token is not None:
            token.throw_if_aborted()
        self._check_open()
        owner = self._handles.owner(session_id)
        if owner is not None and owner.detached:
            # Its session left the store and its release is due: finish that close (drain,
            # then let the lock go; the binding's own release waits for the same one) rather
            # than refuse an owner that is only on its way out. A live owner is refused.
            await owner.close()
        with self._handles.reserve(session_id, new=False):
            lease, load = await self.storage.acquire(session_id)
            handle = WriteHandle(self, self.storage, load.header, lease=lease, load=load)
            return self._handles.add(handle)

    async def _load(self, session_id: str, token: CancelToken | None) -> SessionLoad:
        if token is not None:
            token.throw_if_aborted()
        load = await self.storage.load(session_id)
        if token is not None:
            token.throw_if_aborted()
        return load

    async def inspect(self, session_id: str, *, token: CancelToken | None = None) -> SessionLoad:
        """A read plus in-memory crash closers (nothing is written or truncated)."""
        return with_closers(await self._load(session_id, token))

    async def read_from(
        self,
        session_id: str,
        from_seq: int,
        *,
        limit: int | None = None,
        token: CancelToken | None = None,
    ) -> tuple[SessionEvent, ...]:
        """Stored events with ``seq >= from_seq`` (no closers, nothing written); with
        ``limit``, at most that many (a page: a reader that walks a long log page by page holds
        one page at a time; a storage whose ``read_from`` takes ``limit`` reads only the page).

        A storage with its own ``read_from(session_id, from_seq)`` reads only those. Any other
        reads the log whole, except when nothing can be new: the storage's
        ``current_revision`` is the one this service last read the log at, and ``from_seq`` is
        past its end. A follower polling an idle session (``dsh serve``'s event stream, twice
        a second) then costs that look-up, not a decode of the whole log.
        """
        check_from_seq(from_seq)
        storage = self.storage
        if not isinstance(storage, SupportsReadFrom):
            known = self._read_ends.get(session_id)
            if known is not None and from_seq >= known[1]:
                if await self.current_revision(session_id) == known[0]:
                    return ()
            load = await self._load(session_id, token)
            self._read_ends[session_id] = (load.revision, load.next_seq)
            return tuple(load.events[from_seq : None if limit is None else from_seq + limit])
        if token is not None:
            token.throw_if_aborted()
        read_from: Any = storage.read_from  # a third-party storage's may not take ``limit``
        events: tuple[SessionEvent, ...]
        if limit is None:
            events = await read_from(session_id, from_seq)
        elif "limit" in inspect.signature(read_from).parameters:
            events = await read_from(session_id, from_seq, limit=limit)
        else:
            events = (await read_from(session_id, from_seq))[:limit]
        if token is not None:
            token.throw_if_aborted()
        return events

    async def walk(
        self, session_id: str, *, page: int = 1024, token: CancelToken | None = None
    ) -> AsyncIterator[tuple[SessionEvent, ...]]:
        """The stored log from seq 0, ``page`` events at a time (:meth:`read_from` with a
        limit): a reader of a long log holds one page, not the log."""
        seq = 0
        while True:
            events = await self.read_from(session_id, seq, limit=page, token=token)
            if events:
                yield events
            if len(events) < page:
                return
            seq = events[-1].seq + 1

    async def stored_header(self, session_id: str) -> SessionHeader:
        """The stored header of one session, from the listing (no event is read): what a
        reader that walks the log page by page needs besides its events (D33)."""
        for listing in await self.list(unreadable=[]):
            if listing.header.id == session_id:
                return listing.header
        raise SessionNotFoundError(f'session "{session_id}" not found')

    async def stored_next_seq(self, session_id: str) -> int | None:
        """The seq after the last stored event (where a new follower starts), from a storage
        with its own ``next_seq`` (JSONL: its cursor, reading only what was appended since its
        last read); None from any other (the caller has its own way, e.g. a summary)."""
        probe = getattr(self.storage, "next_seq", None)
        if probe is None:
            return None
        found: int = await probe(session_id)
        return found

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The seq after the last stored event of each session the storage can tell without a
        read, in one call (D47: PostgreSQL and SQLite one statement, JSONL a ``stat`` and a
        32-byte check per log at its follower's cursor, memory a look-up). An id left out is
        one to read (not stored, or not known without a read): a storage without
        ``stored_ends`` leaves every id out."""
        storage = self.storage
        if not session_ids or not isinstance(storage, SupportsStoredEnds):
            return {}
        return await storage.stored_ends(session_ids)

    async def walked_tail(self, session_id: str) -> tuple[int | None, ArtifactLocation | None]:
        """After a :meth:`walk` to the end: the bytes stored past the last complete record it
        read (0: none; None: unknown, or a storage that cannot tell) and where the log is.
        Only a storage with byte-level tails (JSONL) answers; others say ``(None, None)``."""
        probe = getattr(self.storage, "walked_tail", None)
        if probe is None:
            return None, None
        found: tuple[int | None, ArtifactLocation | None] = await probe(session_id)
        return found

    async def list(
        self,
        *,
        token: CancelToken | None = None,
        unreadable: builtins.list[UnreadableListing] | None = None,
    ) -> builtins.list[SessionListing]:
        """Every stored session's header (events are not read).

        With ``unreadable``, a session whose header is damaged is reported there
        instead of failing the listing.
        """
        if token is not None:
            token.throw_if_aborted()
        listed = await self.storage.list(unreadable)
        if token is not None:
            token.throw_if_aborted()
        return listed

    @property
    def root(self) -> str | None:
        """The directory a file storage keeps its logs under (its optional ``root``).

        The host refuses to boot a composition whose tools could write it (D15).
        """
        storage = self.storage
        if not isinstance(storage, SupportsRoot):
            return None
        return storage.root if isinstance(storage.root, str) else None

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """Where this session's log lives (or will). Performs no I/O."""
        return self.storage.locate(header)

    async def held_by(self, session_id: str) -> str | None:
        """Who holds the session's write lock now, when the storage can tell (else None)."""
        storage = self.storage
        return await storage.held_by(session_id) if isinstance(storage, SupportsHeldBy) else None

    async def current_revision(self, session_id: str) -> str | None:
        """The revision a read of the session would report now, without reading its events,
        when the storage can tell cheaply (else None, and so for a session it does not find):
        a caller that kept what it read under a revision learns whether to read again."""
        storage = self.storage
        if not isinstance(storage, SupportsCurrentRevision):
            return None
        return await storage.current_revision(session_id)

    # -- tracking and teardown

    def owner(self, session_id: str) -> WriteHandle[L] | None:
        """The write handle this instance holds for ``session_id``, if any."""
        return self._handles.owner(session_id)

    def forget(self, handle: WriteHandle[L]) -> None:
        """``handle`` released ownership: stop tracking it."""
        self._handles.forget(handle)

    async def aclose(self) -> None:
        """Drain and release every handle, then close the storage.

        Each handle is closed even if another one fails; the failures are
        raised together as ``<backend> dispose failed``.
        """
        self._closed = True
        failures = await self._handles.close_all(name=self.name, logger=self.logger)
        await self.storage.close()
        if failures is not None:
            raise failures

    async def __aenter__(self) -> PersistenceService[L]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
