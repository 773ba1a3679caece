"""The JSONL ``sessionPersistence`` service: handles, ownership, write-behind.

Layering inside this plugin: ``_json`` / ``_paths`` / ``_codec`` / ``_frames``
know bytes and JSON values; ``_reader`` reads one file; ``_storage`` and
``_lock`` do durable file and lock operations; ``_migrate`` upgrades older
generations; this module ties them to the persistence seam and the session
core's typed events.

Concurrency model. Every handle serializes its physical writes with one
``anyio.Lock`` (a drain): a drain takes *everything* buffered as one batch,
writes it as one frame on a worker thread, and advances the durable cursor
only when the fsync returned. Events appended meanwhile form the next batch.
``flush`` is a drain loop that returns once the buffer is empty; concurrent
flushes queue on the lock, so seqs are never written twice. Buffered events
also arm a fixed 200 ms window (the first event arms it; later ones do not
extend it) that drains in the background, when the backend was given a way to
start background tasks.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, overload

import anyio
import msgspec

from dsh_host.cancel import CancelToken
from dsh_host.jsonsafe import NonJsonValueError, to_json_builtins
from dsh_host.session.errors import InvalidSessionEventError, UnknownEventTypeError
from dsh_host.session.events import SessionEvent, decode_event, encode_event
from dsh_host.session.header import SessionHeader, parse_session_header
from dsh_host.session.persistence import (
    ArtifactLocation,
    EventLike,
    OpenMode,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionAppendRejectedError,
    SessionFormatUnsupportedError,
    SessionHandleClosedError,
    SessionHandlePoisonedError,
    SessionListing,
    SessionLoad,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionRollbackError,
    SessionWriteError,
    TornTail,
)

from . import _json
from ._codec import (
    RowError,
    check_envelope,
    encode_event_row,
    header_from_meta,
    header_json_bytes,
    pack_source_seqs,
)
from ._frames import compress_frame
from ._lock import SessionLock
from ._migrate import migrate_to_current, publish_generation
from ._paths import (
    CURRENT_VERSION,
    Compression,
    encode_segment,
    generation_filename,
    opposite_suffix_version,
    parse_generation_filename,
    project_dir_name,
)
from ._reader import ArtifactRead, read_artifact, read_header
from ._storage import (
    AppendFailed,
    append_durable,
    make_dirs_durable,
    open_for_append,
    publish_exclusive,
    truncate_durable,
)

__all__ = [
    "LIVE_WRITE_BATCH_MAX_DELAY",
    "JsonlReadHandle",
    "JsonlSessionPersistence",
    "JsonlWriteHandle",
    "event_wire",
]

#: The fixed coalescing window for buffered events (seconds); not configurable (seed 000 §4.1).
LIVE_WRITE_BATCH_MAX_DELAY: Final = 0.2

Spawn = Callable[[Callable[[], Awaitable[Any]]], None]


async def _sleep_window() -> None:
    """The window's wait (module-level so a test can take control of when it expires)."""
    await anyio.sleep(LIVE_WRITE_BATCH_MAX_DELAY)


_log = logging.getLogger("dsh.session-persistence-jsonl")


# --------------------------------------------------------------------------- conversions


def _header_record(header: SessionHeader | Mapping[str, Any]) -> dict[str, Any]:
    """Validated v3 header record (``type`` first, DSH key order)."""
    if isinstance(header, SessionHeader):
        meta: Mapping[str, Any] = header.to_json()
    elif isinstance(header, Mapping):
        try:
            meta = to_json_builtins(header, "session metadata")
        except NonJsonValueError as error:
            raise SessionAppendRejectedError(
                f"session metadata must be losslessly JSON-serializable: {error.problem} at "
                f"{error.path}"
            ) from error
    else:
        raise SessionAppendRejectedError(
            f"session header must be a SessionHeader or a mapping, got {type(header).__qualname__}"
        )
    try:
        return header_from_meta(meta)
    except ValueError as error:
        raise SessionAppendRejectedError(str(error)) from None


def _typed_header(record: Mapping[str, Any], path: str) -> SessionHeader:
    try:
        return parse_session_header({k: v for k, v in record.items() if k != "type"})
    except SessionPersistenceError:
        raise
    except Exception as error:  # InvalidSessionHeaderError: the stored header is damaged
        raise SessionPersistenceCorruptionError(
            f'corrupt session log "{path}": invalid header line ({error})', path=path, offset=0
        ) from error


