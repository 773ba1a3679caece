"""Holes at the tail (issue 42): what a power cut can leave of the last append, at every byte.

A power cut during the last append can leave, after the last fsync'd byte, any mix of
the append's pages and zero-filled ones (a page that never reached the disk reads as
zeros), with the file's length either the old or the new one. The rule under test
(docs/format.md §5.1): bytes after the last complete, valid frame that are not followed
by a valid frame are a torn tail — recovered, cut by the next write — while damage
followed by an intact frame is refused.

The sweeps decode bytes in memory through the reader's own per-encoding entry points
(tens of thousands of shapes); a sample of them goes through the real backend, files
and a write handle's repair. Every shape is judged against what was durable: the events
of the frames before the last append must all come back, in order, and nothing read may
differ from what was written.
"""

from __future__ import annotations

import base64
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import scan_frames
from dsh_session_persistence_jsonl._reader import (
    ArtifactRead,
    _read_raw,
    _read_zstd,
    plain_rows,
)

from dsh_host._persistence.persistence import SessionPersistenceCorruptionError

from .helpers import ev, header, log, user

pytestmark = [pytest.mark.anyio]

SID = "holes"
PAGE = 4096
SECTOR = 512


def _noise(seed: int, size: int) -> str:
    """Text that compresses poorly, so one batch spans more than one page."""
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()


def _batches() -> list[list[dict[str, Any]]]:
    events = log(1, tools=1)
    n = len(events)
    middle = [user(n, _noise(1, 2500)), user(n + 1, _noise(2, 1500))]
    # The last append closes a turn: in raw mode a readable ``turn/end`` after damage is
    # DSH's proof of committed damage, so a hole before it must still read as torn.
    last = [
        user(n + 2, _noise(3, 2600)),
        user(n + 3, _noise(4, 2600)),
        ev("turn/end", n + 4, {"turn": 2, "reason": {"kind": "completed"}}),
    ]
    return [events, middle, last]


async def _write(root: Path, compression: str) -> Path:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    handle = await backend.create(header(SID))
    for batch in _batches():
        handle.append(batch)
        await handle.flush()
    await handle.close()
    return Path(backend.locate(header(SID)).path)


def _decode(compression: str, data: bytes) -> ArtifactRead:
    read = _read_zstd if compression == "zstd" else _read_raw
    return read("log", data, "rev", None, False)


def _append_starts(compression: str, data: bytes) -> list[int]:
    """Where each durable append starts (the header's, then one per batch)."""
    if compression == "zstd":
        return [start for start, _end in scan_frames(data).frames]
    sizes = [0, 1, *(len(batch) for batch in _batches())]
    lines = data.split(b"\n")
    starts, position, index = [], 0, 0
    for count in sizes[1:]:
        starts.append(position)
        for line in lines[index : index + count]:
            position += len(line) + 1
        index += count
    return starts


def _up(offset: int, unit: int) -> int:
    return offset - offset % unit + unit


