"""The JSONL session storage (:class:`JsonlStorage`) and its ``sessionPersistence`` service.

Layering inside this plugin: ``_json`` / ``_paths`` / ``_codec`` / ``_frames``
know bytes and JSON values; ``_reader`` reads one file; ``_storage`` and
``_lock`` do durable file and lock operations; ``_migrate`` upgrades older
generations; this module implements the session layer's storage seam
(:mod:`dsh_host._persistence.storage`) with them. Admission, the fixed 200 ms
window, the serialized drain and the write handle are the host's: a batch
reaches :meth:`JsonlStorage.append` as one frame to write and fsync on a
worker thread, and the durable cursor advances only when the fsync returned.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import anyio

from dsh_host.sdk import (
    DSH_V4_ONLY_EVENT_TYPES,
    LOCK_NAME,
    WINDOW_SECONDS,
    ArtifactLocation,
    PackedLog,
    Pending,
    PersistenceService,
    SessionAlreadyExistsError,
    SessionAppendRejectedError,
    SessionEvent,
    SessionFormatUnsupportedError,
    SessionHeader,
    SessionListing,
    SessionLoad,
    SessionLock,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionRollbackError,
    SessionWriteError,
    Spawn,
    UnreadableListing,
    decode_stored_event,
    encode_event,
    header_meta,
    held_by_text,
    lock_holder,
    offload,
)

from . import _json
from ._codec import (
    encode_event_row,
    header_from_meta,
    header_json_bytes,
    pack_source_seqs,
)
from ._follow import Fallback, LogFollower
from ._frames import compress_frame
from ._layout import JsonlLayout, session_segment, typed_header
from ._migrate import migrate_to_current, publish_generation, publish_v4
from ._paths import (
    CURRENT_VERSION,
    Compression,
    generation_filename,
)
from ._reader import (
    ArtifactRead,
    StoredRow,
    plain_rows,
    read_artifact,
    read_header,
    revision_of,
)
from ._storage import (
    AppendFailed,
    fsync_dirs,
    make_dirs_durable,
    open_for_append,
    publish_exclusive,
    seek_end,
    truncate_durable,
    write_durable,
)
from ._v4 import V4_VERSION, lift_row

__all__ = [
    "LIVE_WRITE_BATCH_MAX_DELAY",
    "JsonlLease",
    "JsonlSessionPersistence",
    "JsonlStorage",
]

#: The fixed coalescing window for buffered events (seconds); not configurable (D7).
LIVE_WRITE_BATCH_MAX_DELAY: Final = WINDOW_SECONDS
#: Bytes of lines up to which a batch is framed on the event loop before its write + fsync
#: hop; a larger one is framed on the lane too (zstd takes ~2-3 µs a KiB: a big batch would
#: hold the loop).
FRAME_ON_LOOP_MAX: Final = 64 * 1024

_log = logging.getLogger("dsh.session-persistence-jsonl")


# --------------------------------------------------------------------------- conversions


def _header_record(header: SessionHeader | Mapping[str, Any]) -> dict[str, Any]:
    """Validated v3 header record (``type`` first, DSH key order)."""
    meta = header_meta(header)
    try:
        return header_from_meta(meta)
    except ValueError as error:
        raise SessionAppendRejectedError(str(error)) from None


def _typed_line(event: SessionEvent) -> bytes:
    """The stored line of a core event, fast: msgspec's encoding is used as is when it is
    already what a JS writer produces (no float printed differently, no sourceEventSeqs
    run to pack); otherwise the JSON is re-encoded from plain values."""
    raw = encode_event(event)
    sources = event.source_event_seqs
    packs_as_is = not sources or pack_source_seqs(list(sources)) == list(sources)
    if packs_as_is and _json.floats_match_javascript(raw):
        return raw
    return _encode_line(_json.loads(raw))  # the stdlib redoes what msgspec refuses


def _encode_line(wire: Mapping[str, Any]) -> bytes:
    return _json.dumps_bytes(encode_event_row(wire))


#: The formats a root can write new sessions in (``format: v3 | v4`` of the JSONL row).
WRITABLE_VERSIONS: Final = (CURRENT_VERSION, V4_VERSION)
#: Each v4-only event type as it appears quoted in a line (the cheap pre-check of
#: :func:`_stored_lines`, built once rather than for every line written).
_V4_ONLY_NEEDLES: Final = tuple(b'"' + t.encode() + b'"' for t in sorted(DSH_V4_ONLY_EVENT_TYPES))


def _stored_lines(version: int, lines: Sequence[bytes]) -> list[bytes]:
    """The lines as a ``version`` log stores them: the core encodes v3 rows, and a v4 log
    gets each one lifted (:func:`~._v4.lift_row`); a v4-only event
    (``developer/message``...) is refused for a v3 log, which DSH 0.1.5 would refuse whole.
    Every write of a log — a new session's first batch, an append, a torn tail's
    re-append — passes here, so no v3 row reaches a v4 file. Only a row naming a plugin
    source or a tool result changes in v4, so the rest keep the core's bytes unparsed."""
    if version != V4_VERSION:
        for line in lines:
            if any(needle in line for needle in _V4_ONLY_NEEDLES):
                row = _json.loads(line)
                if row.get("type") in DSH_V4_ONLY_EVENT_TYPES and row.get("ignorable") is not True:
                    raise SessionWriteError(
                        f'refusing to write a "{row["type"]}" event (seq {row.get("seq")!r}) '
                        f"into a format v{version} log: DSH reads it only in a v4 log; migrate "
                        "the session to v4 first (dsh sessions migrate --to v4 ID)"
                    )
        return list(lines)
    return [
        _json.dumps_bytes(lift_row(_json.loads(line)))
        if b'"plugin"' in line or b'"tool/result"' in line
        else line
        for line in lines
    ]