def _typed_events(
    wire: Sequence[Mapping[str, Any]], session_id: str, path: str
) -> list[SessionEvent]:
    """Decode stored wire events through the core registry (the vocabulary check)."""
    out: list[SessionEvent] = []
    for event in wire:
        try:
            out.append(decode_event(event, where=f"stored event at seq {event.get('seq')}"))
        except UnknownEventTypeError:
            raise SessionFormatUnsupportedError(
                f'session "{session_id}" contains event type "{event.get("type")}" '
                f"(seq {event.get('seq')}) unknown to this harness and not marked ignorable; "
                "refusing to interpret the log — it was likely written by a newer harness "
                f"(raw log: {path})",
                location=path,
            ) from None
        except InvalidSessionEventError as error:
            raise SessionPersistenceCorruptionError(
                f'stored session "{session_id}" failed validation: {error} (raw log: {path})',
                path=path,
            ) from error
    return out


_RETIRED_TYPES: Final = frozenset({"request/header-delta", "mode/set"})


def _reject_retired(session_id: str, kind: str, seq: int, reason: object) -> None:
    """Shapes DSH retired before v3 never enter a log (spec §7.4 step 2, exact texts)."""
    if kind in _RETIRED_TYPES:
        raise SessionAppendRejectedError(
            f'session "{session_id}" contains unsupported legacy {kind} event at seq {seq}'
        )
    if kind == "request/header" and reason == "fallback":
        raise SessionAppendRejectedError(
            f'session "{session_id}" contains unsupported legacy request/header reason '
            f'"fallback" at seq {seq}'
        )


def _prepare(event: EventLike, where: str, session_id: str) -> tuple[bytes, SessionEvent]:
    """An event to append, as (stored line, typed event); rejects with a typed error."""
    if isinstance(event, SessionEvent):
        reason = getattr(event.data, "reason", None) if event.type == "request/header" else None
        _reject_retired(session_id, event.type, event.seq, reason)
        return _typed_line(event), event
    if not isinstance(event, Mapping):
        raise SessionAppendRejectedError(
            f"{where}: expected a SessionEvent or a mapping, got {type(event).__qualname__}"
        )
    try:
        wire = to_json_builtins(event, where)
    except NonJsonValueError as error:
        event_type = event.get("type")
        raise SessionAppendRejectedError(
            f"session event batch is not losslessly JSON-serializable because it contains "
            f'non-JSON-serializable data (event type "{event_type}"): {error.problem} at '
            f"{error.path}"
        ) from error
    try:
        check_envelope(wire)
    except RowError as error:
        raise SessionAppendRejectedError(f"{where}: invalid event envelope: {error}") from None
    data = wire["data"]
    reason = data.get("reason") if isinstance(data, dict) else None
    _reject_retired(session_id, wire["type"], wire["seq"], reason)
    try:
        typed = decode_event(wire, where=where)
    except InvalidSessionEventError as error:
        raise SessionAppendRejectedError(str(error)) from error
    return _encode_line(wire), typed


def _typed_line(event: SessionEvent) -> bytes:
    """The stored line of a core event, fast: msgspec's encoding is used as is when it is
    already what a JS writer produces (no float printed differently, no sourceEventSeqs
    run to pack); otherwise the JSON is re-encoded from plain values."""
    raw = encode_event(event)
    sources = event.source_event_seqs
    packs_as_is = not sources or pack_source_seqs(list(sources)) == list(sources)
    if packs_as_is and _json.floats_match_javascript(raw):
        return raw
    return _encode_line(msgspec.json.decode(raw))


def event_wire(event: SessionEvent) -> dict[str, Any]:
    """The wire form of a core event as plain JSON values (dicts, lists, scalars)."""
    wire: dict[str, Any] = msgspec.json.decode(encode_event(event))
    return wire


def _encode_line(wire: Mapping[str, Any]) -> bytes:
    return _json.dumps_bytes(encode_event_row(wire))


def _frame_or_lines(lines: Sequence[bytes], compression: Compression) -> bytes:
    text = b"\n".join(lines) + b"\n"
    return compress_frame(text) if compression == "zstd" else text


