"""Durable file operations (blocking; the handle runs them on a worker thread).

The protocol, step by step, is in docs/format.md. In short:

* a new log is published *complete*: header (and first batch) go into a temp
  file that is fsync'd, then hard-linked to its final name — ``link`` fails
  instead of overwriting, so two creators never clobber each other — and the
  directory is fsync'd so the new name survives power loss;
* a later batch is appended and fsync'd; if the write or the fsync fails, the
  file is cut back to its prior length (and fsync'd) before the error is
  raised, so a retry of the same batch never duplicates seqs.

``os.fsync`` is looked up at call time so a test can replace it to inject a
failure.
"""

from __future__ import annotations

import contextlib
import errno
import os

__all__ = [
    "AppendFailed",
    "FsyncFailed",
    "fsync_dir",
    "fsync_dirs",
    "make_dirs_durable",
    "open_for_append",
    "publish_exclusive",
    "seek_end",
    "truncate_durable",
    "write_durable",
]


class AppendFailed(Exception):
    """A write or sync failed; ``rolled_back`` says whether the file was cut back."""

    def __init__(
        self,
        cause: OSError,
        *,
        fsync: bool,
        rollback_error: OSError | None = None,
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.fsync = fsync
        self.rollback_error = rollback_error


class FsyncFailed(OSError):
    """Marks an ``OSError`` that came from ``fsync`` (its state is now unknowable)."""


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as error:
        raise FsyncFailed(error.errno, error.strerror or str(error)) from error


def fsync_dir(path: str) -> None:
    """fsync a directory, so entries created or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(chain: list[str]) -> None:
    """Create each missing directory of ``chain`` (outermost first) with mode 0700.

    The parent of every directory of the chain is fsync'd, created now or not:
    a directory that exists may be one a crashed creator made and never synced,
    so its entry must be made durable before a file that will live in it is
    published.
    """
    for path in chain:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise NotADirectoryError(
                    errno.ENOTDIR, f"session storage path is not a directory: {path}"
                ) from None
        fsync_dir(os.path.dirname(path) or ".")


def fsync_dirs(required: list[str], best_effort: list[str]) -> None:
    """fsync every directory of ``required`` (errors raise), then of ``best_effort`` (ignored).

    Opening a stored log for writing syncs its directory chain this way: a name
    that a crashed creator linked but never synced must not vanish after the
    new writer reported batches durable.
    """
    for path in required:
        fsync_dir(path)
    for path in best_effort:
        with contextlib.suppress(OSError):
            fsync_dir(path)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def publish_exclusive(final_path: str, content: bytes) -> None:
    """Create ``final_path`` holding exactly ``content``, durably, never overwriting.

    Raises ``FileExistsError`` when ``final_path`` already exists (nothing is
    changed then). A temp file left by a crash before the link is harmless:
    readers ignore ``*.tmp``.
    """
    directory = os.path.dirname(final_path)
    temp = os.path.join(directory, f"{os.path.basename(final_path)}.{os.urandom(6).hex()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            _write_all(fd, content)
            _fsync(fd)
        finally:
            os.close(fd)
        os.link(temp, final_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    try:
        fsync_dir(directory)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def open_for_append(path: str) -> int:
    """A descriptor for appending to ``path``; the handle keeps it for its whole life.

    ``O_NOFOLLOW``: the log was published by us as a regular file; a symlink in its place is
    somebody else's, and the harness must not write through it (D20).
    """
    return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def seek_end(fd: int, path: str, prior_size: int) -> None:
    """Put the offset at the log's end, which must be ``prior_size`` (the length this handle
    wrote); another length means someone else wrote to the log: ``RuntimeError``."""
    # One call both reads the length and puts the offset at the end, where the batch goes.
    size = os.lseek(fd, 0, os.SEEK_END)
    if size != prior_size:
        raise RuntimeError(
            f'session log "{path}" is {size} bytes but this handle wrote {prior_size}; '
            "another writer touched it"
        )


def write_durable(fd: int, data: bytes, prior_size: int) -> int:
    """Write ``data`` at the offset (set by :func:`seek_end`) and fsync; return the new size.

    On a write or sync failure the file is truncated back to ``prior_size`` and
    fsync'd, then :class:`AppendFailed` is raised carrying the original error
    (and the rollback's own error, if any).
    """
    try:
        _write_all(fd, data)
        _fsync(fd)
    except OSError as error:
        is_fsync = isinstance(error, FsyncFailed)
        try:
            os.ftruncate(fd, prior_size)
            _fsync(fd)
        except OSError as rollback:
            raise AppendFailed(error, fsync=is_fsync, rollback_error=rollback) from error
        raise AppendFailed(error, fsync=is_fsync) from error
    return prior_size + len(data)


def truncate_durable(fd: int, size: int) -> None:
    """Cut the log to ``size`` bytes and fsync it (torn-tail repair)."""
    os.ftruncate(fd, size)
    _fsync(fd)
