"""Reading a log from where the last read stopped: :meth:`JsonlStorage.read_from`.

A follower (``dsh serve``'s event stream and ``GET /events`` pages, a CLI reading a log in
pages) asks again and again for the events after a seq. Reading the file whole each time
costs the whole log per change; this reader keeps, per session, a **cursor**: the file (its
path, device and inode), the byte offset just past the last complete record it read (a line,
or a whole zstd frame), the seq that starts there, the 32 bytes before that offset, and a
sparse list of ``(seq, offset)`` record boundaries (one every 256 KiB) to seek to an earlier
seq. A read then costs the bytes appended since (and, to start at an earlier seq, at most
256 KiB more), not the file.

**The cursor is trusted only at a validated point** (docs/format.md §5.3). Before it is used,
the file must still be the same file (same path, device, inode: a migration publishes a new
generation under another name), at least as long as the offset, and hold the same 32 bytes
before it. A truncation below it (a rolled-back write, a repair), a replaced file, or other
bytes there (a rewrite) fail the check, and the read starts again from the header.

**Only the quiet case is decided here.** Whole records that parse, continue the seq chain
and pass the same per-row checks as a full read (:class:`~._reader.LineScanner`, strict), up
to the first incomplete trailing record (a line without its newline, a frame the file ends
inside: an append in progress or a torn tail), which is not read and not shown. Anything
else — a damaged line, a frame that fails its checksum, a header of an older format — raises
:class:`Fallback`, and the caller reads the log whole, where the full rules (the tail rule of
docs/format.md §5.1, migration, the error texts with their offsets) decide.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Final

from dsh_host.sdk import SessionEvent, SessionPersistenceError, decode_stored_event

from ._codec import decode_header_record
from ._frames import decompress_frame, frame_end, split_frames
from ._paths import CURRENT_VERSION, Compression
from ._reader import LineScanner, StoredRow, _Refusal, open_log
from ._v4 import V4_VERSION

__all__ = ["CHUNK_BYTES", "MARK_EVERY_BYTES", "Cursor", "Fallback", "LogFollower"]

#: Bytes read per ``pread``.
CHUNK_BYTES: Final = 256 * 1024
#: Bytes of log between two seek marks of a cursor.
MARK_EVERY_BYTES: Final = 256 * 1024
#: Bytes before the cursor's offset that must be unchanged for the cursor to be used.
CHECK_BYTES: Final = 32
#: Sessions whose cursors are kept (least recently read dropped first).
MAX_CURSORS: Final = 1024
#: Sessions whose carried rows (:class:`_Carry`) are kept: only readers walking in pages
#: leave any, and each holds at most one chunk or frame of rows.
MAX_CARRIES: Final = 16


class Fallback(Exception):
    """The quick path cannot decide this read: read the log whole (the full rules apply)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a session's log was last read to (see the module docstring)."""

    path: str
    dev: int
    ino: int
    version: int
    #: file offset just past the last complete record read
    offset: int
    #: the seq of the record that starts at ``offset``
    next_seq: int
    #: the bytes ``[offset - len(check), offset)``
    check: bytes
    #: ``(seq, offset)`` of record boundaries, ascending; the first is just past the header
    marks: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class _Carry:
    """Rows a page decoded past its ``limit`` (the rest of its last chunk or frame), kept for
    the read that asks for the next seq: a log walked in pages decodes each record once."""

    cursor: Cursor
    first_seq: int
    rows: list[StoredRow]
    plain: list[bool]
    #: the record boundary just after ``rows``, and its seq
    resume_offset: int
    resume_seq: int
    #: zstd: the bytes read past ``resume_offset`` and not parsed yet (at most a chunk)
    raw: bytes = b""


