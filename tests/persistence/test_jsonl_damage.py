"""Crash tails and bit rot: truncate at every byte, flip every byte.

The promise: a read either recovers exactly a prefix of what was written —
never less than the complete frames before the damage when the damage is a
torn tail — or refuses with a typed error naming the file and offset. Never
another exception, never invented data; a read never changes the file, and a
write handle's repair leaves a file that rescans clean.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import scan_frames

from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
)
from dsh_host._session.events import event_to_builtins

from .helpers import header, log, plain

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SID = "damaged"


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


async def _write(
    root: Path, compression: str, batches: list[list[dict[str, Any]]], version: int
) -> Path:
    """The batches as a ``version`` log (v3, or DSH 0.2's v4: the sweeps run on both)."""
    backend = JsonlSessionPersistence(
        str(root),
        compression,  # type: ignore[arg-type]
        write_version=version,
    )
    handle = await backend.create(header(SID))
    for batch in batches:
        handle.append(batch)
        await handle.flush()
    await handle.close()
    path = Path(backend.locate(header(SID)).path)
    assert path.name.startswith(f"session.v{version}.jsonl")
    return path


def _batches() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    events = log(2, tools=1)
    return events, [events[:6], events[6:9], events[9:]]


async def _read(root: Path, compression: str) -> tuple[list[Any] | None, Any, Exception | None]:
    """(events, torn tail, typed refusal) of a fresh read; any other exception propagates."""
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    try:
        load = await (await backend.open(SID, "read")).read()
    except (SessionPersistenceCorruptionError, SessionFormatUnsupportedError) as refused:
        return None, None, refused
    return wire(load.events), load.torn_tail, None


def _repair_here(cut: int, boundaries: set[int]) -> bool:
    """Repair (fsync-heavy) at every 8th offset and around every boundary."""
    return cut % 8 == 0 or any(abs(cut - b) <= 1 for b in boundaries)


def _batch_ends(batches: list[list[dict[str, Any]]]) -> list[int]:
    ends, total = [], 0
    for batch in batches:
        total += len(batch)
        ends.append(total)
    return ends


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_zstd_truncation_at_every_offset_of_the_last_frame(
    tmp_path: Path, version: int
) -> None:
    events, batches = _batches()
    path = await _write(tmp_path / "src", "zstd", batches, version)
    data = path.read_bytes()
    frames = scan_frames(data).frames
    last_start, last_end = frames[-1]
    assert last_end == len(data)
    before_last = _batch_ends(batches)[-2]
    expected = plain(events)
    for cut in range(last_start, len(data)):
        root = tmp_path / f"cut-{cut}"
        target = root / path.relative_to(tmp_path / "src")
        target.parent.mkdir(parents=True)
        target.write_bytes(data[:cut])
        got, torn, refused = await _read(root, "zstd")
        assert refused is None, f"cut at {cut}: {refused}"
        assert got is not None
        assert got == expected[: len(got)], f"cut at {cut}: not a prefix"
        assert before_last <= len(got) <= len(events)
        if cut >= len(data) - 4:  # only the checksum is missing: every record survives
            assert len(got) == len(events), f"cut at {cut}"
        if cut == last_start:
            assert torn is None
        else:
            assert torn is not None and torn.truncate_to == last_start
            assert torn.recovered == len(got) - before_last
        assert target.read_bytes() == data[:cut], "a read must never change the file"
        if not _repair_here(cut, {last_start, len(data) - 4}):
            shutil.rmtree(root)
            continue
        # A write handle repairs: cut torn bytes, re-append recovered records, rescan clean.
        backend = JsonlSessionPersistence(str(root), "zstd")
        handle = await backend.open(SID, "write")
        await handle.flush()
        await handle.close()
        repaired = target.read_bytes()
        assert repaired[:last_start] == data[:last_start]
        assert scan_frames(repaired).torn_start is None
        again, torn_again, _ = await _read(root, "zstd")
        assert again == got and torn_again is None
        shutil.rmtree(root)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_zstd_truncation_anywhere_recovers_a_prefix_or_refuses(
    tmp_path: Path, version: int
) -> None:
    events, batches = _batches()
    path = await _write(tmp_path / "src", "zstd", batches, version)
    data = path.read_bytes()
    header_end = scan_frames(data).frames[0][1]
    expected = plain(events)
    target = tmp_path / "cut" / path.relative_to(tmp_path / "src")
    target.parent.mkdir(parents=True)
    for cut in range(len(data)):
        target.write_bytes(data[:cut])
        got, _torn, refused = await _read(tmp_path / "cut", "zstd")
        if cut < header_end:
            assert isinstance(refused, SessionPersistenceCorruptionError), cut
            assert "header-less" in str(refused)
        else:
            assert refused is None and got is not None, cut
            assert got == expected[: len(got)]
            complete = [e for s, e in scan_frames(data[:cut]).frames]
            assert len(got) >= _complete_events(complete, data, batches)


def _complete_events(frame_ends: list[int], data: bytes, batches: list[list[Any]]) -> int:
    """Events in the batch frames that are complete in the truncated file."""
    batch_frames = len(frame_ends) - 1
    return sum(len(b) for b in batches[:batch_frames])


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_raw_truncation_at_every_offset_of_the_last_batch(
    tmp_path: Path, version: int
) -> None:
    events, batches = _batches()
    path = await _write(tmp_path / "src", "none", batches, version)
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]
    line_ends = []
    offset = 0
    for line in lines:
        offset += len(line) + 1
        line_ends.append(offset)
    last_batch_start = line_ends[_batch_ends(batches)[-2]]  # header line + events before
    expected = plain(events)
    for cut in range(last_batch_start, len(data) + 1):
        root = tmp_path / f"cut-{cut}"
        target = root / path.relative_to(tmp_path / "src")
        target.parent.mkdir(parents=True)
        target.write_bytes(data[:cut])
        got, torn, refused = await _read(root, "none")
        assert refused is None and got is not None, cut
        complete_lines = sum(1 for end in line_ends if end <= cut) - 1
        assert got == expected[:complete_lines], cut
        boundary = line_ends[complete_lines]
        if cut == boundary:
            assert torn is None
        else:
            assert torn is not None and torn.truncate_to == boundary and torn.recovered == 0
        if not _repair_here(cut, set(line_ends)):
            shutil.rmtree(root)
            continue
        backend = JsonlSessionPersistence(str(root), "none")
        handle = await backend.open(SID, "write")
        await handle.flush()
        await handle.close()
        assert target.read_bytes() == data[:boundary]
        shutil.rmtree(root)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_zstd_every_single_byte_flip_is_refused_or_a_torn_prefix(
    tmp_path: Path, version: int
) -> None:
    events, batches = _batches()
    path = await _write(tmp_path / "src", "zstd", batches, version)
    data = path.read_bytes()
    last_start = scan_frames(data).frames[-1][0]
    before_last = _batch_ends(batches)[-2]
    expected = plain(events)
    target = tmp_path / "flip" / path.relative_to(tmp_path / "src")
    target.parent.mkdir(parents=True)
    outcomes = {"refused": 0, "torn": 0, "harmless": 0}
    for position in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[position] ^= mask
            target.write_bytes(bytes(damaged))
            got, _torn, refused = await _read(tmp_path / "flip", "zstd")
            if refused is not None:
                outcomes["refused"] += 1
                if isinstance(refused, SessionPersistenceCorruptionError):
                    assert refused.path == str(target)
                continue
            if got == expected:
                # The flip changed no decoded byte (e.g. an unused entropy-table bit): the
                # checksum over the plaintext still matches, and nothing was lost.
                outcomes["harmless"] += 1
                continue
            # Otherwise only damage in the last frame can pass for a torn tail, and then the
            # result is exactly the complete frames before it.
            assert position >= last_start, f"flip {mask:#x} at {position} was not detected"
            assert got == expected[:before_last], f"flip {mask:#x} at {position}"
            outcomes["torn"] += 1
    assert outcomes["refused"] > outcomes["torn"] + outcomes["harmless"]
