"""Cross-process write ownership: a non-blocking ``flock`` on ``session.lock``.

Why ``flock`` and not ``lockf``/``fcntl(F_SETLK)``: DSH takes BSD ``flock``
locks, and on Linux POSIX record locks do not exclude ``flock`` holders, so a
Python writer must use the same primitive to exclude a DSH writer (and vice
versa). ``flock`` locks belong to the open file description, so two backend
instances in one process exclude each other too.

The lock file is never deleted: unlinking it would let a second locker lock a
fresh inode while the first still holds the old one. For the same reason,
after locking we compare the locked descriptor's inode with the path's and
retry if someone replaced the file between our ``open`` and ``flock``. There
is no expiry: the kernel drops the lock when the holder's process dies, and a
live but wedged holder keeps excluding writers.
"""

from __future__ import annotations

import os
from typing import Final

import portalocker
from portalocker.portalocker import FlockLocker

from dsh_host.session.persistence import SessionAlreadyOwnedError, SessionOwnershipLostError

__all__ = ["LOCK_NAME", "SessionLock"]

LOCK_NAME: Final = "session.lock"
_ATTEMPTS: Final = 3
_LOCKER: Final = FlockLocker()


class SessionLock:
    """An acquired ``session.lock``; :meth:`release` (or process exit) frees it."""

    __slots__ = ("_fd", "path", "session_id")

    def __init__(self, fd: int, path: str, session_id: str) -> None:
        self._fd: int | None = fd
        self.path = path
        self.session_id = session_id

    @classmethod
    def acquire(cls, session_dir: str, session_id: str) -> SessionLock:
        """Lock ``<session_dir>/session.lock`` now or raise :class:`SessionAlreadyOwnedError`.

        ``session_dir`` must exist (materialization creates it durably first).
        """
        path = os.path.join(session_dir, LOCK_NAME)
        for _attempt in range(_ATTEMPTS):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                _LOCKER.lock(
                    fd, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
                )
            except portalocker.AlreadyLocked:
                os.close(fd)
                raise SessionAlreadyOwnedError(
                    f'session "{session_id}" is already open for writing by another process or '
                    f'backend instance (lock "{path}" is held); close that writer first — the '
                    "lock is released when its process exits"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = _same_file(fd, path)
            except BaseException:
                os.close(fd)
                raise
            if same:
                return cls(fd, path, session_id)
            os.close(fd)  # replaced between open and flock: try the new file
        raise SessionAlreadyOwnedError(
            f'session "{session_id}": lock file "{path}" kept being replaced while locking; '
            "another process is interfering with it"
        )

    def check(self) -> None:
        """Raise :class:`SessionOwnershipLostError` if the lock file was removed or replaced."""
        if self._fd is None:
            raise SessionOwnershipLostError(f'session "{self.session_id}": lock already released')
        if not _same_file(self._fd, self.path):
            raise SessionOwnershipLostError(
                f'session "{self.session_id}": lock file "{self.path}" was removed or replaced '
                "while this handle owned it; another writer may now own the session — reopen it"
            )

    def release(self) -> None:
        """Close the descriptor, which drops the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