class LogFollower:
    """The cursors of one storage, and the reads that use them (thread-safe)."""

    def __init__(self) -> None:
        self._cursors: OrderedDict[str, Cursor] = OrderedDict()
        self._carries: OrderedDict[str, _Carry] = OrderedDict()
        self._lock = threading.Lock()

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._cursors.pop(session_id, None)
            self._carries.pop(session_id, None)

    def _take_carry(self, session_id: str) -> _Carry | None:
        with self._lock:
            return self._carries.pop(session_id, None)

    def _keep_carry(self, session_id: str, carry: _Carry | None) -> None:
        if carry is None:
            return
        with self._lock:
            self._carries[session_id] = carry
            while len(self._carries) > MAX_CARRIES:
                self._carries.popitem(last=False)

    def _get(self, session_id: str) -> Cursor | None:
        with self._lock:
            cursor = self._cursors.get(session_id)
            if cursor is not None:
                self._cursors.move_to_end(session_id)
            return cursor

    def _put(self, session_id: str, cursor: Cursor) -> None:
        with self._lock:
            known = self._cursors.get(session_id)
            if known is None or known.path != cursor.path or cursor.offset >= known.offset:
                self._cursors[session_id] = cursor
                self._cursors.move_to_end(session_id)
            while len(self._cursors) > MAX_CURSORS:
                self._cursors.popitem(last=False)

    def trailing(self, session_id: str, path: str) -> int | None:
        """Bytes of ``path`` after the last complete record the cursor reached (0: the log ends
        there), or None when there is no valid cursor for that file (nothing read yet, or the
        file changed under it)."""
        cursor = self._get(session_id)
        if cursor is None:
            return None
        with open_log(path) as handle:
            st = os.fstat(handle.fileno())
            if not _still_valid(cursor, path, st, handle.fileno()):
                return None
            return st.st_size - cursor.offset

    def quiet_end(self, session_id: str, path: str) -> int | None:
        """The seq after the last stored record when ``path`` ends exactly at the session's
        cursor (a still valid one: same file, the 32 bytes before it unchanged), without
        reading a record; None when only a read can tell (no cursor, bytes past it, the file
        changed). What an idle follower's poll asks of each log (D47)."""
        cursor = self._get(session_id)
        if cursor is None or cursor.path != path:
            return None
        with open_log(path) as handle:
            st = os.fstat(handle.fileno())
            if st.st_size != cursor.offset or not _still_valid(cursor, path, st, handle.fileno()):
                return None
        return cursor.next_seq

    def next_seq(self, session_id: str, path: str, compression: Compression) -> int:
        """The seq after the last complete record stored (what a new follower starts after):
        the cursor moved to the end, reading only what was appended since."""
        self.read(session_id, path, compression, 1 << 62, None)
        cursor = self._get(session_id)
        if cursor is None or cursor.path != path:
            raise Fallback
        return cursor.next_seq

    def read(
        self,
        session_id: str,
        path: str,
        compression: Compression,
        from_seq: int,
        limit: int | None,
    ) -> list[SessionEvent]:
        """The stored events with ``seq >= from_seq`` (at most ``limit``), from the cursor.

        Raises :class:`Fallback` when the full read must decide.
        """
        with open_log(path) as handle:
            fd = handle.fileno()
            st = os.fstat(fd)
            cursor = self._get(session_id)
            carry = self._take_carry(session_id)
            if cursor is not None and not _still_valid(cursor, path, st, fd):
                cursor = None
            if cursor is None:
                cursor = _start(session_id, path, fd, st.st_size, compression, st)
            out: list[SessionEvent] = []
            if carry is not None and _carry_fits(carry, cursor, from_seq, fd, st.st_size):
                # The rows (and the bytes) after the previous page, read and decoded then.
                skip = from_seq - carry.first_seq
                rows = carry.rows
                stop = len(rows) if limit is None else min(len(rows), skip + limit)
                current = cursor.version == CURRENT_VERSION
                for k in range(skip, stop):
                    seq = carry.first_seq + k
                    out.append(_event(session_id, path, rows[k], seq, current and carry.plain[k]))
                if stop < len(rows):
                    self._keep_carry(session_id, replace(
                        carry, first_seq=carry.first_seq + stop, rows=rows[stop:],
                        plain=carry.plain[stop:],
                    ))
                    self._put(session_id, cursor)
                    return out
                if limit is not None:
                    limit -= len(out)
                scan = _Scan(session_id, path, fd, st.st_size, compression, cursor,
                             carry.resume_seq, carry.resume_offset, carry.raw)
                events, cursor, left = scan.run(carry.resume_seq, limit)
                self._put(session_id, cursor)
                self._keep_carry(session_id, left)
                return out + events
            if from_seq >= cursor.next_seq:
                if cursor.offset >= st.st_size:
                    self._put(session_id, cursor)
                    return out  # nothing appended: one stat and a 32-byte check
                seq, offset = cursor.next_seq, cursor.offset
            else:
                index = bisect.bisect_right(cursor.marks, (from_seq, st.st_size + 1)) - 1
                seq, offset = cursor.marks[max(index, 0)]
            scan = _Scan(session_id, path, fd, st.st_size, compression, cursor, seq, offset)
            events, cursor, left = scan.run(from_seq, limit)
            self._put(session_id, cursor)
            self._keep_carry(session_id, left)
            return out + events


