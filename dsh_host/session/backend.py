"""The service half every persistence backend shares: ownership and the ``open`` dispatch.

A backend's service (:class:`~dsh_host.session.persistence.SessionPersistence`)
subclasses :class:`PersistenceBackend` and implements reading and taking
ownership for its storage (``_read``, ``_snapshot``, ``_open_write``) plus
``create``, ``read_from``, ``list``, ``locate`` and ``aclose``. What is the same
everywhere lives here: at most one write handle per session id and backend
instance (:class:`HandleRegistry`), ``open``'s mode dispatch, ``inspect``.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from dsh_host.session.persistence import (
    OpenMode,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionLoad,
    with_closers,
)
from dsh_host.session.write_behind import BufferedWriteHandle, Spawn

if TYPE_CHECKING:
    from dsh_host.cancel import CancelToken

__all__ = ["HandleRegistry", "PersistenceBackend"]

H = TypeVar("H", bound=BufferedWriteHandle[Any])
R = TypeVar("R")


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


class PersistenceBackend(ABC, Generic[R, H]):
    """Shared service half; ``R`` is the backend's read handle, ``H`` its write handle."""

    #: The plugin's entry-point name (log messages, error groups).
    name: str

    def __init__(self, *, spawn: Spawn | None, logger: logging.Logger) -> None:
        #: Starts write windows as background tasks; None: buffered events wait for a flush.
        self.spawn = spawn
        self.logger = logger
        self._handles: HandleRegistry[H] = HandleRegistry()

    # -- storage hooks

    @abstractmethod
    async def _read(self, session_id: str, token: CancelToken | None) -> SessionLoad:
        """The stored log, decoded (no closers); ``token`` is checked around the I/O."""

    @abstractmethod
    def _snapshot(self, load: SessionLoad) -> R:
        """A read handle over ``load``."""

    @abstractmethod
    async def _open_write(self, session_id: str) -> H:
        """Take ownership of a stored session (its id is reserved meanwhile)."""

    # -- the seam

    @overload
    async def open(
        self, session_id: str, mode: Literal["read"], *, token: CancelToken | None = None
    ) -> R: ...

    @overload
    async def open(
        self, session_id: str, mode: Literal["write"], *, token: CancelToken | None = None
    ) -> H: ...

    async def open(
        self, session_id: str, mode: OpenMode, *, token: CancelToken | None = None
    ) -> R | H:
        """``read``: a snapshot, no lock. ``write``: take ownership or fail at once."""
        if mode == "read":
            return self._snapshot(await self._read(session_id, token))
        if mode != "write":
            raise ValueError(f'open mode must be "read" or "write", got {mode!r}')
        if token is not None:
            token.throw_if_aborted()
        with self._handles.reserve(session_id, new=False):
            return self._handles.add(await self._open_write(session_id))

    async def inspect(self, session_id: str, *, token: CancelToken | None = None) -> SessionLoad:
        """A read plus in-memory crash closers (nothing is written or truncated)."""
        return with_closers(await self._read(session_id, token))

    # -- tracking

    def owner(self, session_id: str) -> H | None:
        """The write handle this instance holds for ``session_id``, if any."""
        return self._handles.owner(session_id)

    def forget(self, handle: H) -> None:
        """``handle`` released ownership: stop tracking it."""
        self._handles.forget(handle)
