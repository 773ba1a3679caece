"""Reading one log file: frames → plaintext → lines → events, with crash-tail rules.

What counts as a crash and what counts as damage (see docs/format.md):

* zstd: the complete frames are checksummed, so *every* defect inside them —
  decompression or checksum failure, a record split across a frame end, a row
  that does not decode, a seq gap — is corruption and refuses the read. Only
  a torn final frame (the file ends inside it) is a crash tail: its complete
  decoded records are kept, anything after the first bad one is dropped.
* raw: there is no checksum, so the rule is by content: the first bad line
  starts a damaged tail that is tolerated (dropped) unless a later line is a
  ``turn/end`` — a closed turn after the damage means committed data was lost.

Nothing here writes; truncation and re-append of a torn tail belong to the
write handle.
"""

from __future__ import annotations

import bisect
import errno
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final, Literal, TypeAlias, cast

from dsh_host.sdk import (
    DSH_V4_ONLY_EVENT_TYPES,
    PackedLog,
    SessionEvent,
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
    TornTail,
    decode_event_line,
    decode_stored_event,
    may_hold_unsafe_int,
)

from . import _json
from ._codec import (
    ADMISSION_TYPES_V3,
    RowError,
    StructuralRefusal,
    admit_v3_row,
    decode_event_row,
    decode_header_record,
    decode_v0_row,
    source_seqs_admissible,
)
from ._frames import (
    MAGIC,
    FrameCorruption,
    decompress_frame,
    decompress_partial,
    frame_end,
    scan_frames,
    split_frames,
)
from ._paths import CURRENT_VERSION, Compression
from ._v4 import V4_VERSION, V4RowError, admit_v4_row, lower_row

__all__ = [
    "ArtifactRead",
    "LineScanner",
    "StoredRow",
    "plain_rows",
    "read_artifact",
    "read_header",
    "revision_of",
]

Recovery = Literal["strict", "recoverable"]

#: One event as the reader hands it over: the row's plain JSON record or, read with
#: ``typed=True``, the typed event itself for a current-format row that is exactly this
#: build's encoding of a valid event (:func:`~dsh_host._session.events.decode_event_line`:
#: one typed decode, nothing left to check).
StoredRow: TypeAlias = dict[str, Any] | SessionEvent

_LIST_CHUNK: Final = 8192
#: Rows a scanner with a ``drain`` holds before it hands them over.
DRAIN_AT: Final = 1024


