"""What ``dsh sessions list`` remembers between runs: each session's summary, and the revision
of the stored log it was computed from.

A row of the listing needs every event of its session (how many there are, how the last turn
ended, the first prompt, the tokens of every answer), so a listing that remembers nothing reads
every byte of every log: ~70 ms for a log of 5,000 events, seconds for a root of long sessions
(``bench/sessions_list.py``). A session that has not changed since the last listing has the same
summary, and its backend says whether it changed: a listed session's ``revision`` is equal while
the stored log is unchanged and different after any write (JSONL: the file's device, inode,
size, mtime and ctime; SQLite and PostgreSQL: the store's id and the number of events). A
summary is used only under the revision it was computed from; any other revision reads the log
again.

The memory is one JSON file, ``$XDG_CACHE_HOME/dsh/sessions-list.json`` (``~/.cache/dsh``; mode
0600 in a 0700 directory), written whole (a temporary file renamed over it) after a listing
that learned something, and valid only for the dsh version that wrote it. It is a cache: a
missing, unreadable or malformed file, or an entry of the wrong shape, is computed again and
rewritten, silently; where the directory cannot be written, listing works as it did without
one. Nothing else reads it: ``sessions show``, ``verify`` and resume always read the log.
``dsh sessions list --fresh`` reads every log again and replaces what was remembered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._session.messages import USAGE_KEYS
from .._userdirs import cache_home, read_cache_document, write_cache_document

if TYPE_CHECKING:
    from .._persistence.persistence import ArtifactLocation

__all__ = ["SUMMARY_KEYS", "ListCache", "cache_file", "listing_key"]

#: The layout of the file; a file of another layout (or of another dsh version) is ignored.
FORMAT: Final = 1
#: What a remembered summary holds: the listing's fields that are read from the events.
#: (``pricedWith`` names the prices the usage's cost was computed with.)
SUMMARY_KEYS: Final = ("events", "lastTurnEnd", "title", "usage", "pricedWith")
#: A file larger than this is not read (and is replaced): ~100,000 sessions' summaries.
MAX_BYTES: Final = 32 << 20
#: At most this many summaries are kept; those not listed this time go first.
MAX_ENTRIES: Final = 50_000


def cache_file() -> Path:
    """``$XDG_CACHE_HOME/dsh/sessions-list.json``."""
    return cache_home() / "dsh" / "sessions-list.json"


def listing_key(location: ArtifactLocation | None) -> str | None:
    """Which stored log a summary belongs to (None: the backend names no location, e.g. the
    in-memory one, whose sessions do not outlive the process)."""
    return None if location is None else f"{location.kind}:{location.path}"


class ListCache:
    """The summaries of one listing run: looked up by key and revision, saved once at the end."""

    def __init__(self, path: Path, entries: dict[str, dict[str, Any]], changed: bool) -> None:
        self.path = path
        self._entries = entries
        self._listed: set[str] = set()
        self._changed = changed

    @classmethod
    def load(cls, path: Path | None = None, *, fresh: bool = False) -> ListCache:
        """What the file remembers (nothing when ``fresh``: every log is read again and the
        file is replaced, even if no summary differs)."""
        where = cache_file() if path is None else path
        return cls(where, {} if fresh else _read(where), changed=fresh)

    def get(self, key: str, revision: str) -> dict[str, Any] | None:
        """The summary remembered for exactly this revision of the log, else None."""
        entry = self._entries.get(key)
        if entry is None or entry["revision"] != revision:
            return None
        self._listed.add(key)
        return {name: _copy(entry[name]) for name in SUMMARY_KEYS}

    def put(self, key: str, revision: str, summary: Mapping[str, Any]) -> None:
        """Remember ``summary``, computed from the log at ``revision``."""
        entry = {"revision": revision, **{name: _copy(summary[name]) for name in SUMMARY_KEYS}}
        if self._entries.get(key) != entry:
            self._entries.pop(key, None)  # re-inserted last: the newest summaries are kept longest
            self._entries[key] = entry
            self._changed = True
        self._listed.add(key)

    def forget(self, key: str) -> None:
        """The log could not be read: remember nothing of it."""
        if self._entries.pop(key, None) is not None:
            self._changed = True

    def save(self) -> None:
        """Write the file if this run learned something; a failure to write is not an error."""
        if not self._changed:
            return
        kept = {key: entry for key, entry in self._entries.items() if self._keep(key)}
        surplus = len(kept) - MAX_ENTRIES
        if surplus > 0:  # the oldest of those not listed this time first, then the oldest listed
            order = sorted(kept, key=lambda key: key in self._listed)  # stable: oldest first
            for key in order[:surplus]:
                del kept[key]
        try:
            _write(self.path, kept)
        except OSError:
            pass  # a read-only or full cache directory: the next listing reads the logs again

    def _keep(self, key: str) -> bool:
        """Listed this time, or of a file that still exists (another root's sessions, or
        another backend's, whose existence a cheap look cannot tell, stay)."""
        if key in self._listed or not key.startswith("jsonl:"):
            return True
        return os.path.lexists(key.removeprefix("jsonl:"))


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def _read(path: Path) -> dict[str, dict[str, Any]]:
    entries = read_cache_document(path, MAX_BYTES, FORMAT, "sessions")
    if not isinstance(entries, dict):
        return {}
    return {
        key: entry
        for key, entry in entries.items()
        if isinstance(key, str) and _well_formed(entry)
    }


def _well_formed(entry: object) -> bool:
    if not isinstance(entry, dict) or set(entry) != {"revision", *SUMMARY_KEYS}:
        return False
    events, usage = entry["events"], entry["usage"]
    return (
        isinstance(entry["revision"], str)
        and isinstance(events, int)
        and not isinstance(events, bool)
        and events >= 0
        and all(isinstance(entry[name], str | None) for name in ("lastTurnEnd", "title"))
        and isinstance(entry["pricedWith"], str)
        and isinstance(usage, dict)
        and set(usage) == {*USAGE_KEYS, "costUsd", "unpricedModels"}
        and all(type(usage[key]) is int for key in USAGE_KEYS)
        and (usage["costUsd"] is None or type(usage["costUsd"]) in (int, float))
        and isinstance(usage["unpricedModels"], list)
        and all(isinstance(model, str) for model in usage["unpricedModels"])
    )


def _write(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    write_cache_document(path, FORMAT, "sessions", entries)