def _frame_or_lines(lines: Sequence[bytes], compression: Compression) -> bytes:
    text = b"\n".join(lines) + b"\n"
    return compress_frame(text) if compression == "zstd" else text


# --------------------------------------------------------------------------- the lease


class JsonlLease:
    """What a JSONL storage holds for one owned session: the lock, the log's descriptor,
    the size it wrote, and a torn tail still to repair (cut back, re-append recovered)."""

    __slots__ = (
        "fd",
        "lock",
        "path",
        "rewrite",
        "session_dir",
        "session_id",
        "size",
        "truncate_to",
        "version",
    )

    def __init__(
        self,
        session_id: str,
        session_dir: str,
        path: str,
        lock: SessionLock,
        size: int,
        *,
        truncate_to: int | None = None,
        rewrite: list[bytes] | None = None,
        version: int = CURRENT_VERSION,
    ) -> None:
        self.session_id = session_id
        self.session_dir = session_dir
        self.path = path
        self.lock = lock
        #: File size as this lease wrote it.
        self.size = size
        #: Append descriptor of the log, opened on first use, closed at release.
        self.fd: int | None = None
        self.truncate_to = truncate_to
        self.rewrite: list[bytes] = rewrite or []
        #: The format of the log this lease writes (a session continues in the format it has).
        self.version = version

    def log_fd(self) -> int:
        if self.fd is None:
            self.fd = open_for_append(self.path)
        return self.fd

    @property
    def tail_to_repair(self) -> bool:
        return self.truncate_to is not None or bool(self.rewrite)


# --------------------------------------------------------------------------- the service