def revision_of(st: os.stat_result) -> str:
    """The opaque revision of a file: equal while unchanged, different after any write."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class _Refusal(Exception):
    """Internal: a damage verdict the caller turns into the typed error with location."""

    def __init__(self, message: str, offset: int | None) -> None:
        super().__init__(message)
        self.offset = offset


class LineScanner:
    """Incremental scanner of event lines after the header (DSH ``SessionLogScanner``).

    ``feed`` takes plaintext chunks in order; records may span chunks. In
    ``strict`` mode the first defect raises; in ``recoverable`` mode it becomes
    the *issue*: later lines are dropped, unless one of them is a ``turn/end``,
    which raises the issue (a closed turn after damage = lost committed data).

    ``typed`` (current format only): a row that is exactly this build's encoding of a
    valid event is decoded straight into its typed event, in one pass (:data:`StoredRow`);
    every other row takes the plain path below, with all its checks and texts.
    """

    def __init__(
        self,
        version: int,
        recovery: Recovery,
        path: str,
        start_offset: int,
        *,
        typed: bool = False,
    ) -> None:
        self.version = version
        self.recovery: Recovery = recovery
        self.path = path
        self.typed = typed and version == CURRENT_VERSION
        self.events: list[StoredRow] = []
        #: The seq of ``events[0]``: 0 for a read from the header; a follower that drains
        #: ``events`` as it goes (``_follow``) advances it by what it took.
        self.first_seq = 0
        #: Parallel to ``events``: True when the event's row came straight from the
        #: parser and holds no long digit run, so its ``data`` needs no lossless-JSON
        #: walk (``decode_event(parsed_plain=True)``); v0 expansions are never marked.
        self.plain: list[bool] = []
        #: Plaintext offset just past the last good record (header included).
        self.committed = start_offset
        self._offset = start_offset
        self._fragment = bytearray()
        self._line = 0
        self.issue: _Refusal | None = None
        #: The first bad line holds a NUL byte: a hole a power cut left (:meth:`_after_issue`).
        self.hole = False
        #: Maps a plaintext offset to a file offset for error messages.
        self.locate: Callable[[int], int] = lambda offset: offset
        #: Called with the scanner whenever :data:`DRAIN_AT` rows are held (a typed read
        #: moves them into its packed log, even in the middle of one big frame: D37).
        self.drain: Callable[[LineScanner], None] | None = None
        #: With a ``drain``: the line each row of ``events`` decoded in one typed pass came
        #: from, by seq; the drain packs it as it is (docs/decisions.md D46).
        self.lines: dict[int, bytes] = {}

    @property
    def pending(self) -> int:
        """Bytes of an unterminated final record held back."""
        return len(self._fragment)

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                break
            line_start = self._offset - len(self._fragment)
            if self._fragment:
                self._fragment += chunk[start:newline]
                line = bytes(self._fragment)
                self._fragment.clear()
            else:
                line = chunk[start:newline]
            self._offset += newline + 1 - start
            self._consume(line, line_start, self._offset)
            start = newline + 1
            if self.drain is not None and len(self.events) >= DRAIN_AT:
                self.drain(self)
        if start < len(chunk):
            self._fragment += chunk[start:]
            self._offset += len(chunk) - start

    def _problem(self, message: str, line_start: int) -> _Refusal:
        return _Refusal(message, self.locate(line_start))

    def _decode(self, row: object) -> list[dict[str, Any]]:
        if self.version >= 2:
            return [decode_event_row(row)]
        return decode_v0_row(row)

    def _consume(self, line: bytes, line_start: int, line_end: int) -> None:
        self._line += 1
        plain = self.version >= 2 and not may_hold_unsafe_int(line)
        if plain and self.typed:
            typed = decode_event_line(line)
            if (
                typed is not None
                and typed.type not in ADMISSION_TYPES_V3
                and typed.type not in DSH_V4_ONLY_EVENT_TYPES
                and source_seqs_admissible(typed.source_event_seqs, typed.seq)
            ):
                if self._admit_typed(typed, line_start, line_end) and self.drain is not None:
                    self.lines[typed.seq] = line
                return
        try:
            row = _json.loads(line)
        except ValueError:
            issue = self._problem(
                f"corrupt session log: unparsable committed event at line {self._line}",
                line_start,
            )
            if self.recovery == "strict":
                raise issue from None
            if self.issue is None:
                self.issue = issue
                self.hole = b"\0" in line
            return
        if self.version == V4_VERSION:
            try:
                admit_v4_row(row)
            except V4RowError as refusal:
                raise _corrupt(
                    self.path,
                    f"corrupt session log: {refusal} at line {self._line} (DSH refuses such a "
                    "row before its torn-tail rule, so it is never dropped as a tail)",
                    self.locate(line_start),
                ) from None
            if isinstance(row, dict):
                row = lower_row(row)
        if self.version >= 3:
            try:
                admit_v3_row(row)
            except StructuralRefusal as refusal:
                offset = self.locate(line_start)
                if refusal.unsupported:
                    raise SessionFormatUnsupportedError(
                        f'session log "{self.path}": {refusal} (line {self._line}, byte '
                        f"{offset}); a v3 writer never writes this row, so the log is refused "
                        "whole rather than cut",
                        location=self.path,
                    ) from None
                raise _corrupt(
                    self.path,
                    f"corrupt session log: {refusal} at line {self._line} (DSH refuses such a "
                    "row before its torn-tail rule, so it is never dropped as a tail)",
                    offset,
                ) from None
        if (
            self.version < V4_VERSION
            and isinstance(row, dict)
            and row.get("type") in DSH_V4_ONLY_EVENT_TYPES
            and row.get("ignorable") is not True
        ):
            raise SessionFormatUnsupportedError(
                f'session log "{self.path}": format v{self.version} holds the format v4 event '
                f'type "{row["type"]}" (seq {row.get("seq")!r}, line {self._line}); DSH writes '
                "it only in a v4 log (session.v4.jsonl), so this log is refused whole rather "
                "than cut",
                location=self.path,
            )
        closes_turn = isinstance(row, dict) and row.get("type") == "turn/end"
        if self.issue is not None:
            self._after_issue(closes_turn)
            return
        try:
            decoded = self._decode(row)
        except RowError as error:
            issue = self._problem(
                f"corrupt session log: invalid committed event at line {self._line}: {error}",
                line_start,
            )
            if self.recovery == "strict" or closes_turn:
                raise issue from None
            self.issue = issue
            return
        expected = self.first_seq + len(self.events)
        for k, event in enumerate(decoded):
            if event["seq"] != expected + k:
                issue = self._problem(
                    f"corrupt session log: seq gap in committed region at line {self._line} "
                    f"(expected {expected + k}, got {event['seq']})",
                    line_start,
                )
                if self.recovery == "strict" or any(e["type"] == "turn/end" for e in decoded):
                    raise issue
                self.issue = issue
                return
        self.events.extend(decoded)
        self.plain.extend([plain] * len(decoded))
        self.committed = line_end

    def _after_issue(self, closes_turn: bool) -> None:
        """A good line after a bad one: dropped with the tail, unless it proves the bad line
        was committed data.

        Raw lines carry no batch boundaries, so a complete line after damage proves
        nothing by itself: a torn append is a whole batch, and its later lines can reach
        the disk while an earlier part of it did not. DSH's proof is a ``turn/end`` (a
        closed turn after the damage means committed data was lost). That proof fails
        when the bad line holds a NUL byte: no writer writes one (JSON escapes it), so it
        is a hole, bytes that never reached the disk; since bytes written before an fsync
        are durable before any written after it, the hole and everything after it were
        written after the last successful fsync — nothing there was ever durable,
        ``turn/end`` included (docs/format.md §5.1).
        """
        if closes_turn and not self.hole and self.issue is not None:
            raise self.issue

    def _admit_typed(self, event: SessionEvent, line_start: int, line_end: int) -> bool:
        """The plain path's rules after decoding, for a row decoded straight to its event:
        it parsed and passed structural admission and the envelope, so only the damage
        already seen and the seq chain can still stop it (with the plain path's texts)."""
        closes_turn = event.type == "turn/end"
        if self.issue is not None:
            self._after_issue(closes_turn)
            return False
        expected = self.first_seq + len(self.events)
        if event.seq != expected:
            issue = self._problem(
                f"corrupt session log: seq gap in committed region at line {self._line} "
                f"(expected {expected}, got {event.seq})",
                line_start,
            )
            if self.recovery == "strict" or closes_turn:
                raise issue
            self.issue = issue
            return False
        self.events.append(event)
        self.plain.append(True)
        self.committed = line_end
        return True


@dataclass(slots=True)
class ArtifactRead:
    """One file as decoded: header record, contiguous events, crash tail, identity."""

    path: str
    compression: Compression
    version: int
    header: dict[str, Any]
    #: Plain records, and typed events when read with ``typed=True`` (:data:`StoredRow`);
    #: a current-format zstd log read typed: every event, typed, in a :class:`PackedLog`.
    events: list[StoredRow] | PackedLog
    size: int
    revision: str
    torn: TornTail | None = None
    #: zstd: events decoded from the torn frame (a suffix of ``events``).
    recovered: list[dict[str, Any]] = field(default_factory=list)
    #: zstd: file offset where the last complete frame ends (== truncate point when torn).
    complete_end: int = 0
    #: Parallel to ``events`` (see :attr:`LineScanner.plain`); empty means none is marked.
    plain: list[bool] = field(default_factory=list)


def _corrupt(path: str, message: str, offset: int | None) -> SessionPersistenceCorruptionError:
    where = f" at byte {offset}" if offset is not None else ""
    return SessionPersistenceCorruptionError(
        f'{message} (file "{path}"{where}); the log is damaged and was not changed — '
        "restore it from a backup or move it aside to start a new session",
        path=path,
        offset=offset,
    )


def open_log(path: str) -> BinaryIO:
    """Open a stored log for reading: not through a symlink, never blocking, regular files only.

    A FIFO or a symlink where a log should be is not ours (D20): refused as
    corruption rather than followed or waited on.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _corrupt(path, "session log is a symbolic link, not read through", None) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _corrupt(path, "session log is not a regular file", None)
    return os.fdopen(fd, "rb")


def read_stable(path: str) -> tuple[bytes, os.stat_result]:
    """Read a file whose (dev, ino, size, mtime, ctime) is the same before and after.

    A concurrent appender could otherwise hand us a torn snapshot of a healthy
    log. One retry; a file that keeps changing is read as of the second attempt
    only if it is stable then, else the second snapshot is used as is (the
    writer only ever appends whole frames, so a prefix is still a valid read).
    """
    data = b""
    before = os.stat(path)
    for _attempt in range(2):
        with open_log(path) as handle:
            data = handle.read()
        after = os.stat(path)
        if revision_of(before) == revision_of(after) and len(data) == after.st_size:
            return data, after
        before = after
    return data, before


def intact_frame_after(data: bytes, damage: int) -> int | None:
    """Where the first complete, checksum-valid frame after ``damage`` starts, if any.

    This is the one test that tells a torn append from damage (docs/format.md §5.1):
    a power cut can only disturb bytes written after the last successful fsync, and
    the writer fsyncs each frame before it writes the next, so the disturbed bytes
    hold a damaged copy of at most one frame and nothing after it. A complete frame
    whose checksum verifies, starting after the damage, was therefore written *after*
    the damaged bytes were durable — the damage is in committed data, not a tear.

    Every frame starts with the 4-byte magic, so only the positions where the magic
    occurs are candidates (``bytes.find``, one linear pass). Each candidate costs a walk
    of its block headers and, when the frame is structurally complete within the file,
    one decompression with its checksum. The bytes of an honest torn frame are
    compressed data, where the magic appears only by chance (about once per 4 GiB; and
    never in a raw or RLE block of JSON text, since ``0xFD`` is no UTF-8 byte), so the
    search is a single scan of the tail; bytes crafted to hold many overlapping frames
    cost at most one decompression per magic occurrence.
    """
    position = data.find(MAGIC, damage + 1)
    while position >= 0:
        try:
            end = frame_end(data, position)
        except FrameCorruption:
            end = None
        if end is not None:
            try:
                decompress_frame(memoryview(data)[position:end])
            except Exception:
                pass
            else:
                return position
        position = data.find(MAGIC, position + 1)
    return None


def read_artifact(
    path: str, compression: Compression, version: int | None = None, *, typed: bool = False
) -> ArtifactRead:
    """Decode one generation file (see the module docstring for the rules).

    ``typed``: the committed rows of a current-format file that are exactly this build's
    encoding of a valid event come back as typed events (:class:`LineScanner`); a torn
    tail's recovered rows are always plain records (they are re-appended as written).
    """
    data, st = read_stable(path)
    revision = revision_of(st)
    if compression == "zstd":
        return _read_zstd(path, data, revision, version, typed)
    return _read_raw(path, data, revision, version, typed)


def plain_rows(rows: Sequence[StoredRow]) -> list[dict[str, Any]]:
    """``rows`` as the plain records they are (a read without ``typed``, an older format,
    a recovered tail); a typed event among them is a caller's mistake."""
    out = [row for row in rows if isinstance(row, dict)]
    if len(out) != len(rows):
        raise TypeError("expected plain stored records, got typed events")
    return out


class _Drainer:
    """A typed zstd read's ``LineScanner.drain``: the rows so far into one packed log."""

    def __init__(self, path: str, sid: str) -> None:
        self.path, self.sid = path, sid
        self.packed: PackedLog | None = None

    def __call__(self, scanner: LineScanner) -> None:
        self.packed = _drain(scanner, self.packed, self.path, self.sid)


def _drain(scanner: LineScanner, packed: PackedLog | None, path: str, sid: str) -> PackedLog:
    """Move the scanner's rows into ``packed`` (new when None), each typed as the backend's
    load types it (a plain row by the general decoder, with the reader's per-row promise):
    a read of a long log never holds every decoded event at once (docs/decisions.md D37).
    The scanner keeps counting seqs from where its rows end."""
    out = PackedLog() if packed is None else packed
    rows = scanner.events
    lines = scanner.lines
    for row, plain in zip(rows, scanner.plain[len(scanner.plain) - len(rows) :], strict=True):
        if isinstance(row, SessionEvent):
            out.append_decoded(row, lines.pop(row.seq, None))  # its line packed as it is
        else:
            out.append(
                decode_stored_event(
                    row, session_id=sid, seq=row.get("seq"), where=path, parsed_plain=plain
                )
            )
    lines.clear()
    scanner.first_seq += len(rows)
    scanner.events = []  # ``plain`` stays whole: which rows the one-pass decode took
    return out


def _read_zstd(
    path: str, data: bytes, revision: str, version: int | None, typed: bool
) -> ArtifactRead:
    scan = split_frames(data)
    frames: list[tuple[int, int]] = []
    # Where the complete, checksum-valid frames stop, and why the bytes there are no
    # such frame: the first structural defect, or the first frame that fails validation.
    damage = scan.torn_start
    why = (
        str(scan.defect)
        if scan.defect is not None
        else f"Zstandard session log ends inside the frame at byte {damage}"
    )
    scanner: LineScanner | None = None
    #: A typed read's events, typed, in pages (docs/decisions.md D37): its scanner's drain's.
    packed: PackedLog | None = None
    header: dict[str, Any] = {}
    frame_of_offset: list[tuple[int, int]] = []  # (plaintext start, file start)

    def locate(plain: int) -> int:
        index = bisect.bisect_right(frame_of_offset, (plain, len(data))) - 1
        return frame_of_offset[index][1] if index >= 0 else 0

    # Frame by frame: each frame's plaintext is parsed and dropped before the next is
    # decompressed, so a read never holds the whole log's plaintext beside its events.
    offset = 0
    try:
        for start, end in scan.frames:
            try:
                plaintext = decompress_frame(memoryview(data)[start:end])
            except Exception as error:
                damage = start
                why = (
                    f"corrupt Zstandard session log: frame at byte {start} failed validation "
                    f"({error})"
                )
                break
            frames.append((start, end))
            if scanner is None:
                if not plaintext or plaintext.find(b"\n") != len(plaintext) - 1:
                    raise _corrupt(
                        path,
                        "corrupt Zstandard session log: first frame is not exactly one header line",
                        0,
                    )
                header = decode_header_record(plaintext, path, version)
                scanner = LineScanner(
                    header["version"], "strict", path, len(plaintext), typed=typed
                )
                scanner.locate = locate
                if scanner.typed:
                    scanner.drain = _Drainer(path, str(header.get("id")))
                offset = len(plaintext)
                continue
            frame_of_offset.append((offset, start))
            offset += len(plaintext)
            scanner.feed(plaintext)
            if scanner.typed:  # each frame's rows: a plain row's record goes at once
                assert scanner.drain is not None
                scanner.drain(scanner)
    except _Refusal as refusal:
        raise _corrupt(path, str(refusal), refusal.offset) from None
    if scanner is None:
        # The header frame is published whole (fsync'd before its name is linked): a
        # file without a valid first frame was never a log a writer published.
        if damage == 0 and (scan.defect is not None or scan.frames):
            raise _corrupt(path, why, 0)
        raise _corrupt(path, "empty or header-less Zstandard session log", 0)
    torn_start: int | None = None
    if damage is not None:
        later = intact_frame_after(data, damage)
        if later is not None:
            raise _corrupt(
                path,
                f"{why}, and an intact frame follows at byte {later}: the damage is inside "
                "the committed log, not a torn last append",
                damage,
            )
        torn_start = damage
    file_version = header["version"]
    if scanner.pending:
        last_start = frames[-1][0]
        raise _corrupt(
            path,
            "corrupt Zstandard session log: complete frame contains a torn JSONL record",
            last_start,
        )
    complete_end = frames[-1][1]
    sid = str(header.get("id"))
    if scanner.drain is not None:
        scanner.drain(scanner)
        packed = cast("_Drainer", scanner.drain).packed
    events = scanner.events
    recovered: list[dict[str, Any]] = []
    torn: TornTail | None = None
    # The tail scanner stays plain: recovered rows are re-appended from their records.
    if torn_start is not None:
        tail = decompress_partial(data[torn_start:])
        tail_scanner = LineScanner(file_version, "recoverable", path, 0)
        tail_scanner.locate = lambda _plain: torn_start or 0
        tail_scanner.events = events  # continue the seq count
        tail_scanner.plain = scanner.plain
        tail_scanner.first_seq = scanner.first_seq  # past the rows already packed
        before = len(events)
        try:
            tail_scanner.feed(tail)
        except _Refusal as refusal:
            raise _corrupt(path, str(refusal), refusal.offset) from None
        recovered = plain_rows(events[before:])
        torn = TornTail(truncate_to=torn_start, recovered=len(recovered), size=len(data))
        if packed is not None:
            packed = _drain(tail_scanner, packed, path, sid)
    return ArtifactRead(
        path=path,
        compression="zstd",
        version=file_version,
        header=header,
        events=events if packed is None else packed,
        size=len(data),
        revision=revision,
        torn=torn,
        recovered=recovered,
        complete_end=complete_end,
        plain=scanner.plain,
    )


def _read_raw(
    path: str, data: bytes, revision: str, version: int | None, typed: bool
) -> ArtifactRead:
    newline = data.find(b"\n")
    if newline < 0:
        raise _corrupt(path, "empty or header-less session log", 0)
    header = decode_header_record(data[: newline + 1], path, version)
    scanner = LineScanner(header["version"], "recoverable", path, newline + 1, typed=typed)
    try:
        scanner.feed(data[newline + 1 :])
    except _Refusal as refusal:
        raise _corrupt(path, str(refusal), refusal.offset) from None
    torn = None
    if scanner.committed < len(data):
        torn = TornTail(truncate_to=scanner.committed, recovered=0, size=len(data))
    return ArtifactRead(
        path=path,
        compression="none",
        version=header["version"],
        header=header,
        events=scanner.events,
        size=len(data),
        revision=revision,
        torn=torn,
        complete_end=scanner.committed,
        plain=scanner.plain,
    )


def read_header(path: str, compression: Compression) -> tuple[dict[str, Any], str] | None:
    """The header of a log, reading only as far as its first frame or line.

    Returns None for a file whose first record is not complete yet (listing
    skips it); raises for a first record that is complete but damaged.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    with open_log(path) as handle:
        data = b""
        while True:
            chunk = handle.read(_LIST_CHUNK)
            data += chunk
            if compression == "zstd":
                try:
                    scan = scan_frames(data)
                except FrameCorruption as error:
                    if error.offset == 0 or not chunk:
                        raise _corrupt(path, str(error), error.offset) from None
                    scan = None
                if scan is not None and scan.frames:
                    start, end = scan.frames[0]
                    try:
                        head = decompress_frame(data[start:end])
                    except Exception as error:
                        raise _corrupt(
                            path,
                            f"corrupt Zstandard session log: header frame failed validation "
                            f"({error})",
                            0,
                        ) from None
                    if not head or head.find(b"\n") != len(head) - 1:
                        raise _corrupt(
                            path,
                            "corrupt Zstandard session log: first frame is not exactly one "
                            "header line",
                            0,
                        )
                    listed = _parse_listed_header(head, path)
                    return None if listed is None else (listed, revision_of(st))
            else:
                newline = data.find(b"\n")
                if newline >= 0:
                    listed = _parse_listed_header(data[: newline + 1], path)
                    return None if listed is None else (listed, revision_of(st))
            if not chunk:
                return None


def _parse_listed_header(record: bytes, path: str) -> dict[str, Any] | None:
    """A listed header, or None when the first record is not a header this build lists.

    Listing never refuses the whole root because one file is foreign: a
    non-header first record, or a header of a format this build cannot read,
    is skipped (opening that session reports why).
    """
    try:
        return decode_header_record(record, path)
    except (SessionFormatUnsupportedError, SessionPersistenceCorruptionError):
        return None
