"""Opening files beneath a directory descriptor, so a racing process cannot move the open out.

In-process file tools run in the harness, outside the sandbox, while a confined command (or a
child it left behind) may be rewriting the same tree. A path that was checked and then opened by
name can be redirected between the two steps: swap ``ws/d`` for a symlink to ``/etc`` and a
write to ``d/x`` lands in ``/etc`` (D20). Everything here resolves from a descriptor of
the root directory and never follows a symbolic link:

* :func:`open_beneath` uses ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
  RESOLVE_NO_MAGICLINKS)`` (Linux 5.6+), and where the kernel does not have it (``ENOSYS``) an
  equivalent walk: one component at a time, each opened ``O_NOFOLLOW | O_DIRECTORY`` relative to
  the previous directory's descriptor;
* :func:`open_dirs_beneath` walks (creating what is missing) to a directory and returns its
  descriptor, for a caller that then creates a file in it (``O_EXCL | O_NOFOLLOW``) and renames
  relative to the same descriptor.

Paths are split by :func:`beneath_parts`, which refuses ``..`` outright (both resolvers then
agree), an absolute path not lexically under the root, and NUL bytes. Errors are ``OSError``
with the kernel's errno (``ELOOP``: a symlink in the path; ``EXDEV``: the path left the root;
``ENOTDIR``, ``ENOENT``); callers turn them into their own messages.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "BeneathPathError",
    "beneath_parts",
    "open_beneath",
    "open_beneath_walk",
    "open_dirs_beneath",
    "openat2_available",
]

#: ``openat2`` has the same number on every architecture that has it (the unified table).
_SYS_OPENAT2: Final = 437
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
_RESOLVE: Final = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
#: A rename elsewhere in the tree may make the kernel ask for a retry (``EAGAIN``).
_EAGAIN_RETRIES: Final = 32


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


class BeneathPathError(ValueError):
    """A path that cannot name anything beneath the root (``reason`` says why)."""

    def __init__(self, reason: str, path: str) -> None:
        super().__init__(f"{reason}: {path!r}")
        self.reason = reason
        self.path = path


def beneath_parts(path: str, root: str) -> tuple[str, ...]:
    """The components of ``path`` below ``root`` (empty for the root itself).

    ``root`` is the canonical absolute root. An absolute ``path`` must lie lexically under it
    (no symlink resolution happens here: the open does not follow any). Raises
    :class:`BeneathPathError` with ``reason`` ``"empty"``, ``"nul"``, ``"outside"`` (an absolute
    path elsewhere) or ``"dotdot"`` (a ``..`` component anywhere).
    """
    if not path:
        raise BeneathPathError("empty", path)
    if "\0" in path:
        raise BeneathPathError("nul", path)
    if os.path.isabs(path):
        prefix = root.rstrip(os.sep) + os.sep
        if path.rstrip(os.sep) == root.rstrip(os.sep):
            path = ""
        elif path.startswith(prefix):
            path = path[len(prefix) :]
        else:
            raise BeneathPathError("outside", path)
    parts = tuple(part for part in path.split(os.sep) if part not in ("", "."))
    if ".." in parts:
        raise BeneathPathError("dotdot", path)
    return parts


_openat2_state: bool | None = None


@functools.cache
def _libc_syscall() -> Any:
    """libc's ``syscall``, loaded on first use and kept (docs/decisions.md D49): loading it
    again at every open (``dlopen`` of the process, a new foreign-function object) cost
    ~10-45 µs, more than the ``openat2`` itself, at every ``read_file`` of a step."""
    libc = ctypes.CDLL(None, use_errno=True)
    function = libc.syscall
    function.restype = ctypes.c_long
    return function


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    raw = os.fsencode(path)
    syscall = _libc_syscall()
    for _attempt in range(_EAGAIN_RETRIES):
        fd = int(
            syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(raw),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            raise OSError(code, os.strerror(code), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def openat2_available() -> bool:
    """True when this kernel has ``openat2`` (probed once per process)."""
    global _openat2_state
    if _openat2_state is None:
        if not hasattr(os, "O_PATH"):
            _openat2_state = False
        else:
            root = os.open("/", os.O_PATH | os.O_CLOEXEC)
            try:
                os.close(_openat2(root, ".", os.O_PATH, 0))
                _openat2_state = True
            except OSError as error:
                _openat2_state = error.errno not in (errno.ENOSYS, errno.EPERM, errno.E2BIG)
            finally:
                os.close(root)
    return _openat2_state


def _component(dir_fd: int, name: str, flags: int, mode: int = 0) -> int:
    """Open one name in ``dir_fd`` without following it; a symlink raises ``ELOOP``."""
    if not flags & (os.O_DIRECTORY | os.O_PATH):
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    # A directory step: pin the entry first (O_PATH, not followed), decide on *that* inode, and
    # reopen it through itself, so a concurrent swap cannot make the verdict and the open differ.
    handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        kind = os.fstat(handle).st_mode
        if stat.S_ISLNK(kind):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        if not stat.S_ISDIR(kind):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
        if flags & os.O_PATH:
            pinned, handle = handle, -1
            return pinned
        return os.open(".", flags | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle)
    finally:
        if handle >= 0:
            os.close(handle)


def open_beneath_walk(root_fd: int, parts: Sequence[str], flags: int, mode: int = 0o644) -> int:
    """The ``openat2``-free resolver: one ``O_NOFOLLOW`` component at a time from ``root_fd``."""
    current = os.dup(root_fd)
    try:
        for name in parts[:-1]:
            following = _component(current, name, os.O_PATH | os.O_DIRECTORY)
            os.close(current)
            current = following
        if not parts:
            return _component(current, ".", flags, mode)
        return _component(current, parts[-1], flags, mode)
    finally:
        os.close(current)


def open_beneath(root_fd: int, parts: Sequence[str], flags: int, mode: int = 0o644) -> int:
    """Open ``parts`` (from :func:`beneath_parts`) beneath ``root_fd``, following no symlink.

    ``flags`` are ``os.open`` flags (``O_CLOEXEC`` and ``O_NOFOLLOW`` are always added). Uses
    ``openat2`` when the kernel has it, else :func:`open_beneath_walk`.
    """
    if openat2_available():
        return _openat2(root_fd, os.sep.join(parts) or ".", flags | os.O_NOFOLLOW, mode)
    return open_beneath_walk(root_fd, parts, flags, mode)


def open_dirs_beneath(root_fd: int, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor (``O_RDONLY | O_DIRECTORY``) of the directory ``parts`` beneath ``root_fd``.

    With ``create``, missing components are made (mode 0777 before umask); an existing
    component that is a symlink or not a directory raises (``ELOOP`` / ``ENOTDIR``), never
    followed. Each step is relative to the previous step's descriptor, so renaming or
    swapping a component concurrently cannot move the walk out of the tree it started in.
    """
    current = _component(root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=current)
            following = _component(current, name, os.O_RDONLY | os.O_DIRECTORY)
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current