class JsonlStorage(JsonlLayout):
    """Session logs as ``<root>/--<project>--/<id>/session.v3.jsonl[.zstd]`` (or ``.v4.``).

    A :class:`~dsh_host._persistence.storage.SessionStorage`: a batch is one frame
    (or run of lines) written and fsynced on a worker thread, or on the event loop
    when that is cheaper and stalls nobody (:class:`~dsh_host._persistence.offload.BarrierLane`);
    ownership is ``flock`` on ``session.lock``, taken when a created session is first
    published or at ``acquire``.
    """

    name = "session-persistence-jsonl"

    def __init__(
        self,
        root: str,
        compression: Compression = "zstd",
        *,
        inline_barrier: float = offload.DEFAULT_INLINE_BUDGET,
        write_version: int = CURRENT_VERSION,
    ) -> None:
        if write_version not in WRITABLE_VERSIONS:
            raise ValueError(
                f"write_version must be {CURRENT_VERSION} or {V4_VERSION}, got {write_version!r}"
            )
        #: The format new sessions are written in; an existing one keeps its own.
        self.write_version = write_version
        #: The format of each session this storage acquired in another format than
        #: ``write_version`` (a v3 session in a v4 root, or the reverse), for :meth:`locate`.
        self._kept_versions: dict[str, int] = {}
        #: Where each batch's compress + write + fsync runs (``inline_barrier``: its budget in
        #: seconds for running on the event loop; 0 = always a worker thread).
        self.lane = offload.BarrierLane(inline_barrier)
        super().__init__(root, compression)
        #: Per-session cursors of :meth:`read_from` (reads only what was appended).
        self._follower = LogFollower()

    # -- paths

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """The path ``header``'s session is written at (no I/O): the root's format, or the
        format a session acquired here kept."""
        if isinstance(header, SessionHeader):
            cwd = header.to_json().get("cwd")
            sid = header.id
        else:
            cwd, sid = header.get("cwd"), str(header["id"])
        version = self._kept_versions.get(sid, self.write_version)
        path = os.path.join(
            self.session_dir(cwd, sid), generation_filename(version, self.compression)
        )
        return ArtifactLocation("jsonl", path)

    def dir_chain(self, session_dir: str) -> list[str]:
        """Directories to create, outermost first: missing ancestors of the root included
        (``--root .dsh/sessions`` on a fresh checkout must just work)."""
        project = os.path.dirname(session_dir)
        missing: list[str] = []
        parent = os.path.dirname(os.path.abspath(self.root))
        while not os.path.isdir(parent) and parent != os.path.dirname(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        return [*reversed(missing), self.root, project, session_dir]

    def sync_dir_chain(self, session_dir: str) -> None:
        """fsync the session directory, its project directory and the root (raising), then
        every ancestor of the root (best effort): the names a crashed creator made may
        never have been synced."""
        required = [session_dir, os.path.dirname(session_dir), self.root]
        above: list[str] = []
        parent = os.path.dirname(os.path.abspath(self.root))
        while True:
            above.append(parent)
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
        fsync_dirs(required, above)

    # -- encoding and generation checks

    def find(self, session_id: str) -> tuple[str, list[tuple[int, str]]] | None:
        """The session directory holding ``session_id`` and its generations, or None."""
        self._check_root()
        segment = session_segment(session_id)
        matches: list[tuple[str, list[tuple[int, str]]]] = []
        try:
            projects = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return None
        for project in projects:
            project_path = os.path.join(self.root, project)
            flat = [
                os.path.join(project_path, f"{segment}.jsonl"),
                os.path.join(project_path, f"{segment}.jsonl.zstd"),
            ]
            for candidate in flat:
                if os.path.isfile(candidate):
                    raise SessionFormatUnsupportedError(
                        f'session artifact "{candidate}" uses the unsupported flat-file layout; '
                        "use a separate root or move it into a project/session directory before "
                        "loading",
                        location=candidate,
                    )
            session_dir = os.path.join(project_path, segment)
            generations = self.generations(session_dir)
            if generations:
                matches.append((session_dir, generations))
        if len(matches) > 1:
            raise SessionPersistenceCorruptionError(
                f'duplicate JSONL session id "{session_id}" appears in multiple project '
                f"directories: {', '.join(m[0] for m in matches)}"
            )
        return matches[0] if matches else None

    def newest_log(self, session_id: str) -> str | None:
        """The path of the session's newest generation (the log its appends go to), or None
        when the session has no log."""
        found = self.find(session_id)
        return None if found is None else found[1][-1][1]

    # -- reading

    def _read_sync(
        self, session_id: str
    ) -> tuple[ArtifactRead, dict[str, Any], Sequence[StoredRow]]:
        """The newest generation, read typed: a current-format file's events are mostly
        decoded straight into typed events; an older one's are migrated plain records."""
        found = self.find(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        session_dir, generations = found
        version, path = generations[-1]
        artifact = read_artifact(path, self.compression, version, typed=True)
        self._check_identity(session_id, artifact, session_dir)
        if artifact.version == CURRENT_VERSION:
            return artifact, dict(artifact.header), artifact.events
        if artifact.version == V4_VERSION:  # rows lowered by the reader; the core's v3 view
            return artifact, {**artifact.header, "version": CURRENT_VERSION}, artifact.events
        return (artifact, *migrate_to_current(artifact))

    def _check_identity(self, session_id: str, artifact: ArtifactRead, session_dir: str) -> None:
        path = artifact.path
        header_id = artifact.header.get("id")
        if header_id != session_id:
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{path}": requested id "{session_id}" does not match '
                f'header id "{header_id}"',
                path=path,
                offset=0,
            )
        try:
            expected = self.session_dir(artifact.header.get("cwd"), session_id)
        except ValueError:
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{path}": header id cannot name a storage path',
                path=path,
                offset=0,
            ) from None
        if os.path.realpath(expected) != os.path.realpath(session_dir):
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{path}": header id "{session_id}" and cwd identify '
                f'"{expected}"',
                path=path,
                offset=0,
            )

    def _load(
        self, artifact: ArtifactRead, header: dict[str, Any], events: Sequence[StoredRow]
    ) -> SessionLoad:
        sid = str(header["id"])
        # The reader's per-row promise holds for the rows it parsed: a v3 file's events
        # are those rows (a migration copies and rewrites them, so it gets no promise).
        if isinstance(events, PackedLog) and events is artifact.events:
            typed: Sequence[SessionEvent] = events  # every event typed by the reader (D37)
        else:
            typed = PackedLog(self._typed(artifact, sid, events))
        return SessionLoad(
            header=typed_header(header, artifact.path),
            events=typed,
            revision=artifact.revision,
            location=ArtifactLocation("jsonl", artifact.path),
            torn_tail=artifact.torn,
            source_version=artifact.version,
        )

    @staticmethod
    def _typed(
        artifact: ArtifactRead, sid: str, events: Sequence[StoredRow]
    ) -> Iterator[SessionEvent]:
        plain = artifact.plain
        if (
            artifact.version != CURRENT_VERSION
            or events is not artifact.events
            or len(plain) != len(events)
        ):
            plain = [False] * len(events)
        for e, p in zip(events, plain, strict=True):
            yield (
                e
                if isinstance(e, SessionEvent)
                else decode_stored_event(
                    e, session_id=sid, seq=e.get("seq"), where=artifact.path, parsed_plain=p
                )
            )

    async def load(self, session_id: str) -> SessionLoad:
        artifact, header, events = await anyio.to_thread.run_sync(self._read_sync, session_id)
        return self._load(artifact, header, events)

    async def read_from(
        self, session_id: str, from_seq: int, limit: int | None = None
    ) -> tuple[SessionEvent, ...]:
        """The stored events with ``seq >= from_seq`` (at most ``limit``), reading only the
        bytes appended since this storage last read the log (:mod:`._follow`); a log the
        quick path cannot decide (damage, a torn tail, an older format) is read whole."""
        return await anyio.to_thread.run_sync(self._read_from_sync, session_id, from_seq, limit)

    def _read_from_sync(
        self, session_id: str, from_seq: int, limit: int | None
    ) -> tuple[SessionEvent, ...]:
        path = self.newest_log(session_id)
        if path is None:
            self._follower.forget(session_id)
            raise SessionNotFoundError(f'session "{session_id}" not found')
        try:
            return tuple(
                self._follower.read(session_id, path, self.compression, from_seq, limit)
            )
        except (Fallback, FileNotFoundError):
            self._follower.forget(session_id)
        artifact, header, events = self._read_sync(session_id)
        stop = None if limit is None else from_seq + limit
        return tuple(self._load(artifact, header, events[from_seq:stop]).events)

    async def next_seq(self, session_id: str) -> int:
        """The seq after the last complete stored event (a new follower's start), from the
        cursor: only the bytes appended since the last read are read."""
        return await anyio.to_thread.run_sync(self._next_seq_sync, session_id)

    def _next_seq_sync(self, session_id: str) -> int:
        path = self.newest_log(session_id)
        if path is None:
            self._follower.forget(session_id)
            raise SessionNotFoundError(f'session "{session_id}" not found')
        try:
            return self._follower.next_seq(session_id, path, self.compression)
        except (Fallback, FileNotFoundError):
            self._follower.forget(session_id)
        artifact, _header, events = self._read_sync(session_id)
        return len(events) - (artifact.torn.recovered if artifact.torn is not None else 0)

    async def stored_ends(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The next seq of each session whose log ends where its follower's cursor stopped (a
        look-up, a ``stat`` and a 32-byte check each, in one worker-thread call: D47); a log
        with bytes past its cursor, or none, or one this cannot vouch for is left out (the
        caller reads it, and that read moves the cursor)."""
        return await anyio.to_thread.run_sync(self._stored_ends_sync, list(session_ids))

    def _stored_ends_sync(self, session_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for session_id in session_ids:
            try:
                path = self.newest_log(session_id)
                end = None if path is None else self._follower.quiet_end(session_id, path)
            except (OSError, SessionPersistenceError):
                continue  # the read says what is wrong, with its own error
            if end is not None:
                out[session_id] = end
        return out

    async def walked_tail(self, session_id: str) -> tuple[int | None, ArtifactLocation | None]:
        """After a walk of the log with :meth:`read_from` to its end: how many bytes follow the
        last complete record it read (0: none, the log ends at a record; more: an append in
        progress or a torn tail, which only a full read classifies; None: unknown) and where
        the log is. ``dsh sessions verify`` reads a whole log this way, in pages."""
        return await anyio.to_thread.run_sync(self._walked_tail_sync, session_id)

    def _walked_tail_sync(self, session_id: str) -> tuple[int | None, ArtifactLocation | None]:
        path = self.newest_log(session_id)
        if path is None:
            return None, None
        try:
            trailing = self._follower.trailing(session_id, path)
        except FileNotFoundError:
            trailing = None
        return trailing, ArtifactLocation("jsonl", path)

    async def current_revision(self, session_id: str) -> str | None:
        """The revision of the session's newest generation now (None: no log): a look-up and
        a ``stat``, no read (``read_from`` of the service answers an idle follower with it)."""
        return await anyio.to_thread.run_sync(self._revision_sync, session_id)

    def _revision_sync(self, session_id: str) -> str | None:
        path = self.newest_log(session_id)
        if path is None:
            return None
        try:
            return revision_of(os.stat(path))
        except FileNotFoundError:
            return None

    # -- the storage seam: new sessions

    def encode(self, event: SessionEvent, wire: dict[str, Any] | None) -> bytes:
        """The stored line: a typed event's fast path, or the plain form as given (the host
        decoded it already, so its envelope is valid)."""
        return _typed_line(event) if wire is None else _encode_line(wire)

    async def check_new(self, header: SessionHeader) -> None:
        record = _header_record(header)
        sid = str(record["id"])
        path = await anyio.to_thread.run_sync(self.newest_log, sid)
        if path is not None:
            raise SessionAlreadyExistsError(
                f'session "{sid}" already has a persisted log on disk; load/resume it '
                f"instead of creating ({path})"
            )

    async def materialize(self, header: SessionHeader, batch: Sequence[Pending]) -> JsonlLease:
        record = _header_record(header)
        lines = [p.json for p in batch]
        return await anyio.to_thread.run_sync(self._materialize_sync, record, lines)

    def _materialize_sync(self, record: dict[str, Any], lines: list[bytes]) -> JsonlLease:
        sid = str(record["id"])
        session_dir = self.session_dir(record.get("cwd"), sid)
        version = self.write_version
        path = os.path.join(session_dir, generation_filename(version, self.compression))
        lines = _stored_lines(version, lines)
        self.generations(session_dir)  # P1: refuses the other encoding
        try:
            make_dirs_durable(self.dir_chain(session_dir))
        except OSError as error:
            raise SessionWriteError(
                f'failed to create the session directory "{session_dir}" durably: {error}'
            ) from error
        lock = SessionLock.acquire(session_dir, sid)
        try:
            existing = self.generations(session_dir)
            if existing:
                raise SessionAlreadyExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk '
                    f"(load/resume it instead): {existing[-1][1]}"
                )
            header = header_json_bytes({**record, "version": version})
            if self.compression == "zstd":
                content = compress_frame(header)
                if lines:
                    content += _frame_or_lines(lines, "zstd")
            else:
                content = header + (b"\n".join(lines) + b"\n" if lines else b"")
            try:
                publish_exclusive(path, content)
            except FileExistsError:
                raise SessionAlreadyExistsError(
                    f'refusing to materialize "{sid}": a log already exists on disk '
                    f"(load/resume it instead): {path}"
                ) from None
            except OSError as error:
                raise SessionWriteError(
                    f'failed to publish session log "{path}": {error}'
                ) from error
        except BaseException:
            lock.release()
            raise
        return JsonlLease(sid, session_dir, path, lock, len(content), version=version)

    # -- the storage seam: owned sessions

    async def acquire(self, session_id: str) -> tuple[JsonlLease, SessionLoad]:
        return await anyio.to_thread.run_sync(self._acquire_sync, session_id)

    def _acquire_sync(self, session_id: str) -> tuple[JsonlLease, SessionLoad]:
        found = self.find(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        session_dir = found[0]
        lock = SessionLock.acquire(session_dir, session_id)
        try:
            try:
                self.sync_dir_chain(session_dir)
            except OSError as error:
                raise SessionWriteError(
                    f'failed to sync the directories of session "{session_id}" '
                    f'("{session_dir}") before writing: {error}'
                ) from error
            artifact, header, wire_events = self._read_sync(session_id)
            # A v3 or v4 log continues in its own format; an older one is published as v3.
            version = V4_VERSION if artifact.version == V4_VERSION else CURRENT_VERSION
            path = os.path.join(session_dir, generation_filename(version, self.compression))
            if version != self.write_version:
                self._kept_versions[session_id] = version
            load = self._load(artifact, header, wire_events)
            if artifact.version not in WRITABLE_VERSIONS:
                size = publish_generation(
                    self, artifact, header, plain_rows(list(wire_events)), session_dir
                )
                load = dataclasses.replace(
                    load, torn_tail=None, location=ArtifactLocation("jsonl", path)
                )
                return JsonlLease(session_id, session_dir, path, lock, size), load
            torn = artifact.torn
            lease = JsonlLease(
                session_id,
                session_dir,
                path,
                lock,
                artifact.size,
                truncate_to=torn.truncate_to if torn is not None else None,
                rewrite=[_encode_line(e) for e in artifact.recovered] if torn else None,
                version=version,
            )
            return lease, load
        except BaseException:
            lock.release()
            raise

    # -- v3 -> v4

    def _children_of(self, session_id: str) -> list[str]:
        """Ids of the subagent sessions whose header names ``session_id`` as parent."""
        children: list[str] = []
        for project, entries in self._projects():
            for name in entries:
                generations = self.generations(os.path.join(project, name))
                if not generations:
                    continue
                try:
                    listed = read_header(generations[-1][1], self.compression)
                except SessionPersistenceError:
                    continue
                if listed is None:
                    continue
                record = listed[0]
                if record.get("parentSession") == session_id and record.get("origin") == "subagent":
                    children.append(str(record.get("id")))
        return children

    def migrate_to_v4_sync(self, session_id: str) -> str:
        """Publish a v3 session's v4 successor beside it, under the session's write lock
        (so never while a writer holds it); the path of the v4 file. A v4 session is
        left as it is. See :func:`~._migrate.publish_v4` for what is refused."""
        found = self.find(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        session_dir, generations = found
        version, path = generations[-1]
        if version == V4_VERSION:
            return path
        lock = SessionLock.acquire(session_dir, session_id)
        try:
            artifact = read_artifact(path, self.compression, version)
            self._check_identity(session_id, artifact, session_dir)
            publish_v4(self, artifact, session_dir, self._children_of(session_id))
        finally:
            lock.release()
        return os.path.join(session_dir, generation_filename(V4_VERSION, self.compression))

    async def append(self, lease: JsonlLease, batch: Sequence[Pending]) -> None:
        """One batch as one frame; a torn tail left by a crash is repaired first."""
        if lease.tail_to_repair:
            await offload.run_sync(self._repair_tail_sync, lease)
        if not batch:
            return
        lines = [p.json for p in batch]
        if sum(map(len, lines)) > FRAME_ON_LOOP_MAX:
            lease.size = await self.lane.run(self._append_sync, lease, lines)
            return
        # The checks, the frame and the offset here, only write + fsync on the lane: on a
        # writer thread every call that releases the GIL waits to get it back from a busy
        # event loop, and with many sessions that wait was most of a barrier.
        data = self._prepare(lease, lines)
        lease.size = await self.lane.run(self._write_sync, lease, data)

    def _repair_tail_sync(self, lease: JsonlLease) -> None:
        """Cut torn bytes, then re-append recovered records as their own frame (format.md §4.3)."""
        if lease.truncate_to is not None:
            target = lease.truncate_to
            lease.lock.check()
            try:
                truncate_durable(lease.log_fd(), target)
            except OSError as error:
                raise SessionWriteError(
                    f'failed to cut the torn tail of "{lease.path}" back to {target} bytes: '
                    f"{error}",
                    unknown_state=error,
                ) from error
            lease.truncate_to = None
            lease.size = target
        if lease.rewrite:
            lease.size = self._append_sync(lease, lease.rewrite)
            lease.rewrite = []

    def _append_sync(self, lease: JsonlLease, lines: list[bytes]) -> int:
        """Append one batch, every step on this thread."""
        return self._write_sync(lease, self._prepare(lease, lines))

    def _prepare(self, lease: JsonlLease, lines: list[bytes]) -> bytes:
        """Check the lock and the log's length, put the offset at its end; the frame."""
        lease.lock.check()
        data = _frame_or_lines(_stored_lines(lease.version, lines), self.compression)
        try:
            seek_end(lease.log_fd(), lease.path, lease.size)
        except RuntimeError as error:
            raise SessionPersistenceCorruptionError(
                str(error), path=lease.path, offset=lease.size
            ) from None
        return data

    def _write_sync(self, lease: JsonlLease, data: bytes) -> int:
        """Write and fsync a prepared frame (where: :attr:`lane`); the log's new length."""
        path = lease.path
        try:
            return write_durable(lease.log_fd(), data, lease.size)
        except AppendFailed as failure:
            if failure.rollback_error is not None:
                raise SessionRollbackError(
                    f'failed to roll back append to "{path}": {failure.cause}; '
                    f"rollback: {failure.rollback_error}",
                    (failure.cause, failure.rollback_error),
                ) from failure.cause
            raise SessionWriteError(
                f'failed to append to session log "{path}" (rolled back to '
                f"{lease.size} bytes): {failure.cause}",
                unknown_state=failure.cause if failure.fsync else None,
            ) from failure.cause

    async def release(self, lease: JsonlLease) -> None:
        """Close the log descriptor and release the lock. Idempotent."""
        fd, lease.fd = lease.fd, None
        if fd is not None:
            os.close(fd)
        lease.lock.release()

    async def close(self) -> None:
        return None

    async def held_by(self, session_id: str) -> str | None:
        """Who holds the session's write lock now (``held by a live writer (pid N)``), or
        None when no holder is seen. Takes no lock: a reader asks the kernel (Linux)."""
        found = await anyio.to_thread.run_sync(self.find, session_id)
        if found is None:
            return None
        pid = lock_holder(os.path.join(found[0], LOCK_NAME))
        return None if pid is None else held_by_text(pid)

    async def list(
        self, unreadable: builtins.list[UnreadableListing] | None
    ) -> builtins.list[SessionListing]:
        """Every stored session's header (first frame or line only; never migrates).

        With ``unreadable``, a session whose header is damaged (or names another
        directory) is reported there instead of failing the listing.
        """
        return await anyio.to_thread.run_sync(self.list_sync, unreadable)

