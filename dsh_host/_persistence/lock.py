"""Cross-process write ownership: a non-blocking ``flock`` on one lock file per session.

The one implementation every file-backed storage uses (the JSONL store locks
``<session dir>/session.lock``, the SQLite store a file per session id under its lock
directory), exported by :mod:`dsh_host.sdk` as :class:`SessionLock`.

Why ``flock`` and not ``lockf``/``fcntl(F_SETLK)``: DSH takes BSD ``flock``
locks, and on Linux POSIX record locks do not exclude ``flock`` holders, so a
Python writer must use the same primitive to exclude a DSH writer (and vice
versa). ``flock`` locks belong to the open file description, so two backend
instances in one process exclude each other too.

The lock file is never deleted: unlinking it would let a second locker lock a
fresh inode while the first still holds the old one. It stays empty, as DSH's
is: who holds it is read from the kernel (``/proc/locks``, :func:`lock_holder`),
never from the file. For the same reason,
after locking we compare the locked descriptor's inode with the path's and
retry if someone replaced the file between our ``open`` and ``flock``. There
is no expiry: the kernel drops the lock when the holder's process dies, and a
live but wedged holder keeps excluding writers.

The lock is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file
(D20 in docs/decisions.md): a lock file planted as a symlink would otherwise make
the harness create (``O_CREAT``) or lock any file the symlink names, and a FIFO
would block the open. Either is refused with :class:`SessionLockUnsafeError`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Final

from dsh_host._persistence.persistence import (
    SessionAlreadyOwnedError,
    SessionLockUnsafeError,
    SessionOwnershipLostError,
)

__all__ = ["LOCK_NAME", "SessionLock", "held_by_text", "lock_holder"]

LOCK_NAME: Final = "session.lock"
_ATTEMPTS: Final = 3

def _unsafe(session_id: str, path: str, what: str) -> SessionLockUnsafeError:
    return SessionLockUnsafeError(
        f'session "{session_id}": lock file "{path}" is {what}; refusing to open it (a planted '
        "link could make the harness create or lock another file) — remove it and make sure "
        "no tool can write the session directory"
    )


def _open_lock(path: str, session_id: str) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _unsafe(session_id, path, "a symbolic link") from None
        if error.errno == errno.ENXIO:  # a FIFO without a reader
            raise _unsafe(session_id, path, "not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unsafe(session_id, path, "not a regular file")
    return fd


class SessionLock:
    """An acquired ``session.lock``; :meth:`release` (or process exit) frees it."""

    __slots__ = ("_fd", "_identity", "path", "session_id")

    def __init__(self, fd: int, path: str, session_id: str) -> None:
        self._fd: int | None = fd
        # An open descriptor's (device, inode) never changes: read once, so a barrier's
        # check is one ``stat`` of the path, not a ``stat`` and an ``fstat``.
        self._identity = _identity(os.fstat(fd))
        self.path = path
        self.session_id = session_id

    @classmethod
    def acquire(cls, session_dir: str, session_id: str) -> SessionLock:
        """Lock ``<session_dir>/session.lock`` now or raise :class:`SessionAlreadyOwnedError`.

        ``session_dir`` must exist (materialization creates it durably first).
        """
        return cls.acquire_file(os.path.join(session_dir, LOCK_NAME), session_id)

    @classmethod
    def acquire_file(cls, path: str, session_id: str) -> SessionLock:
        """Lock the file at ``path`` (created, mode 0600, if absent; its directory must
        exist) now, or raise :class:`SessionAlreadyOwnedError`; never waits."""
        for _attempt in range(_ATTEMPTS):
            fd = _open_lock(path, session_id)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SessionAlreadyOwnedError(
                    f'session "{session_id}" is already open for writing by another process or '
                    f'backend instance: {held_by_text(lock_holder(path))} (lock "{path}" is '
                    "held); close that writer first — the lock is released when its process exits"
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
        if _path_identity(self.path) != self._identity:
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


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _path_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path`` itself (a symlink is not followed); None if
    nothing is there."""
    try:
        return _identity(os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return None


def _same_file(fd: int, path: str) -> bool:
    return _path_identity(path) == _identity(os.fstat(fd))


_PROC_LOCKS: Final = "/proc/locks"


def lock_holder(path: str) -> int | None:
    """The pid holding a ``flock`` on ``path`` as the kernel reports it, or None.

    Reads ``/proc/locks`` (Linux) and takes no lock, so it is safe for readers.
    None when nobody holds it, the file is absent, or the kernel does not say
    (another OS, or a holder outside this pid namespace); 0 is never returned.
    """
    try:
        st = os.stat(path, follow_symlinks=False)
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1295 fe:00:2327068 0 EOF"; "->" marks a blocked waiter.
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != key:
            continue
        try:
            pid = int(fields[4])
        except ValueError:
            continue
        if pid > 0:
            return pid
    return None


def held_by_text(pid: int | None) -> str:
    """How a held lock's owner is named to people."""
    return f"held by a live writer (pid {pid})" if pid is not None else "held by another process"
