"""``PackedLog``: a session's append-only event list, its older pages kept encoded.

A resumed 100k-event session held every decoded event (~650 B each in ``tracemalloc``, ~1.5 KB
of peak RSS), though nearly every reader of an old event reads it once: each fold walks the
log once and then only what is new (``LogFold``, the token meter, the surface projection).
So a ``Session`` keeps its events in a :class:`PackedLog` (docs/decisions.md D37): the newest
events as the decoded objects they are, every older full page of :data:`PAGE` events as one
zstd-compressed block of their JSON lines, decoded again on access, with the last few decoded
pages cached. It is a ``list`` to everything that reads it (index, slice, iterate, ``len``), so
``Session.events`` (a ``LogView`` over it) and every fold over it are unchanged.

An event is packed only when its line decodes back to an equal event in one typed pass
(:func:`~dsh_host._session.events.decode_event_line`); one that would not (a kept wire form, an
unknown ignorable type, a type the typed decoder does not take, such as ``request/header``)
stays in its page as the object.
A re-decoded event equals the one appended; it is not the same object.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, overload

import msgspec
from msgspec import UNSET

from dsh_host._session.events import (
    SessionEvent,
    decode_accepted_line,
    decode_event_line,
    encode_event,
)

__all__ = ["PAGE", "PackedLog", "packed_copy", "packed_under"]

#: Events per packed page; the decoded tail holds between PAGE and 2 * PAGE events.
PAGE: Final = 1024
#: Decoded pages kept (a walk needs one; a look-up back into the previous page is common).
_CACHED: Final = 2
_LEVEL: Final = 1

_codec: list[Any] = []  #: (compressor, decompressor), made when the first page is


def _zstd() -> tuple[Any, Any]:
    """The shared compressor and decompressor (imported on first use: a session that never
    fills a page, and every command that reads none, does not import zstandard for this)."""
    if not _codec:
        import zstandard

        _codec.extend((zstandard.ZstdCompressor(level=_LEVEL), zstandard.ZstdDecompressor()))
    return _codec[0], _codec[1]


class _Page:
    """``PAGE`` events: their joined lines, compressed, and those that are kept as objects."""

    __slots__ = ("blob", "kept")

    def __init__(
        self,
        events: list[SessionEvent],
        shared: dict[bytes, Any],
        given: list[bytes | None] | None = None,
    ) -> None:
        lines: list[bytes] = []
        kept: dict[int, SessionEvent] = {}
        for index, event in enumerate(events):
            line = given[index] if given is not None else None
            if line is not None and b"\n" not in line:
                # The line the event was decoded from (``append_decoded``): it round-trips by
                # construction, no encode and no check decode (docs/decisions.md D46).
                lines.append(line)
                continue
            line = encode_event(event)
            if b"\n" in line or not _round_trips(line, event):
                kept[index] = _sharing(event, line, shared)
                line = b""
            lines.append(line)
        # A copy: the compressor's result sits in a buffer of the input's bound, the rest of
        # it still allocated (measured with tracemalloc: ~290 KB a page instead of ~6 KB).
        self.blob = bytes(memoryview(_zstd()[0].compress(b"\n".join(lines))))
        self.kept = kept or None

    def decode(self) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        kept = self.kept
        for index, line in enumerate(_zstd()[1].decompress(self.blob).split(b"\n")):
            event = kept.get(index) if kept is not None else None
            if event is None:
                event = decode_accepted_line(line) or decode_event_line(line)
                assert event is not None  # checked when packed
            out.append(event)
        return out


def _sharing(event: SessionEvent, line: bytes, shared: dict[bytes, Any]) -> SessionEvent:
    """``event``, its data the one an earlier kept event with equal data holds (the same
    request header logged again keeps one copy of its schemas)."""
    at = line.find(b',"data":')
    if at < 0 or event.wire is not UNSET:
        return event
    key = event.type.encode() + line[at:]
    known = shared.setdefault(key, event.data)
    if known is event.data or known != event.data:
        return event
    return msgspec.structs.replace(event, data=known)


def _round_trips(line: bytes, event: SessionEvent) -> bool:
    """``line`` decodes back to ``event`` in one typed pass. A type without a typed line
    decoder (``request/header``: its schemas are open JSON) is kept as the object: the general
    decoder costs ~20 times the typed one, and such events are few (a request header is
    logged when it changes)."""
    decoded = decode_event_line(line)
    return decoded is not None and decoded == event


class PackedLog(Sequence[SessionEvent]):
    """An append-only list of events: full older pages encoded, the newest decoded."""

    __slots__ = ("_cache", "_last", "_lines", "_pages", "_shared", "_tail")

    def __init__(self, events: Iterable[SessionEvent] = ()) -> None:
        self._pages: list[_Page] = []
        self._tail: list[SessionEvent] = []
        #: Parallel to ``_tail`` while a store's read fills the log: the line each event was
        #: decoded from (``append_decoded``), else None. A copy (what a session adopts) drops
        #: them: they only spare the packing of a read its encode and check decode (D46).
        self._lines: list[bytes | None] = []
        #: (page index, decoded events), newest last.
        self._cache: list[tuple[int, list[SessionEvent]]] = []
        #: The data of kept events, by their encoding: equal data is held once (``_sharing``).
        self._shared: dict[bytes, Any] = {}
        #: The index of the last event of each type appended (docs/decisions.md D46): a reader
        #: of "the last X" (the recorded terms, the last turn end the repair starts after) finds
        #: it without decoding the pages before it. None: not known (a copy of a prefix).
        self._last: dict[str, int] | None = {}
        for event in events:
            self.append(event)

    def copy(self, stop: int | None = None) -> PackedLog:
        """An independent log with the same events, or the first ``stop`` of them (the packed
        pages are shared: immutable)."""
        out = PackedLog()
        out._shared = self._shared
        if stop is None or stop >= len(self):
            out._pages = list(self._pages)
            out._tail = list(self._tail)
            out._lines = [None] * len(out._tail)
            out._last = dict(self._last) if self._last is not None else None
            return out
        whole = max(stop, 0) // PAGE
        out._pages = self._pages[:whole]
        out._tail = list(self._walk(whole * PAGE, max(stop, 0)))
        out._lines = [None] * len(out._tail)
        out._last = None  # the last of a type before ``stop`` is not known without a walk
        return out

    def walk(self, start: int, stop: int) -> Iterator[SessionEvent]:
        """Events ``start`` to ``stop`` one by one, a page decoded at a time (a slice would
        build the list of them all)."""
        return self._walk(start, stop)

    @property
    def packed(self) -> int:
        """How many events are held encoded (not as decoded objects, the cache aside)."""
        return len(self._pages) * PAGE

    def last_of(self, kind: str, stop: int | None = None) -> int | None:
        """The index of the last event of type ``kind`` before ``stop`` (the end of the log
        by default), or None if there is none. Known without a walk when it is the last of its
        type in the log; otherwise found walking back from ``stop``, a page decoded at a time
        (docs/decisions.md D46)."""
        length = len(self)
        stop = length if stop is None else max(min(stop, length), 0)
        last = self._last
        if last is not None:
            found = last.get(kind)
            if found is None:
                return None
            if found < stop:
                return found
        for index, event in self._walk_back(stop):
            if event.type == kind:
                return index
        return None

    def _walk_back(self, stop: int) -> Iterator[tuple[int, SessionEvent]]:
        """``(index, event)`` from ``stop - 1`` down to 0, a page decoded at a time."""
        index = min(stop, len(self)) - 1
        while index >= 0:
            packed = len(self._pages) * PAGE
            if index >= packed:
                yield index, self._tail[index - packed]
                index -= 1
                continue
            number = index // PAGE
            events = self._page(number)
            base = number * PAGE
            while index >= base:
                yield index, events[index - base]
                index -= 1

    def append(self, event: SessionEvent) -> None:
        self.append_decoded(event, None)

    def append_decoded(self, event: SessionEvent, line: bytes | None) -> None:
        """Append ``event``, which ``line`` decoded to in one typed pass: ``event`` is
        ``decode_event_line(line)`` (a store's read, as it types its rows). Its page then
        holds ``line`` as it is, without encoding the event again and checking that the
        encoding decodes back to it (docs/decisions.md D46). None: encode and check."""
        tail = self._tail
        if self._last is not None:
            self._last[event.type] = len(self._pages) * PAGE + len(tail)
        tail.append(event)
        lines = self._lines
        lines.append(line)
        if len(tail) >= 2 * PAGE:
            self._pages.append(_Page(tail[:PAGE], self._shared, lines[:PAGE]))
            del tail[:PAGE]
            del lines[:PAGE]

    def extend(self, events: Iterable[SessionEvent]) -> None:
        for event in events:
            self.append(event)

    def __len__(self) -> int:
        return len(self._pages) * PAGE + len(self._tail)

    def __bool__(self) -> bool:
        return bool(self._pages) or bool(self._tail)

    def _page(self, number: int) -> list[SessionEvent]:
        cache = self._cache
        for at, (cached, events) in enumerate(cache):
            if cached == number:
                if at != len(cache) - 1:
                    cache.append(cache.pop(at))
                return events
        events = self._pages[number].decode()
        cache.append((number, events))
        if len(cache) > _CACHED:
            del cache[0]
        return events

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SessionEvent, ...]: ...

    def __getitem__(self, index: int | slice) -> SessionEvent | tuple[SessionEvent, ...]:
        if isinstance(index, slice):  # a tuple, as a LogView's and a stored load's slices
            start, stop, step = index.indices(len(self))
            if step != 1:
                return tuple(self[i] for i in range(start, stop, step))
            return tuple(self._walk(start, stop))
        packed = len(self._pages) * PAGE
        if index < 0:
            index += packed + len(self._tail)
        if index >= packed:
            return self._tail[index - packed]
        if index < 0:
            raise IndexError("event index out of range")
        return self._page(index // PAGE)[index % PAGE]

    def _walk(self, start: int, stop: int) -> Iterator[SessionEvent]:
        """Events ``start`` to ``stop`` (clamped to the log as it is at each step)."""
        index = start
        while index < stop:
            packed = len(self._pages) * PAGE
            if index >= packed:
                tail = self._tail
                end = min(stop, packed + len(tail))
                if index >= end:
                    return
                yield from tail[index - packed : end - packed]
                index = end
                continue
            number, offset = divmod(index, PAGE)
            events = self._page(number)
            end = min(stop, (number + 1) * PAGE)
            yield from events[offset : offset + end - index]
            index = end

    def __iter__(self) -> Iterator[SessionEvent]:
        return self._walk(0, len(self))

    def __reversed__(self) -> Iterator[SessionEvent]:
        for _, event in self._walk_back(len(self)):
            yield event

    def starts_with(self, prefix: PackedLog) -> bool:
        """``self[: len(prefix)] == prefix``, a page both share (one was copied from the
        other) taken as equal without decoding it."""
        if len(prefix) > len(self):
            return False
        start = 0
        for mine, theirs in zip(self._pages, prefix._pages, strict=False):
            if mine is not theirs:
                break
            start += PAGE
        return all(
            a == b
            for a, b in zip(
                self._walk(start, len(prefix)), prefix._walk(start, len(prefix)), strict=True
            )
        )

    __hash__ = None  # type: ignore[assignment]  # compares by value, like a list

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of equal events (a tuple, a list, a ``LogView``)."""
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            if len(other) != len(self):
                return False
            if isinstance(other, PackedLog) and other._pages == self._pages:
                return other._tail == self._tail  # shared pages: no decode needed
            return all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<PackedLog of {len(self)} events, {self.packed} packed>"


def packed_under(events: object) -> tuple[PackedLog, int] | None:
    """The :class:`PackedLog` ``events`` reads and how many of its events it holds: ``events``
    itself, or the log under a session's ``LogView`` snapshot (its ``lineage``); None for any
    other sequence or iterable."""
    if isinstance(events, PackedLog):
        return events, len(events)
    lineage = getattr(events, "lineage", None)
    if isinstance(lineage, PackedLog) and isinstance(events, Sequence):
        return lineage, len(events)
    return None


def packed_copy(events: Iterable[SessionEvent]) -> PackedLog:
    """A new :class:`PackedLog` of ``events``: a copy sharing the pages of a packed one (a
    store's load), else the events packed as they are walked."""
    if isinstance(events, PackedLog):
        return events.copy()
    return PackedLog(events)