class JsonlSessionPersistence(PersistenceService[JsonlLease]):
    """The ``sessionPersistence`` service over :class:`JsonlStorage` (a named constructor).

    ``spawn`` starts a background task (``ctx.start_soon`` or a task group's
    ``start_soon``); without it, buffered events wait for an explicit flush.
    """

    storage: JsonlStorage

    def __init__(
        self,
        root: str,
        compression: Compression = "zstd",
        *,
        spawn: Spawn | None = None,
        logger: logging.Logger | None = None,
        inline_barrier: float = offload.DEFAULT_INLINE_BUDGET,
        write_version: int = CURRENT_VERSION,
    ) -> None:
        super().__init__(
            JsonlStorage(
                root, compression, inline_barrier=inline_barrier, write_version=write_version
            ),
            spawn=spawn,
            logger=logger or _log,
        )

    async def migrate_to_v4(self, session_id: str) -> str:
        """Migrate a stored v3 session to DSH's format v4 (docs/format.md §10.3): its
        ``session.v4.jsonl[.zstd]`` is published beside the untouched v3 file, which later
        reads and writes leave behind. Returns the v4 file's path; raises
        ``SessionFormatUnsupportedError`` naming what DSH's migration would do that this
        build does not, ``SessionAlreadyOwnedError`` while a writer holds the session, and
        ``SessionGenerationSourceChangedError`` when the v3 file changed meanwhile."""
        return await anyio.to_thread.run_sync(self.storage.migrate_to_v4_sync, session_id)