def _carry_fits(carry: _Carry, cursor: Cursor, from_seq: int, fd: int, size: int) -> bool:
    """Whether ``carry`` continues at ``from_seq`` in the file ``cursor`` (just validated)
    is on: the same file, rows before the validated offset, and its unparsed bytes still there
    (their last 32 bytes unchanged, as for the cursor)."""
    if (carry.cursor.path, carry.cursor.dev, carry.cursor.ino) != (
        cursor.path, cursor.dev, cursor.ino
    ):
        return False
    if carry.resume_offset > cursor.offset or not (
        carry.first_seq <= from_seq <= carry.resume_seq
    ):
        return False
    end = carry.resume_offset + len(carry.raw)
    if end > size:
        return False
    tail = carry.raw[-CHECK_BYTES:]
    return not tail or os.pread(fd, len(tail), end - len(tail)) == tail


def _event(
    session_id: str, path: str, row: StoredRow, seq: int, parsed_plain: bool
) -> SessionEvent:
    """A scanned row as its event (a typed row is one already)."""
    if isinstance(row, SessionEvent):
        return row
    try:
        return decode_stored_event(
            row, session_id=session_id, seq=seq, where=path, parsed_plain=parsed_plain
        )
    except SessionPersistenceError:
        raise Fallback from None


def _still_valid(cursor: Cursor, path: str, st: os.stat_result, fd: int) -> bool:
    if (cursor.path, cursor.dev, cursor.ino) != (path, st.st_dev, st.st_ino):
        return False
    if st.st_size < cursor.offset:
        return False
    start = cursor.offset - len(cursor.check)
    return os.pread(fd, len(cursor.check), start) == cursor.check


def _start(
    session_id: str, path: str, fd: int, size: int, compression: Compression, st: os.stat_result
) -> Cursor:
    """A cursor just past the header (read and checked here; any doubt is a fallback)."""
    data = b""
    while True:
        chunk = os.pread(fd, CHUNK_BYTES, len(data))
        data += chunk
        if compression == "zstd":
            try:
                end = frame_end(data, 0)
            except ValueError:
                raise Fallback from None
            if end is not None:
                try:
                    record = decompress_frame(memoryview(data)[:end])
                except Exception:
                    raise Fallback from None
                break
        else:
            newline = data.find(b"\n")
            if newline >= 0:
                end = newline + 1
                record = data[:end]
                break
        if not chunk:
            raise Fallback  # no complete header yet: the full read says what this is
    try:
        header = decode_header_record(record, path)
    except SessionPersistenceError:
        raise Fallback from None
    version = header.get("version")
    if version not in (CURRENT_VERSION, V4_VERSION) or header.get("id") != session_id:
        raise Fallback
    check = data[max(0, end - CHECK_BYTES) : end]
    return Cursor(path, st.st_dev, st.st_ino, int(version), end, 0, check, ((0, end),))