def _shapes(data: bytes, start: int) -> Iterator[tuple[str, int, bytes]]:
    """Every tail shape a cut during the append at ``start`` can leave, at every byte."""
    garbage = random.Random(7).randbytes(len(data))
    end = len(data)
    for o in range(start, end):
        yield "cut", o, data[:o]
        yield "zeros to the end", o, data[:o] + bytes(end - o)
        for unit in (SECTOR, PAGE):
            hole_end = min(end, _up(o, unit))
            yield (
                f"{unit}-aligned hole, then the rest",
                o,
                (data[:o] + bytes(hole_end - o) + data[hole_end:]),
            )
            yield (
                f"{unit}-aligned hole, then garbage",
                o,
                (data[:o] + bytes(hole_end - o) + garbage[hole_end:end]),
            )
            yield (
                f"{unit}-aligned hole, then a cut",
                o,
                (data[:o] + bytes(hole_end - o) + data[hole_end : (hole_end + end) // 2]),
            )


def _page_subsets(data: bytes, start: int) -> Iterator[tuple[str, int, bytes]]:
    """The append's pages, each either written or zero-filled, at the new or the old size."""
    edges = sorted({start, *range(_up(start, PAGE), len(data), PAGE), len(data)})
    pages = list(itertools.pairwise(edges))
    for mask in range(1 << len(pages)):
        image = bytearray(data)
        for bit, (low, high) in enumerate(pages):
            if not mask >> bit & 1:
                image[low:high] = bytes(high - low)
        yield f"pages {mask:b}", start, bytes(image)
        kept = [high for bit, (_low, high) in enumerate(pages) if mask >> bit & 1]
        if kept:
            yield f"pages {mask:b}, size at its last page", start, bytes(image[: max(kept)])


def _judge(
    compression: str, shape: bytes, durable: int, reference: list[dict[str, Any]], start: int
) -> str | None:
    """Why ``shape`` breaks the promise, or None."""
    try:
        read = _decode(compression, shape)
    except SessionPersistenceCorruptionError as refused:
        return f"refused: {refused}"
    events = plain_rows(read.events)
    if events[:durable] != reference[:durable] or len(events) < durable:
        return f"lost durable events: read {len(events)} of {durable}"
    if events != reference[: len(events)]:
        return "read events that were never written"
    if read.torn is not None and read.torn.truncate_to < start:
        return f"would cut durable bytes: truncate to {read.torn.truncate_to} < {start}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_every_hole_shape_in_the_last_append_keeps_every_durable_event(
    tmp_path: Path, compression: str
) -> None:
    path = await _write(tmp_path, compression)
    data = path.read_bytes()
    starts = _append_starts(compression, data)
    start = starts[-1]
    assert len(data) - start > PAGE and start % PAGE != 0  # the append spans a page boundary
    reference = plain_rows(_decode(compression, data).events)
    durable = len(reference) - len(_batches()[-1])
    failures: list[str] = []
    seen = 0
    for name, offset, shape in [*_shapes(data, start), *_page_subsets(data, start)]:
        if shape == data:
            continue
        seen += 1
        why = _judge(compression, shape, durable, reference, start)
        if why is not None:
            failures.append(f"{name} at byte {offset}: {why}")
    assert seen > 5 * (len(data) - start)
    assert not failures, f"{len(failures)} of {seen} shapes:\n" + "\n".join(failures[:20])


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_holes_are_repaired_by_the_next_write(tmp_path: Path, compression: str) -> None:
    """A sample of the shapes through the real backend: read, then a write handle cuts the
    tail, appends, and the file reads back clean with every durable event."""
    source = tmp_path / "source"
    path = await _write(source, compression)
    data = path.read_bytes()
    start = _append_starts(compression, data)[-1]
    reference = plain_rows(_decode(compression, data).events)
    durable = len(reference) - len(_batches()[-1])
    backend = JsonlSessionPersistence(str(source), compression)  # type: ignore[arg-type]
    checked = 0
    for name, offset, shape in _shapes(data, start):
        if offset % 211 != 0 or "hole" not in name:
            continue
        path.write_bytes(shape)
        load = await (await backend.open(SID, "read")).read()
        assert load.torn_tail is not None, (name, offset)
        kept = len(load.events)
        assert kept >= durable, (name, offset)
        handle = await backend.open(SID, "write")
        extra = user(kept, "after the repair")
        handle.append([extra])
        await handle.flush()
        await handle.close()
        again = await (await backend.open(SID, "read")).read()
        assert again.torn_tail is None, (name, offset)
        assert len(again.events) == kept + 1, (name, offset)
        assert path.read_bytes()[:start] == data[:start], (name, offset)
        checked += 1
    assert checked >= 10


def _middle_damage(
    data: bytes, low: int, high: int, garbage: bytes
) -> Iterator[tuple[str, int, int, bytes]]:
    """Damage ``[o, end)`` inside the committed append ``[low, high)``, later appends intact."""
    for o in range(low, high):
        for unit in (SECTOR, PAGE):
            end = min(high, _up(o, unit))
            yield f"{unit}-aligned zeros", o, end, data[:o] + bytes(end - o) + data[end:]
        end = min(high, _up(o, SECTOR))
        yield "garbage to the next sector", o, end, data[:o] + garbage[o:end] + data[end:]


@pytest.mark.slow
async def test_zstd_damage_followed_by_an_intact_frame_is_refused_at_every_byte(
    tmp_path: Path,
) -> None:
    """Every shape of damage to the middle batch frame, with the last frame intact after it:
    refused at the damaged frame's start (never read as a torn tail, never cut)."""
    path = await _write(tmp_path, "zstd")
    data = path.read_bytes()
    starts = _append_starts("zstd", data)
    low, high = starts[-2], starts[-1]
    failures = []
    garbage = random.Random(11).randbytes(len(data))
    shapes = list(_middle_damage(data, low, high, garbage))
    shapes += [
        ("one flipped byte", o, o + 1, data[:o] + bytes([data[o] ^ 0x41]) + data[o + 1 :])
        for o in range(low, high)
    ]
    for name, offset, _end, shape in shapes:
        if shape == data:
            continue
        try:
            _decode("zstd", shape)
        except SessionPersistenceCorruptionError as refused:
            if refused.offset != low:
                failures.append(f"{name} at {offset}: refused at {refused.offset}, not {low}")
        else:
            failures.append(f"{name} at {offset}: not refused")
    assert not failures, f"{len(failures)} shapes:\n" + "\n".join(failures[:20])


@pytest.mark.slow
async def test_raw_damage_followed_by_a_closed_turn_is_refused_unless_it_is_a_hole(
    tmp_path: Path,
) -> None:
    """Raw lines carry no batch boundaries, so the proof of committed damage is a later
    ``turn/end`` (DSH's rule) — except after a NUL byte, which no writer writes and only a
    power cut leaves (a hole): everything after it was written after the last fsync."""
    root = tmp_path / "raw"
    backend = JsonlSessionPersistence(str(root), "none")
    handle = await backend.create(header(SID))
    batches = _batches()
    closing = log(2, tools=1)[len(log(1, tools=1)) :]
    n = sum(map(len, batches[:2]))
    closing = [{**event, "seq": n + k} for k, event in enumerate(closing)]
    for batch in [*batches[:2], closing]:
        handle.append(batch)
        await handle.flush()
    await handle.close()
    data = await anyio.Path(backend.locate(header(SID)).path).read_bytes()
    lines = data.split(b"\n")
    low = len(lines[0]) + 1 + sum(len(line) + 1 for line in lines[1 : 1 + len(batches[0])])
    high = low + sum(len(line) + 1 for line in lines[1 + len(batches[0]) : 1 + n])
    assert b'"turn/end"' in data[high:]
    failures = []
    # 0xFF is no UTF-8 byte: every garbage run makes its line unparsable (a raw log has
    # no checksum, so damage that stays valid JSON is not detectable at all).
    for name, offset, _end, shape in _middle_damage(data, low, high, b"\xff" * len(data)):
        hole = "zeros" in name
        try:
            read = _decode("none", shape)
        except SessionPersistenceCorruptionError:
            if hole:
                failures.append(f"{name} at {offset}: refused a hole")
        else:
            if not hole:
                failures.append(f"{name} at {offset}: damage before a turn/end was read")
            elif read.torn is None or read.torn.truncate_to > offset:
                failures.append(f"{name} at {offset}: hole not reported as a torn tail")
    assert not failures, f"{len(failures)} shapes:\n" + "\n".join(failures[:20])
