"""Every DSH reference fixture reads back exactly as its expected.json says.

The fixtures were encoded from DSH 0.1.6-alpha.2's sources (see their README);
content is compared after decompression, never as compressed bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import zstandard
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import decompress_frame, scan_frames

from dsh_host._persistence.persistence import SessionPersistenceCorruptionError
from dsh_host._session.events import event_to_builtins

from .helpers import plain

pytestmark = pytest.mark.anyio

#: The reference fixtures, shipped in the repo (a copy of ../shared/fixtures/dsh-reference).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-reference"


def _expected() -> dict[str, Any]:
    path = FIXTURES / "expected.json"
    if not path.exists():
        pytest.fail(f"reference fixtures missing: {path}")
    result: dict[str, Any] = json.loads(path.read_text())
    return result


CASES = sorted(_expected().items()) if (FIXTURES / "expected.json").exists() else []


def _root_and_id(rel: str) -> tuple[str, str, str]:
    root, _project, sid, _name = rel.split("/")
    return root, sid, "zstd" if rel.endswith(".zstd") else "none"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def test_fixture_set_is_present() -> None:
    assert len(CASES) == 10, f"expected 10 reference files under {FIXTURES}"


#: Where dsh's reader is deliberately more lenient than DSH's on a torn tail (docs/format.md
#: §5.1): the last frame of ``corrupt-checksum`` fails its checksum and nothing follows it,
#: which is exactly what a power cut during that frame's append can leave, so it is a torn
#: tail here (reported, cut by the next write), not a refusal.
TORN_HERE: dict[str, int] = {"corrupt-checksum": 4}


@pytest.mark.parametrize(("rel", "expected"), CASES, ids=[c[0].split("/")[2] for c in CASES])
async def test_reference_file_reads_as_expected(rel: str, expected: dict[str, Any]) -> None:
    root, sid, compression = _root_and_id(rel)
    path = FIXTURES / rel
    assert path.stat().st_size == expected["bytes"]
    before = _digest(path)
    backend = JsonlSessionPersistence(str(FIXTURES / root), compression)  # type: ignore[arg-type]
    if sid in TORN_HERE:
        assert expected.get("readerMustRefuse")
        load = await (await backend.open(sid, "read")).read()
        assert len(load.events) == TORN_HERE[sid]
        assert load.torn_tail is not None and load.torn_tail.recovered == 0
        assert load.torn_tail.truncate_to == expected["frameOrChunkStarts"][-1]
        assert _digest(path) == before
        return
    if expected.get("readerMustRefuse"):
        with pytest.raises(SessionPersistenceCorruptionError) as refused:
            await backend.open(sid, "read")
        assert expected["refusal"] in str(refused.value)
        assert refused.value.path == str(path)
        assert refused.value.offset == expected["frameOrChunkStarts"][-1]
        assert _digest(path) == before
        return
    load = await (await backend.open(sid, "read")).read()
    assert plain(load.header.to_json()) == {
        k: v for k, v in expected["header"].items() if k != "type"
    }
    assert [e.type for e in load.events] == expected["eventTypes"]
    assert len(load.events) == expected["recoveredEvents"]
    assert load.last_seq == expected["lastSeq"]
    if expected["tornTruncateTo"] is None:
        assert load.torn_tail is None
    else:
        assert load.torn_tail is not None
        assert load.torn_tail.truncate_to == expected["tornTruncateTo"]
        assert load.torn_tail.recovered == expected["recoveredTailCount"]
    if compression == "zstd":
        data = path.read_bytes()
        scan = scan_frames(data)
        assert [start for start, _ in scan.frames] == [
            s for s in expected["frameOrChunkStarts"] if s != scan.torn_start
        ]
    inspected = await backend.inspect(sid)
    assert wire(inspected.closers) == expected["closers"]
    assert inspected.revision == load.revision
    assert _digest(path) == before, "a read-only open must never change the file"


@pytest.mark.parametrize(
    ("rel", "expected"),
    [c for c in CASES if c[1].get("tornTruncateTo") is not None],
    ids=[c[0].split("/")[2] for c in CASES if c[1].get("tornTruncateTo") is not None],
)
async def test_write_handle_repairs_the_torn_tail(
    rel: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    """Truncate the torn bytes, re-append the recovered records as their own frame."""
    root, sid, compression = _root_and_id(rel)
    shutil.copytree(FIXTURES / root, tmp_path / root)
    path = tmp_path / rel
    original = path.read_bytes()
    backend = JsonlSessionPersistence(str(tmp_path / root), compression)  # type: ignore[arg-type]
    before = await (await backend.open(sid, "read")).read()
    handle = await backend.open(sid, "write")
    assert path.read_bytes() == original, "opening for write does not repair yet"
    await handle.flush()  # any flush completes the pending physical repair (D14)
    await handle.close()
    repaired = path.read_bytes()
    cut = expected["tornTruncateTo"]
    assert repaired[:cut] == original[:cut], "committed bytes are never rewritten"
    after = await (await backend.open(sid, "read")).read()
    assert after.torn_tail is None
    assert wire(after.events) == wire(before.events)
    if compression == "zstd":
        scan = scan_frames(repaired)
        assert scan.torn_start is None
        starts = [s for s, _ in scan.frames]
        if expected["recoveredTailCount"]:
            assert starts[-1] == cut, "recovered records are re-written as their own frame"
            start, end = scan.frames[-1]
            assert len(decompress_frame(repaired[start:end])) == expected["tornFramePlaintextBytes"]
            if zstandard.ZSTD_VERSION == (1, 5, 7):  # the fixtures' libzstd: same bytes
                assert len(repaired) == expected["untornBytes"]
                assert repaired[: len(original)] == original
        else:
            assert len(repaired) == cut
    else:
        assert len(repaired) == cut


@pytest.mark.parametrize(
    ("rel", "expected"),
    [c for c in CASES if c[1].get("closers")],
    ids=[c[0].split("/")[2] for c in CASES if c[1].get("closers")],
)
async def test_resume_writes_the_expected_closers(
    rel: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    from dsh_host._session.repair import interrupted_turn_closers

    root, sid, compression = _root_and_id(rel)
    shutil.copytree(FIXTURES / root, tmp_path / root)
    backend = JsonlSessionPersistence(str(tmp_path / root), compression)  # type: ignore[arg-type]
    handle = await backend.open(sid, "write")
    load = await handle.read()
    handle.append(interrupted_turn_closers(load.events))
    await handle.close()
    after = await backend.inspect(sid)
    assert after.closers == ()
    assert wire(after.events[len(load.events) :]) == expected["closers"]
    assert after.torn_tail is None


@pytest.mark.parametrize(
    ("rel", "expected"),
    [c for c in CASES if c[1].get("closers")],
    ids=[c[0].split("/")[2] for c in CASES if c[1].get("closers")],
)
async def test_resume_closers_are_byte_identical_to_dshs(
    rel: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 16 item 5: not only the same JSON — the same bytes, key order included
    (DSH's repair writes surfaceOp before sourceEventSeqs, and a message's source before its
    content). In raw mode the appended lines are compared with the file itself."""
    from dsh_host._session.events import encode_event
    from dsh_host._session.repair import interrupted_turn_closers

    want = [
        json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode()
        for c in expected["closers"]
    ]
    root, sid, compression = _root_and_id(rel)
    shutil.copytree(FIXTURES / root, tmp_path / root)
    backend = JsonlSessionPersistence(str(tmp_path / root), compression)  # type: ignore[arg-type]
    handle = await backend.open(sid, "write")
    load = await handle.read()
    closers = interrupted_turn_closers(load.events)
    assert [encode_event(c) for c in closers] == want
    path = backend.locate(load.header).path
    before = load.torn_tail.truncate_to if load.torn_tail is not None else _size(path)
    handle.append(closers)
    await handle.close()
    if compression == "none":
        assert _bytes_from(path, before).splitlines() == want


def _size(path: str) -> int:
    return os.stat(path).st_size


def _bytes_from(path: str, offset: int) -> bytes:
    with open(path, "rb") as stored:
        stored.seek(offset)
        return stored.read()
