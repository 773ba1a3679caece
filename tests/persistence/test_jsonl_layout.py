"""Root layout rules: one encoding per root, session directories, identity, listing, the lock."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import compress_frame

from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionOwnershipLostError,
    SessionPersistenceCorruptionError,
    UnreadableListing,
)

from .helpers import T0, header, log

pytestmark = pytest.mark.anyio


async def _store(root: Path, sid: str, compression: str = "zstd", **extra: object) -> Path:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    handle = await backend.create(header(sid, **extra))  # type: ignore[arg-type]
    handle.append(log(1))
    await handle.close()
    return Path(backend.locate(header(sid, **extra)).path)  # type: ignore[arg-type]


async def test_locate_is_absolute_and_needs_no_files(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(str(tmp_path / "not-yet"))
    location = backend.locate(header("x/../y", cwd="/a/b"))
    assert location.kind == "jsonl"
    assert location.path == str(
        tmp_path / "not-yet" / "--a-b--" / "x~002F..~002Fy" / "session.v3.jsonl.zstd"
    )
    assert not (tmp_path / "not-yet").exists()
    no_cwd = backend.locate({"version": 3, "id": "z", "createdAt": 0})
    assert "/_no-cwd/z/" in no_cwd.path


async def test_traversal_ids_stay_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for sid in ("../../escape", "..", ".", "/etc/passwd", "a\0b"):
        path = await _store(root, sid)
        assert path.resolve().is_relative_to(root.resolve()), sid
    assert not (tmp_path / "escape").exists()
    backend = JsonlSessionPersistence(str(root))
    assert sorted(i.header.id for i in await backend.list()) == sorted(
        ["../../escape", "..", ".", "/etc/passwd", "a\0b"]
    )


@pytest.mark.parametrize("present", ["zstd", "none"])
async def test_a_root_holds_one_encoding(tmp_path: Path, present: str) -> None:
    await _store(tmp_path, "there", present)
    other = "none" if present == "zstd" else "zstd"
    backend = JsonlSessionPersistence(str(tmp_path), other)  # type: ignore[arg-type]
    suffix = ".jsonl" if present == "none" else ".jsonl.zstd"
    message = f'uses {suffix}, but this backend is configured for compression "{other}"'
    with pytest.raises(SessionFormatUnsupportedError, match=message) as refused:
        await backend.list()
    assert "session.v3" in str(refused.value) and refused.value.location
    for call in (backend.open("there", "read"), backend.create(header("new"))):
        with pytest.raises(SessionFormatUnsupportedError, match="use a separate root"):
            await call


async def test_materialization_refuses_an_opposite_artifact_that_appeared_later(
    tmp_path: Path,
) -> None:
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.create(header("late"))
    handle.append(log(1))
    session_dir = Path(backend.locate(header("late")).path).parent
    session_dir.mkdir(parents=True)
    (session_dir / "session.v3.jsonl").write_bytes(b"{}\n")
    with pytest.raises(SessionFormatUnsupportedError, match=r"uses \.jsonl,"):
        await handle.flush()
    assert sorted(os.listdir(session_dir)) == ["session.v3.jsonl"]  # nothing published


async def test_flat_layout_is_refused(tmp_path: Path) -> None:
    await _store(tmp_path, "ok")
    (tmp_path / "--home-dev-project--" / "flat.jsonl.zstd").write_bytes(b"")
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(SessionFormatUnsupportedError, match="unsupported flat-file layout"):
        await backend.list()
    with pytest.raises(SessionFormatUnsupportedError, match="unsupported flat-file layout"):
        await backend.open("flat", "read")


async def test_stored_identity_must_match_its_directory(tmp_path: Path) -> None:
    source = await _store(tmp_path, "real")
    # The same log copied under another id's directory: the header names "real".
    alias = tmp_path / "--home-dev-project--" / "alias"
    alias.mkdir()
    shutil.copy(source, alias / source.name)
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(
        SessionPersistenceCorruptionError, match='requested id "alias" does not match header id'
    ):
        await backend.open("alias", "read")
    shutil.rmtree(alias)
    # ... or moved to another project directory: the header's cwd points elsewhere.
    moved = tmp_path / "--elsewhere--" / "real"
    moved.parent.mkdir()
    shutil.move(source.parent, moved)
    with pytest.raises(SessionPersistenceCorruptionError, match="and cwd identify"):
        await JsonlSessionPersistence(str(tmp_path)).open("real", "read")


async def test_the_same_id_in_two_projects_is_refused(tmp_path: Path) -> None:
    await _store(tmp_path, "twin", cwd="/one")
    await _store(tmp_path / "other", "twin", cwd="/two")
    shutil.move(tmp_path / "other" / "--two--", tmp_path / "--two--")
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(SessionPersistenceCorruptionError, match="duplicate JSONL session id"):
        await backend.open("twin", "read")
    with pytest.raises(SessionPersistenceCorruptionError, match="duplicate JSONL session id"):
        await backend.list()


async def test_listing_reads_only_headers_and_skips_what_is_not_a_session(
    tmp_path: Path,
) -> None:
    big = "x" * 24_000  # a header far larger than the 8 KB read chunk
    await _store(tmp_path, "big", agentPreset=big)
    path = await _store(tmp_path, "broken-body")
    data = path.read_bytes()
    # the event frame is corrupt, and an intact frame after it proves it is no torn tail
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]) + compress_frame(b"{}\n"))
    project = tmp_path / "--home-dev-project--"
    for name, content in (
        ("empty", b""),
        ("partial", compress_frame(b'{"type":"session"}\n')[:7]),
        ("not-a-header", compress_frame(b'{"type":"turn/start","seq":0}\n')),
    ):
        (project / name).mkdir()
        (project / name / "session.v3.jsonl.zstd").write_bytes(content)
    (tmp_path / "stray-file").write_bytes(b"ignored")
    backend = JsonlSessionPersistence(str(tmp_path))
    listed = await backend.list()
    assert sorted(i.header.id for i in listed) == ["big", "broken-body"]
    with pytest.raises(SessionPersistenceCorruptionError, match="failed validation"):
        await backend.open("broken-body", "read")


async def test_listing_refuses_a_damaged_header_frame(tmp_path: Path) -> None:
    path = await _store(tmp_path, "bad-head")
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SessionPersistenceCorruptionError, match="header frame failed validation"):
        await JsonlSessionPersistence(str(tmp_path)).list()
    # Asked for, the damaged one is reported beside the others instead of failing them all.
    await _store(tmp_path, "fine")
    unreadable: list[UnreadableListing] = []
    listed = await JsonlSessionPersistence(str(tmp_path)).list(unreadable=unreadable)
    assert [i.header.id for i in listed] == ["fine"]
    assert [(u.session_id, u.location and u.location.path) for u in unreadable] == [
        ("bad-head", str(path))
    ]
    assert isinstance(unreadable[0].error, SessionPersistenceCorruptionError)


async def test_absent_root_lists_nothing_and_a_file_root_is_refused(tmp_path: Path) -> None:
    assert await JsonlSessionPersistence(str(tmp_path / "absent")).list() == []
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        JsonlSessionPersistence(str(tmp_path / "file"))


async def test_revisions_change_after_append_and_differ_across_roots(tmp_path: Path) -> None:
    await _store(tmp_path / "a", "r")
    await _store(tmp_path / "b", "r")
    a = JsonlSessionPersistence(str(tmp_path / "a"))
    first = (await a.list())[0].revision
    assert (await a.list())[0].revision == first
    assert (await JsonlSessionPersistence(str(tmp_path / "b")).list())[0].revision != first
    handle = await a.open("r", "write")
    handle.append([{"type": "turn/start", "seq": handle.next_seq, "time": T0, "data": {"turn": 2}}])
    await handle.close()
    assert (await a.list())[0].revision != first


async def test_replacing_the_lock_file_under_a_live_handle_loses_ownership(
    tmp_path: Path,
) -> None:
    path = await _store(tmp_path, "lock")
    backend = JsonlSessionPersistence(str(tmp_path))
    handle = await backend.open("lock", "write")
    lock = path.parent / "session.lock"
    os.unlink(lock)
    lock.write_bytes(b"")  # someone "cleaned up": a second writer could lock this inode
    handle.append([{"type": "turn/start", "seq": handle.next_seq, "time": T0, "data": {"turn": 2}}])
    with pytest.raises(SessionOwnershipLostError, match="removed or replaced"):
        await handle.flush()
    await handle.abandon()
    stored = (await (await backend.open("lock", "read")).read()).events
    assert len(stored) == len(log(1)), "nothing was written without ownership"


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_written_session_has_the_documented_layout(
    tmp_path: Path, compression: str
) -> None:
    """docs/format.md §3: header frame, then one checksummed frame per durable batch."""
    from dsh_session_persistence_jsonl._codec import header_from_meta, header_json_bytes
    from dsh_session_persistence_jsonl._frames import decompress_frame, scan_frames

    events = log(2, tools=2)
    for event in events:  # a cited run of three or more packs to a [start, end] pair
        if event["type"] == "tool/result":
            event["sourceEventSeqs"] = [0, 1, 2, event["sourceEventSeqs"][0]]
    batches = [events[:3], events[3:10], events[10:]]
    root = tmp_path / "root"  # created by the first publication
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    handle = await backend.create(header("layout"))
    for batch in batches:
        handle.append(batch)
        await handle.flush()
    await handle.close()
    path = Path(backend.locate(header("layout")).path)
    session_dir = path.parent
    assert sorted(os.listdir(session_dir)) == ["session.lock", path.name]  # no temp left
    assert os.stat(path).st_mode & 0o777 == 0o600
    for directory in (root, session_dir.parent, session_dir):
        assert os.stat(directory).st_mode & 0o777 == 0o700
    data = await anyio.Path(path).read_bytes()
    head = header_json_bytes(header_from_meta(header("layout")))
    assert head.startswith(b'{"type":"session","version":3,"id":"layout","createdAt":')
    if compression == "zstd":
        scan = scan_frames(data)
        assert scan.torn_start is None and len(scan.frames) == 1 + len(batches)
        plaintexts = [decompress_frame(data[a:b]) for a, b in scan.frames]
        for start, _end in scan.frames:
            assert data[start : start + 4] == b"\x28\xb5\x2f\xfd"
            assert data[start + 4] & 0x04, "every frame carries the content checksum"
    else:
        lines = data.splitlines(keepends=True)
        cuts = [1, 1 + len(batches[0]), 1 + len(batches[0]) + len(batches[1]), len(lines)]
        plaintexts = [lines[0]] + [b"".join(lines[a:b]) for a, b in itertools.pairwise(cuts)]
    assert plaintexts[0] == head, "frame 0 is exactly the header line"
    stored_rows = []
    for plaintext, batch in zip(plaintexts[1:], batches, strict=True):
        assert plaintext.endswith(b"\n")
        rows = [json.loads(line) for line in plaintext.splitlines()]
        assert [r["seq"] for r in rows] == [e["seq"] for e in batch]
        stored_rows += rows
    packed = [r["sourceEventSeqs"] for r in stored_rows if r["type"] == "tool/result"]
    assert all(p[0] == [0, 2] for p in packed), packed


async def test_missing_ancestors_of_the_root_are_created(tmp_path: Path) -> None:
    """The default root ``./.dsh/sessions`` must work in a fresh checkout."""
    root = tmp_path / "fresh" / ".dsh" / "sessions"
    path = await _store(root, "first")
    assert path.is_relative_to(root)
    for directory in (tmp_path / "fresh", tmp_path / "fresh" / ".dsh", root):
        assert os.stat(directory).st_mode & 0o777 == 0o700