class _Scan:
    """One forward read from a record boundary."""

    def __init__(
        self,
        session_id: str,
        path: str,
        fd: int,
        size: int,
        compression: Compression,
        cursor: Cursor,
        seq: int,
        offset: int,
        prefix: bytes = b"",
    ) -> None:
        self.session_id = session_id
        self.path = path
        self.fd = fd
        self.size = size
        self.compression = compression
        self.cursor = cursor
        self.scanner = LineScanner(cursor.version, "strict", path, offset, typed=True)
        self.scanner.first_seq = seq
        self.marks = list(cursor.marks)
        #: the last record boundary reached and the seq that starts there
        self.seq = seq
        self.offset = offset
        self.out: list[SessionEvent] = []
        #: rows decoded past the limit (the rest of the last chunk or frame), from ``over_seq``
        self.over_seq: int | None = None
        self.over_rows: list[StoredRow] = []
        self.over_plain: list[bool] = []
        #: zstd: bytes from ``offset`` on already read (a carry's); at the end, the bytes read
        #: past ``offset`` and not parsed
        self.pending = prefix

    def _take(self, from_seq: int, limit: int | None) -> None:
        """Move the scanner's decoded rows out (the ones wanted, decoded to events)."""
        scanner = self.scanner
        rows, plain = scanner.events, scanner.plain
        current = scanner.version == CURRENT_VERSION
        for k, row in enumerate(rows):
            seq = scanner.first_seq + k
            if seq < from_seq:
                continue
            if limit is not None and len(self.out) >= limit:
                if self.over_seq is None:
                    self.over_seq = seq
                self.over_rows.append(row)
                self.over_plain.append(plain[k])
                continue
            self.out.append(_event(self.session_id, self.path, row, seq, current and plain[k]))
        scanner.first_seq += len(rows)
        scanner.events = []
        scanner.plain = []

    def _boundary(self, offset: int) -> None:
        """A record boundary at file ``offset``, after every row fed so far."""
        self.seq, self.offset = self.scanner.first_seq + len(self.scanner.events), offset
        if offset > self.marks[-1][1] + MARK_EVERY_BYTES:
            self.marks.append((self.seq, offset))

    def run(
        self, from_seq: int, limit: int | None
    ) -> tuple[list[SessionEvent], Cursor, _Carry | None]:
        try:
            if self.compression == "zstd":
                self._frames(from_seq, limit)
            else:
                self._lines(from_seq, limit)
        except (_Refusal, SessionPersistenceError):
            raise Fallback from None
        cursor = self.cursor
        if self.offset > cursor.offset:
            start = max(0, self.offset - CHECK_BYTES)
            check = os.pread(self.fd, self.offset - start, start)
            cursor = replace(
                cursor, offset=self.offset, next_seq=self.seq, check=check,
                marks=tuple(self.marks),
            )
        carry = None
        if self.over_seq is not None or (self.pending and limit is not None):
            first = self.seq if self.over_seq is None else self.over_seq
            carry = _Carry(cursor, first, self.over_rows, self.over_plain,
                           self.offset, self.seq, bytes(self.pending))
        return self.out, cursor, carry

    def _full(self, limit: int | None) -> bool:
        return limit is not None and len(self.out) >= limit

    def _lines(self, from_seq: int, limit: int | None) -> None:
        position = self.offset
        while position < self.size and not self._full(limit):
            chunk = os.pread(self.fd, min(CHUNK_BYTES, self.size - position), position)
            if not chunk:
                break
            position += len(chunk)
            self.scanner.feed(chunk)
            if self.scanner.issue is not None:
                raise Fallback
            self._boundary(self.scanner.committed)
            self._take(from_seq, limit)

    def _frames(self, from_seq: int, limit: int | None) -> None:
        base = self.offset  # the file offset of ``pending[0]``
        pending = self.pending
        position = base + len(pending)
        while not self._full(limit):
            scan = split_frames(pending)
            if not scan.frames:
                if scan.defect is not None:
                    raise Fallback
                if position >= self.size:
                    break  # nothing, or a frame the file ends inside: not read yet
                chunk = os.pread(self.fd, min(CHUNK_BYTES, self.size - position), position)
                if not chunk:
                    break
                position += len(chunk)
                pending += chunk
                continue
            view = memoryview(pending)
            for start, end in scan.frames:
                try:
                    plaintext = decompress_frame(view[start:end])
                except Exception:
                    view.release()
                    raise Fallback from None
                self.scanner.feed(plaintext)
                if self.scanner.pending:
                    view.release()
                    raise Fallback  # a complete frame ends inside a record: damage
                self._boundary(base + end)
                self._take(from_seq, limit)
                if self._full(limit):
                    break
            view.release()
            pending = pending[self.offset - base :]
            base = self.offset
        self.pending = pending
