"""A value computed from a few files, recomputed only when an ``lstat`` says one changed.

Plugins that show workspace files to the model at every step (``AGENTS.md``, the skills
catalog) promise that an edit is seen at the next step. Reading the files again every step
costs a thread hop, path resolution and an ``open`` + ``read`` per candidate; checking them is a
few ``lstat`` calls. :class:`StatMemo` keeps, per key, the value and the fingerprint of every
path the computation looked at (:meth:`Watched.note`, called *before* the path is read), and
hands the value back while every fingerprint is unchanged.

A fingerprint is ``(st_dev, st_ino, st_mode, st_size, st_mtime_ns, st_ctime_ns)``, or None for
a path that does not exist (so creating it is a change). A directory's timestamps change when
an entry is added, removed or renamed in it, so noting a directory before listing it covers
its listing. ``st_ctime`` cannot be set back by a tool (``touch -d``, ``cp -p``), and a write
of the same size still moves it, except within one tick of the file system's coarse clock:
a value whose files changed less than :data:`RACY_NS` before it was computed is not reused
(it is recomputed at the next call, as git treats a "racily clean" index entry), so a write
that lands in the same tick as a read is never missed (D35).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import anyio.to_thread

__all__ = ["RACY_NS", "StatMemo", "Watch", "Watched", "fingerprint"]

K = TypeVar("K")
V = TypeVar("V")

#: A file changed this recently (ns) before a value was computed from it makes the value
#: untrusted: file timestamps come from a coarse clock (a jiffy on Linux, 2 s on FAT).
RACY_NS: Final = 2_000_000_000

Fingerprint = tuple[int, ...] | None


def fingerprint(path: str, follow: bool = False, content: bool = True) -> Fingerprint:
    """``path``'s identity and type, with ``content`` (and always for a symbolic link, whose
    inode number a retargeted link may reuse) its size and timestamps too (``lstat``, or
    ``stat`` when ``follow``); None when it does not exist or cannot be reached."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None
    if not content and not stat.S_ISLNK(st.st_mode):
        return (st.st_dev, st.st_ino, st.st_mode)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: (path, follow, content): how a path is fingerprinted
Watch = tuple[str, bool, bool]


class Watched:
    """The paths one computation depended on, each fingerprinted before it was read."""

    __slots__ = ("paths", "started_ns")

    def __init__(self) -> None:
        self.started_ns = time.time_ns()
        #: how each path is watched -> its fingerprint taken before the computation used it
        self.paths: dict[Watch, Fingerprint] = {}

    def note(self, path: str, follow: bool = False, content: bool = True) -> Fingerprint:
        """Fingerprint ``path`` now (call it before reading or listing ``path``): ``follow``
        for a path used through a symbolic link (a directory that is listed); without
        ``content`` only what ``path`` is counts (which file, of which type), not what it holds
        (a directory on the way, whose timestamps move whenever a sibling is created)."""
        key = (path, follow, content)
        if key in self.paths:
            return self.paths[key]
        value = self.paths[key] = fingerprint(path, follow, content)
        return value

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path)``, noting what every leading part of ``path`` is (so a
        part replaced, or a link retargeted, is a change)."""
        parts = os.path.abspath(path).split(os.sep)
        for end in range(2, len(parts) + 1):
            self.note(os.sep.join(parts[:end]), content=False)
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        """``os.path.lexists(path)``, noted (its appearing or vanishing is a change)."""
        return self.note(path, content=False) is not None

    def trusted(self) -> bool:
        """Whether no noted content changed within :data:`RACY_NS` before the computation."""
        horizon = self.started_ns - RACY_NS
        return all(
            fp is None or len(fp) == 3 or max(fp[4], fp[5]) < horizon
            for fp in self.paths.values()
        )


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    paths: dict[Watch, Fingerprint]
    trusted: bool


class StatMemo(Generic[K, V]):
    """``compute(key, watched)`` memoized per key while its noted paths are unchanged.

    :meth:`get` checks on the event loop (a few ``lstat`` calls) and runs ``compute`` (blocking
    reads) on a worker thread only when something changed; the entries are touched only on
    the event loop. At most ``capacity`` keys are kept (the oldest is dropped first).
    """

    def __init__(self, compute: Callable[[K, Watched], V], capacity: int = 16) -> None:
        self._compute = compute
        self._capacity = capacity
        self._entries: dict[K, _Entry[V]] = {}
        #: how many times ``compute`` ran (tests and benches count it)
        self.computed = 0

    def _fresh(self, key: K) -> _Entry[V] | None:
        """``key``'s entry when it is kept, trusted, and no path it read changed since."""
        entry = self._entries.get(key)
        if entry is None or not entry.trusted:
            return None
        for (path, follow, content), before in entry.paths.items():
            if fingerprint(path, follow, content) != before:
                return None
        return entry

    def _run(self, key: K) -> tuple[V, Watched]:
        watched = Watched()
        return self._compute(key, watched), watched

    async def get(self, key: K) -> V:
        """``key``'s value: the kept one when nothing it read changed, else computed now."""
        entry = self._fresh(key)
        if entry is not None:
            return entry.value
        value, watched = await anyio.to_thread.run_sync(self._run, key)
        self.computed += 1
        self._entries.pop(key, None)
        if len(self._entries) >= self._capacity:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = _Entry(value, watched.paths, watched.trusted())
        return value
