"""Where the JSONL store keeps its logs, and the listing of their headers: a root of
``--<project>--/<session>/session.v3.jsonl[.zstd]`` (or ``.v4.``) directories.

:class:`JsonlLayout` is the part of :class:`~._backend.JsonlStorage` that needs no event loop,
no lock and no writer: the storage is a layout, and the plugin's ``list_stored`` lists with a
layout alone (``dsh sessions list`` without booting: docs/decisions.md D39). One listing, one
header validation: :meth:`JsonlLayout.list_sync` is what the storage's async ``list`` runs too.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping
from typing import Any, Final

from dsh_host.sdk import (
    ArtifactLocation,
    InvalidSessionIdError,
    SessionFormatUnsupportedError,
    SessionHeader,
    SessionListing,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    UnreadableListing,
    check_session_id,
    parse_session_header,
)

from ._paths import (
    CURRENT_VERSION,
    Compression,
    decode_segment,
    encode_segment,
    opposite_suffix_version,
    parse_generation_filename,
    project_dir_name,
)
from ._reader import read_header

__all__ = ["NAME_MAX", "JsonlLayout", "session_segment", "typed_header"]


def typed_header(record: Mapping[str, Any], path: str) -> SessionHeader:
    try:
        return parse_session_header({k: v for k, v in record.items() if k != "type"})
    except SessionPersistenceError:
        raise
    except Exception as error:  # InvalidSessionHeaderError: the stored header is damaged
        raise SessionPersistenceCorruptionError(
            f'corrupt session log "{path}": invalid header line ({error})', path=path, offset=0
        ) from error


#: The longest file name the common filesystems take (ext4, XFS, btrfs, tmpfs: 255 bytes).
NAME_MAX: Final = 255


def session_segment(session_id: str) -> str:
    """The directory name of a session, or :class:`InvalidSessionIdError` if it has none."""
    check_session_id(session_id)
    segment = encode_segment(session_id)
    size = len(segment.encode("utf-8"))
    if size > NAME_MAX:
        raise InvalidSessionIdError(
            f"session id of {len(session_id)} characters is too long to be stored as a directory "
            f"name ({size} bytes once escaped; at most {NAME_MAX}); use a shorter id"
        )
    return segment


class JsonlLayout:
    """The session directories under ``root`` and their generations, in one ``compression``."""

    def __init__(self, root: str, compression: Compression = "zstd") -> None:
        if compression not in ("zstd", "none"):
            raise ValueError(f'compression must be "zstd" or "none", got {compression!r}')
        self.root = os.path.abspath(os.path.expanduser(root))
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(f'session root "{self.root}" exists and is not a directory')
        self.compression: Compression = compression
        self._root_checked = False

    def session_dir(self, cwd: str | None, session_id: str) -> str:
        return os.path.join(self.root, project_dir_name(cwd), session_segment(session_id))

    def _opposite_error(self, path: str) -> SessionPersistenceError:
        other = ".jsonl" if self.compression == "zstd" else ".jsonl.zstd"
        return SessionFormatUnsupportedError(
            f'session artifact "{path}" uses {other}, but this backend is configured for '
            f'compression "{self.compression}"; use a separate root or select the matching '
            "compression mode",
            location=path,
        )

    def generations(self, session_dir: str) -> list[tuple[int, str]]:
        """Canonical generations in ``session_dir``, lowest first; refuses the other encoding."""
        try:
            names = os.listdir(session_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found: list[tuple[int, str]] = []
        for name in names:
            path = os.path.join(session_dir, name)
            if opposite_suffix_version(name, self.compression) is not None:
                raise self._opposite_error(path)
            version = parse_generation_filename(name, self.compression)
            if version is not None and os.path.isfile(path):
                found.append((version, path))
        found.sort()
        return found

    def _check_root(self) -> None:
        """Once per instance: the whole root must be one encoding and the session layout."""
        if self._root_checked:
            return
        for project, entries in self._projects():
            for name in entries:
                path = os.path.join(project, name)
                if os.path.isdir(path):
                    self.generations(path)
                elif name.endswith((".jsonl", ".jsonl.zstd")):
                    raise SessionFormatUnsupportedError(
                        f'session artifact "{path}" uses the unsupported flat-file layout; use a '
                        "separate root or move it into a project/session directory before loading",
                        location=path,
                    )
        self._root_checked = True

    def _projects(self) -> list[tuple[str, list[str]]]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        except OSError as error:  # not a directory, no permission, ...
            raise SessionPersistenceError(
                f'session root "{self.root}" cannot be read: {error.strerror or error}; '
                "point --root / DSH_SESSION_ROOT / the row's `root` at a directory you can write"
            ) from None
        out: list[tuple[str, list[str]]] = []
        for name in names:
            path = os.path.join(self.root, name)
            if os.path.isdir(path):
                try:
                    out.append((path, sorted(os.listdir(path))))
                except OSError:
                    continue
        return out

    def list_sync(
        self, unreadable: builtins.list[UnreadableListing] | None = None
    ) -> builtins.list[SessionListing]:
        """:meth:`list` on this thread (``dsh sessions list`` reads it without an event loop:
        the plugin's ``list_stored``)."""
        self._check_root()
        seen: dict[str, str] = {}
        out: list[SessionListing] = []
        for project, entries in self._projects():
            for name in entries:
                session_dir = os.path.join(project, name)
                generations = self.generations(session_dir)
                if not generations:
                    continue
                path = generations[-1][1]
                try:
                    listing = self._listing(
                        session_dir, generations[-1], seen, report=unreadable is not None
                    )
                except (SessionPersistenceError, OSError) as error:
                    if unreadable is None:
                        raise
                    if isinstance(error, OSError):
                        error = SessionPersistenceError(
                            f'session log "{path}" cannot be read: {error.strerror or error}'
                        )
                    unreadable.append(
                        UnreadableListing(_listed_id(name), ArtifactLocation("jsonl", path), error)
                    )
                    continue
                if listing is not None:
                    out.append(listing)
        out.sort(key=lambda item: (item.header.created_at, item.header.id))
        return out

    def _listing(
        self, session_dir: str, generation: tuple[int, str], seen: dict[str, str], *, report: bool
    ) -> SessionListing | None:
        """One session directory's listing; None for what is not (yet) a session.

        A header with invalid fields is skipped, or raised when ``report`` (the
        caller lists it as unreadable).
        """
        version, path = generation
        listed = read_header(path, self.compression)
        if listed is None:
            return None
        record, revision = listed
        sid = record.get("id")
        if type(sid) is not str:
            return None
        try:
            expected = self.session_dir(record.get("cwd"), sid)
        except ValueError:
            return None
        if os.path.realpath(expected) != os.path.realpath(session_dir):
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{path}": header id "{sid}" and cwd identify "{expected}"',
                path=path,
                offset=0,
            )
        if sid in seen:
            raise SessionPersistenceCorruptionError(
                f'duplicate JSONL session id "{sid}" appears in multiple project '
                f"directories: {seen[sid]}, {session_dir}"
            )
        seen[sid] = session_dir
        if record.get("version") != CURRENT_VERSION:
            header_view = _listing_header(record)
        else:
            header_view = record
        try:
            header = typed_header(header_view, path)
        except SessionPersistenceCorruptionError:
            if report:
                raise
            return None
        return SessionListing(
            header=header,
            revision=revision,
            location=ArtifactLocation("jsonl", path),
            source_version=int(record.get("version", version)),
        )


def _listed_id(segment: str) -> str:
    """The session id a session directory's name stands for (the name itself if malformed)."""
    try:
        return decode_segment(segment)
    except ValueError:
        return segment


def _listing_header(record: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-v3 or v4 header shown as the core's v3 for listing (``seedLength`` →
    ``isSeeded``; v4's header has v3's fields)."""
    out = {k: v for k, v in record.items() if k != "seedLength"}
    out["version"] = CURRENT_VERSION
    if "isSeeded" not in out:
        out["isSeeded"] = "seedLength" in record
    return out