# --------------------------------------------------------------------------- read handle


class JsonlReadHandle:
    """A snapshot of one stored session, decoded at open; no lock, no writes."""

    mode: Literal["read"] = "read"

    def __init__(self, load: SessionLoad) -> None:
        self._load = load
        self._closed = False

    @property
    def id(self) -> str:
        return self._load.id

    async def read(self) -> SessionLoad:
        if self._closed:
            raise SessionHandleClosedError(f'read handle of session "{self.id}" is closed')
        return self._load

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> JsonlReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --------------------------------------------------------------------------- write handle


class JsonlWriteHandle:
    """Exclusive writer of one session log (see the module docstring for concurrency)."""

    mode: Literal["write"] = "write"

    def __init__(
        self,
        backend: JsonlSessionPersistence,
        header: dict[str, Any],
        *,
        session_dir: str,
        lock: SessionLock | None,
        events: list[SessionEvent],
        size: int | None,
        torn: TornTail | None = None,
        recovered_lines: list[bytes] | None = None,
    ) -> None:
        self._backend = backend
        self._header = header
        self._typed_header = _typed_header(header, "<new session>")
        self._session_dir = session_dir
        self._path = os.path.join(
            session_dir, generation_filename(CURRENT_VERSION, backend.compression)
        )
        self._lock = lock
        self._events = events
        #: Durable count: events[:cursor] are stored (or, for a torn tail, recovered).
        self._cursor = len(events)
        #: File size as this handle wrote it; None until materialized.
        self._size = size
        #: Append descriptor of the log, opened on first use, closed with the handle.
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self._drain_lock = anyio.Lock()
        self._truncate_to: int | None = torn.truncate_to if torn is not None else None
        self._rewrite: list[bytes] = list(recovered_lines or [])
        self._torn = torn
        self._poisoned: BaseException | None = None
        self._closed = False
        self._timer: anyio.CancelScope | None = None
        self._barrier = 0
        self._paused = False
        self._reported = False
        #: The live Session bound to this handle, if any (set by the plugin).
        self.bound: object | None = None

    # -- properties

    @property
    def id(self) -> str:
        return str(self._header["id"])

    @property
    def header(self) -> SessionHeader:
        return self._typed_header

    @property
    def path(self) -> str:
        return self._path

    @property
    def next_seq(self) -> int:
        return len(self._events)

    @property
    def durable_seq(self) -> int:
        return self._cursor

    @property
    def materialized(self) -> bool:
        return self._size is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def accepted_events(self) -> tuple[SessionEvent, ...]:
        """Every event this handle holds: stored (incl. a recovered tail) plus appended."""
        return tuple(self._events)

    # -- admission

    def _check_usable(self) -> None:
        if self._closed:
            raise SessionHandleClosedError(
                f'write handle of session "{self.id}" is closed; open the session again'
            )
        if self._poisoned is not None:
            raise SessionHandlePoisonedError(
                f'write handle of session "{self.id}" is unusable after a failed fsync '
                f"({self._poisoned}); what reached the disk is unknown — reopen the session to "
                "continue from what is really stored"
            ) from self._poisoned

    def append(self, events: Sequence[EventLike]) -> None:
        """Accept a contiguous batch (validated here; not durable until a flush)."""
        prepared: list[tuple[bytes, SessionEvent]] = []
        for index, event in enumerate(events):
            where = f'session "{self.id}" append at index {index}'
            prepared.append(_prepare(event, where, self.id))
        if not prepared:
            return
        self._check_usable()
        expected = len(self._events)
        for index, (_line, typed) in enumerate(prepared):
            if typed.seq != expected + index:
                raise SessionAppendRejectedError(
                    f'append seq mismatch for "{self.id}": expected {expected + index} at index '
                    f'{index}, got {typed.seq} (event type "{typed.type}")'
                )
        self._events.extend(typed for _line, typed in prepared)
        self._admit([line for line, _typed in prepared])

    def admit_live(self, event: SessionEvent) -> None:
        """Route one live ``session/event``: events this handle already has are skipped."""
        if event.seq < len(self._events):
            return
        self.append([event])

    def _admit(self, lines: list[bytes]) -> None:
        was_idle = not self._pending
        self._pending.extend(lines)
        if self._barrier:
            return  # the running barrier drains these; no window
        if self._paused:
            self._paused = False
            self._arm_timer()
        elif was_idle:
            self._arm_timer()

    # -- the 200 ms window

    def _arm_timer(self) -> None:
        spawn = self._backend.spawn
        if spawn is None or self._timer is not None:
            return
        scope = anyio.CancelScope()

        async def window() -> None:
            with scope:
                await _sleep_window()
                if self._timer is scope:
                    self._timer = None
                await self._background_drain()
            if self._timer is scope:
                self._timer = None

        try:
            spawn(window)
        except Exception:  # e.g. the host is shutting down: events wait for a flush
            return
        self._timer = scope

    def _cancel_timer(self) -> None:
        scope, self._timer = self._timer, None
        if scope is not None:
            scope.cancel()

    async def _background_drain(self) -> None:
        try:
            async with self._drain_lock:
                if self._pending and not self._closed and self._poisoned is None:
                    await self._write_pending()
        except Exception as error:  # reported once; the batch stays buffered
            self._paused = True
            if not self._reported:
                self._reported = True
                self._backend.logger.warning(
                    '%s: background write for session "%s" failed (buffered events retained): %s',
                    self._backend.name,
                    self.id,
                    error,
                )

    # -- the barrier

    async def flush(self) -> None:
        """Return once everything appended so far is durable (see the seam)."""
        self._check_usable()
        self._cancel_timer()
        self._paused = False
        self._barrier += 1
        try:
            async with self._drain_lock:
                self._check_usable()
                await self._drain_all()
        except BaseException:
            self._paused = True
            raise
        finally:
            self._barrier -= 1
        self._reported = False

    async def _drain_all(self) -> None:
        if not self.materialized and not self._pending:
            await self._write_batch([])  # header-only publication
        if self._truncate_to is not None or self._rewrite:
            await self._repair_tail()
        while self._pending:
            await self._write_pending()

    async def _write_pending(self) -> None:
        batch = self._pending
        self._pending = []
        try:
            await self._write_batch(batch)
        except BaseException:
            self._pending = batch + self._pending
            raise

    async def _write_batch(self, lines: list[bytes]) -> None:
        """Write one batch as one frame (or publish the log), then advance the cursor."""
        if self._truncate_to is not None or self._rewrite:
            await self._repair_tail()
        if self._size is None:
            size = await anyio.to_thread.run_sync(self._materialize_sync, lines)
            self._size = size
        elif lines:
            self._size = await anyio.to_thread.run_sync(self._append_sync, lines)
        self._cursor += len(lines)
        self._torn = None

    async def _repair_tail(self) -> None:
        """Cut torn bytes, then re-append recovered records as their own frame (seed 000 §4.2)."""
        if self._truncate_to is not None:
            target = self._truncate_to
            await anyio.to_thread.run_sync(self._truncate_sync, target)
            self._truncate_to = None
            self._size = target
        if self._rewrite:
            self._size = await anyio.to_thread.run_sync(self._append_sync, self._rewrite)
            self._rewrite = []

    # -- blocking parts (worker thread)

    def _materialize_sync(self, lines: list[bytes]) -> int:
        backend = self._backend
        backend.generations(self._session_dir)  # P1: refuses the other encoding
        make_dirs_durable(backend.dir_chain(self._session_dir))
        if self._lock is None:
            self._lock = SessionLock.acquire(self._session_dir, self.id)
        existing = backend.generations(self._session_dir)
        if existing:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{self.id}": a log already exists on disk '
                f"(load/resume it instead): {existing[-1][1]}"
            )
        header = header_json_bytes(self._header)
        if backend.compression == "zstd":
            content = compress_frame(header)
            if lines:
                content += _frame_or_lines(lines, "zstd")
        else:
            content = header + (b"\n".join(lines) + b"\n" if lines else b"")
        try:
            publish_exclusive(self._path, content)
        except FileExistsError:
            raise SessionAlreadyExistsError(
                f'refusing to materialize "{self.id}": a log already exists on disk '
                f"(load/resume it instead): {self._path}"
            ) from None
        except OSError as error:
            raise SessionWriteError(
                f'failed to publish session log "{self._path}": {error}'
            ) from error
        return len(content)

    def _log_fd(self) -> int:
        if self._fd is None:
            self._fd = open_for_append(self._path)
        return self._fd

    def _append_sync(self, lines: list[bytes]) -> int:
        """Compress (zstd releases the GIL) and append one batch; worker thread."""
        assert self._size is not None and self._lock is not None
        self._lock.check()
        data = _frame_or_lines(lines, self._backend.compression)
        try:
            return append_durable(self._log_fd(), self._path, data, self._size)
        except AppendFailed as failure:
            if failure.rollback_error is not None:
                self._poisoned = failure.rollback_error
                raise SessionRollbackError(
                    f'failed to roll back append to "{self._path}": {failure.cause}; '
                    f"rollback: {failure.rollback_error}",
                    (failure.cause, failure.rollback_error),
                ) from failure.cause
            if failure.fsync:
                self._poisoned = failure.cause
            raise SessionWriteError(
                f'failed to append to session log "{self._path}" (rolled back to '
                f"{self._size} bytes): {failure.cause}"
            ) from failure.cause
        except RuntimeError as error:
            raise SessionPersistenceCorruptionError(
                str(error), path=self._path, offset=self._size
            ) from None

    def _truncate_sync(self, size: int) -> None:
        assert self._lock is not None
        self._lock.check()
        try:
            truncate_durable(self._log_fd(), size)
        except OSError as error:
            self._poisoned = error
            raise SessionWriteError(
                f'failed to cut the torn tail of "{self._path}" back to {size} bytes: {error}'
            ) from error

    # -- reads and lifecycle

    async def read(self) -> SessionLoad:
        if self._closed:
            raise SessionHandleClosedError(f'write handle of session "{self.id}" is closed')
        revision = "unmaterialized"
        if self._size is not None:
            with contextlib.suppress(OSError):
                from ._reader import revision_of

                revision = revision_of(os.stat(self._path))
        return SessionLoad(
            header=self._typed_header,
            events=tuple(self._events),
            revision=revision,
            location=ArtifactLocation("jsonl", self._path),
            torn_tail=self._torn if (self._truncate_to is not None or self._rewrite) else None,
        )

    async def close(self) -> None:
        """Final drain, then release the lock. Idempotent; a failed drain still releases."""
        if self._closed:
            return
        self._cancel_timer()
        try:
            if self._poisoned is None and (
                self._pending or self._truncate_to is not None or self._rewrite
            ):
                self._barrier += 1
                try:
                    with anyio.CancelScope(shield=True):
                        async with self._drain_lock:
                            await self._drain_all()
                finally:
                    self._barrier -= 1
        finally:
            self.release_now()

    def release_now(self) -> None:
        """Drop ownership without draining: close the log, release the lock. Idempotent."""
        self._cancel_timer()
        self._closed = True
        self._backend.forget(self)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if self._lock is not None:
            self._lock.release()

    async def __aenter__(self) -> JsonlWriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --------------------------------------------------------------------------- the service


class JsonlSessionPersistence:
    """Session logs as ``<root>/--<project>--/<id>/session.v3.jsonl[.zstd]``.

    ``spawn`` starts a background task (``ctx.start_soon`` or a task group's
    ``start_soon``); without it, buffered events wait for an explicit flush.
    """

    name = "session-persistence-jsonl"

    def __init__(
        self,
        root: str,
        compression: Compression = "zstd",
        *,
        spawn: Spawn | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if compression not in ("zstd", "none"):
            raise ValueError(f'compression must be "zstd" or "none", got {compression!r}')
        self.root = os.path.abspath(os.path.expanduser(root))
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(f'session root "{self.root}" exists and is not a directory')
        self.compression: Compression = compression
        self.spawn = spawn
        self.logger = logger or _log
        self._owners: dict[str, JsonlWriteHandle] = {}
        #: Ids whose ``open(id, "write")`` is running on a worker thread.
        self._opening: set[str] = set()
        self._root_checked = False

    # -- paths

    def session_dir(self, cwd: str | None, session_id: str) -> str:
        return os.path.join(self.root, project_dir_name(cwd), encode_segment(session_id))

    def locate(self, header: SessionHeader | Mapping[str, Any]) -> ArtifactLocation:
        """The current-generation path for ``header`` (no I/O)."""
        if isinstance(header, SessionHeader):
            cwd = header.to_json().get("cwd")
            sid = header.id
        else:
            cwd, sid = header.get("cwd"), str(header["id"])
        path = os.path.join(
            self.session_dir(cwd, sid), generation_filename(CURRENT_VERSION, self.compression)
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

    # -- encoding and generation checks

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
        out: list[tuple[str, list[str]]] = []
        for name in names:
            path = os.path.join(self.root, name)
            if os.path.isdir(path):
                try:
                    out.append((path, sorted(os.listdir(path))))
                except OSError:
                    continue
        return out

    def find(self, session_id: str) -> tuple[str, list[tuple[int, str]]] | None:
        """The session directory holding ``session_id`` and its generations, or None."""
        self._check_root()
        segment = encode_segment(session_id)
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

    # -- reading

    def _read_sync(
        self, session_id: str
    ) -> tuple[ArtifactRead, dict[str, Any], list[dict[str, Any]]]:
        found = self.find(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        session_dir, generations = found
        version, path = generations[-1]
        artifact = read_artifact(path, self.compression, version)
        self._check_identity(session_id, artifact, session_dir)
        header, events = migrate_to_current(artifact)
        return artifact, header, events

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
        self, artifact: ArtifactRead, header: dict[str, Any], events: list[dict[str, Any]]
    ) -> SessionLoad:
        sid = str(header["id"])
        return SessionLoad(
            header=_typed_header(header, artifact.path),
            events=tuple(_typed_events(events, sid, artifact.path)),
            revision=artifact.revision,
            location=ArtifactLocation("jsonl", artifact.path),
            torn_tail=artifact.torn,
            source_version=artifact.version,
        )

    async def _read(self, session_id: str, token: CancelToken | None) -> SessionLoad:
        if token is not None:
            token.throw_if_aborted()
        artifact, header, events = await anyio.to_thread.run_sync(self._read_sync, session_id)
        if token is not None:
            token.throw_if_aborted()
        return self._load(artifact, header, events)

    # -- the seam

    async def create(self, header: SessionHeader | Mapping[str, Any]) -> JsonlWriteHandle:
        record = _header_record(header)
        sid = str(record["id"])
        if sid in self._owners or sid in self._opening:
            raise SessionAlreadyExistsError(f'session "{sid}" already exists in this backend')
        found = await anyio.to_thread.run_sync(self.find, sid)
        if found is not None:
            raise SessionAlreadyExistsError(
                f'session "{sid}" already has a persisted log on disk; load/resume it instead '
                f"of creating ({found[1][-1][1]})"
            )
        if sid in self._owners or sid in self._opening:  # raced while we looked
            raise SessionAlreadyExistsError(f'session "{sid}" already exists in this backend')
        handle = JsonlWriteHandle(
            self,
            record,
            session_dir=self.session_dir(record.get("cwd"), sid),
            lock=None,
            events=[],
            size=None,
        )
        self._owners[sid] = handle
        return handle

    @overload
    async def open(
        self, session_id: str, mode: Literal["read"], *, token: CancelToken | None = None
    ) -> JsonlReadHandle: ...

    @overload
    async def open(
        self, session_id: str, mode: Literal["write"], *, token: CancelToken | None = None
    ) -> JsonlWriteHandle: ...

    async def open(
        self, session_id: str, mode: OpenMode, *, token: CancelToken | None = None
    ) -> JsonlReadHandle | JsonlWriteHandle:
        if mode == "read":
            return JsonlReadHandle(await self._read(session_id, token))
        if mode != "write":
            raise ValueError(f'open mode must be "read" or "write", got {mode!r}')
        if token is not None:
            token.throw_if_aborted()
        if session_id in self._owners or session_id in self._opening:
            raise SessionAlreadyOwnedError(
                f'session "{session_id}" already has a write handle in this process; close it '
                "before opening another"
            )
        self._opening.add(session_id)
        try:
            handle = await anyio.to_thread.run_sync(self._open_write_sync, session_id)
            self._owners[session_id] = handle
        finally:
            self._opening.discard(session_id)
        return handle

    def _open_write_sync(self, session_id: str) -> JsonlWriteHandle:
        found = self.find(session_id)
        if found is None:
            raise SessionNotFoundError(f'session "{session_id}" not found')
        session_dir = found[0]
        lock = SessionLock.acquire(session_dir, session_id)
        try:
            artifact, header, wire_events = self._read_sync(session_id)
            torn = artifact.torn
            recovered_lines: list[bytes] = []
            if artifact.version != CURRENT_VERSION:
                size = publish_generation(self, artifact, header, wire_events, session_dir)
                torn = None
            else:
                size = artifact.size
                if torn is not None:
                    recovered_lines = [_encode_line(e) for e in artifact.recovered]
            load = self._load(artifact, header, wire_events)
            return JsonlWriteHandle(
                self,
                header,
                session_dir=session_dir,
                lock=lock,
                events=list(load.events),
                size=size,
                torn=torn,
                recovered_lines=recovered_lines,
            )
        except BaseException:
            lock.release()
            raise

    async def inspect(self, session_id: str, *, token: CancelToken | None = None) -> SessionLoad:
        """A read plus in-memory crash closers (nothing is written or truncated)."""
        from dsh_host.session.repair import interrupted_turn_closers

        load = await self._read(session_id, token)
        return dataclasses.replace(load, closers=tuple(interrupted_turn_closers(load.events)))

    async def read_from(
        self, session_id: str, from_seq: int, *, token: CancelToken | None = None
    ) -> tuple[SessionEvent, ...]:
        """Stored events with ``seq >= from_seq`` (no closers, nothing written)."""
        if type(from_seq) is not int or from_seq < 0 or from_seq > 2**53 - 1:
            raise ValueError(
                f"readFrom fromSeq must be a non-negative safe integer, got {from_seq!r}"
            )
        load = await self._read(session_id, token)
        return load.events[from_seq:]

    async def list(self, *, token: CancelToken | None = None) -> list[SessionListing]:
        """Every stored session's header (first frame or line only; never migrates)."""
        if token is not None:
            token.throw_if_aborted()
        return await anyio.to_thread.run_sync(self._list_sync)

    def _list_sync(self) -> builtins.list[SessionListing]:
        self._check_root()
        seen: dict[str, str] = {}
        out: list[SessionListing] = []
        for project, entries in self._projects():
            for name in entries:
                session_dir = os.path.join(project, name)
                generations = self.generations(session_dir)
                if not generations:
                    continue
                version, path = generations[-1]
                listed = read_header(path, self.compression)
                if listed is None:
                    continue
                record, revision = listed
                sid = record.get("id")
                if type(sid) is not str:
                    continue
                try:
                    expected = self.session_dir(record.get("cwd"), sid)
                except ValueError:
                    continue
                if os.path.realpath(expected) != os.path.realpath(session_dir):
                    raise SessionPersistenceCorruptionError(
                        f'corrupt session log "{path}": header id "{sid}" and cwd identify '
                        f'"{expected}"',
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
                    header = _typed_header(header_view, path)
                except SessionPersistenceCorruptionError:
                    continue
                out.append(
                    SessionListing(
                        header=header,
                        revision=revision,
                        location=ArtifactLocation("jsonl", path),
                        source_version=int(record.get("version", version)),
                    )
                )
        out.sort(key=lambda item: (item.header.created_at, item.header.id))
        return out

    # -- tracking

    def owner(self, session_id: str) -> JsonlWriteHandle | None:
        return self._owners.get(session_id)

    def forget(self, handle: JsonlWriteHandle) -> None:
        if self._owners.get(handle.id) is handle:
            del self._owners[handle.id]

    async def aclose(self) -> None:
        """Drain and release every handle; failures are logged and re-raised together."""
        failures: list[BaseException] = []
        for handle in list(self._owners.values()):
            try:
                await handle.close()
            except Exception as error:
                failures.append(error)
                self.logger.error("%s dispose failed for %s: %s", self.name, handle.id, error)
        if failures:
            raise ExceptionGroup(f"{self.name} dispose failed", failures)  # type: ignore[type-var]


def _listing_header(record: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-v3 header shown as v3 for listing (``seedLength`` → ``isSeeded``)."""
    out = {k: v for k, v in record.items() if k != "seedLength"}
    out["version"] = CURRENT_VERSION
    if "isSeeded" not in out:
        out["isSeeded"] = "seedLength" in record
    return out
