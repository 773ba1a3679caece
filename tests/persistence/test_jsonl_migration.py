"""Older generations (v0, v2): migrated in memory on read; a verified v3 sibling on write."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl import _migrate as migrate_module
from dsh_session_persistence_jsonl._codec import pack_source_seqs
from dsh_session_persistence_jsonl._frames import compress_frame, decompress_frame, scan_frames

from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionGenerationConflictError,
    SessionGenerationSourceChangedError,
)
from dsh_host._session.events import event_to_builtins

from .helpers import T0, plain
from .v0_rows import pack_chunk_rows

pytestmark = pytest.mark.anyio

CWD = "/home/dev/project"
SYSTEM_PLUGIN = "@deepseek-ai/dsh-system-prompt"


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def _e(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": T0 + seq, "data": data, **extra}


def _chunk(seq: int, chunk: dict[str, Any]) -> dict[str, Any]:
    return _e("assistant/chunk", seq, {"turn": 1, "step": 1, "chunk": chunk})


def v0_events() -> list[dict[str, Any]]:
    """A DSH 0.1.1 (format v0) turn: chunk events, a cited message, legacy names."""
    events = [
        _e("turn/start", 0, {"turn": 1, "trigger": "user"}),
        _e("step/start", 1, {"turn": 1, "step": 1}),
        _e(
            "steering/message",
            2,
            {
                "id": "u1",
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "user"},
            },
            surfaceOp="append",
        ),
        _e(
            "request/header",
            3,
            {
                "header": {"config": {"provider": "mock", "model": "m"}, "system": "be brief"},
                "reason": "initial",
            },
        ),
        _chunk(4, {"type": "block-start", "index": 0, "blockType": "text"}),
    ]
    for k, piece in enumerate(["he", "ll", "o", "!"]):
        events.append(_chunk(5 + k, {"type": "text-delta", "index": 0, "text": piece}))
    events.append(
        _chunk(9, {"type": "block-end", "index": 0, "block": {"type": "text", "text": "hello!"}})
    )
    events.append(_chunk(10, {"type": "finish", "reason": {"kind": "stop"}}))
    events.append(
        _e(
            "assistant/message",
            11,
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "a1",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "hello!"}],
                    "source": {"kind": "model", "provider": "mock", "model": "m"},
                },
            },
            surfaceOp="append",
            sourceEventSeqs=list(range(4, 11)),
        )
    )
    events.append(_e("step/end", 12, {"turn": 1, "step": 1}))
    events.append(_e("turn/end", 13, {"turn": 1, "reason": {"kind": "disposed"}}))
    return events


def write_v0(
    root: Path, sid: str, compression: str, events: list[dict[str, Any]], **header: Any
) -> Path:
    directory = root / "--home-dev-project--" / sid
    directory.mkdir(parents=True)
    head = {
        "type": "session",
        "version": 0,
        "id": sid,
        "createdAt": T0,
        "cwd": CWD,
        **header,
        "delegationDepth": 0,
    }
    lines = [json.dumps(row, separators=(",", ":")) for row in pack_chunk_rows(events)]
    head_line = (json.dumps(head, separators=(",", ":")) + "\n").encode()
    body = ("\n".join(lines) + "\n").encode()
    name = "session.jsonl" + (".zstd" if compression == "zstd" else "")
    path = directory / name
    if compression == "zstd":
        path.write_bytes(compress_frame(head_line) + compress_frame(body))
    else:
        path.write_bytes(head_line + body)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_v3() -> list[dict[str, Any]]:
    system_id = (
        "v2-to-v3-system-"
        + hashlib.sha256(
            json.dumps(
                ["session-format-v2-to-v3", "old", 1, "step/start"], separators=(",", ":")
            ).encode()
        ).hexdigest()
    )
    replace_id = (
        "v2-to-v3-system-"
        + hashlib.sha256(
            json.dumps(
                ["session-format-v2-to-v3", "old", 3, "request/header"], separators=(",", ":")
            ).encode()
        ).hexdigest()
    )
    source = {"kind": "plugin", "plugin": SYSTEM_PLUGIN}
    return [
        _e("turn/start", 0, {"turn": 1}),
        _e("step/start", 1, {"turn": 1, "step": 1}),
        {
            "type": "system/message",
            "seq": 2,
            "time": T0 + 1,
            "data": {
                "turn": 1,
                "step": 1,
                "message": {"id": system_id, "role": "system", "source": source, "content": []},
            },
            "surfaceOp": "append",
        },
        {
            "type": "user/message",
            "seq": 3,
            "time": T0 + 2,
            "data": {
                "id": "u1",
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "user"},
            },
            "surfaceOp": "append",
        },
        {
            "type": "system/message",
            "seq": 4,
            "time": T0 + 3,
            "data": {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": replace_id,
                    "role": "system",
                    "source": source,
                    "content": [{"type": "text", "text": "be brief"}],
                },
            },
            "surfaceOp": {"op": "replace", "startSeq": 2, "endSeq": 2},  # DSH v3 spelling
            "sourceEventSeqs": [2],
        },
        {
            "type": "request/header",
            "seq": 5,
            "time": T0 + 3,
            "data": {"header": {"config": {"provider": "mock", "model": "m"}}, "reason": "initial"},
        },
        {
            "type": "assistant/message",
            "seq": 6,
            "time": T0 + 11,
            "data": {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "a1",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "hello!"}],
                    "source": {"kind": "model", "provider": "mock", "model": "m"},
                },
                "stream": [
                    {
                        "type": "chunk",
                        "time": T0 + 4,
                        "chunk": {"type": "block-start", "index": 0, "blockType": "text"},
                    },
                    {
                        "type": "text-chunks",
                        "time0": T0 + 5,
                        "index": 0,
                        "dt": [1, 1, 1],
                        "texts": ["he", "ll", "o", "!"],
                    },
                    {
                        "type": "chunk",
                        "time": T0 + 9,
                        "chunk": {
                            "type": "block-end",
                            "index": 0,
                            "block": {"type": "text", "text": "hello!"},
                        },
                    },
                    {
                        "type": "chunk",
                        "time": T0 + 10,
                        "chunk": {"type": "finish", "reason": {"kind": "stop"}},
                    },
                ],
            },
            "surfaceOp": "append",
        },
        {"type": "step/end", "seq": 7, "time": T0 + 12, "data": {"turn": 1, "step": 1}},
        {
            "type": "turn/end",
            "seq": 8,
            "time": T0 + 13,
            "data": {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "disposed"}}},
        },
    ]


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_v0_is_migrated_in_memory_on_read(tmp_path: Path, compression: str) -> None:
    source = write_v0(tmp_path, "old", compression, v0_events())
    plaintext = source.read_bytes()
    if compression == "zstd":
        frames = scan_frames(plaintext).frames
        plaintext = b"".join(decompress_frame(plaintext[a:b]) for a, b in frames)
    assert b'"type":"text-chunks","seq0":5' in plaintext  # a top-level packed chunk row
    before = _digest(source)
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    load = await (await backend.open("old", "read")).read()
    assert load.source_version == 0
    assert wire(load.events) == expected_v3()
    assert load.header.version == 3 and load.header.is_seeded is False
    assert os.listdir(source.parent) == [source.name], "a read publishes nothing"
    assert _digest(source) == before
    listed = await backend.list()
    assert [(i.header.id, i.source_version) for i in listed] == [("old", 0)]


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_write_open_publishes_a_verified_v3_sibling(tmp_path: Path, compression: str) -> None:
    source = write_v0(tmp_path, "old", compression, v0_events())
    before = _digest(source)
    backend = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    handle = await backend.open("old", "write")
    suffix = ".zstd" if compression == "zstd" else ""
    target = source.parent / f"session.v3.jsonl{suffix}"
    assert target.exists(), "the current generation is published before open returns"
    assert _digest(source) == before, "the source stays byte-identical"
    assert sorted(os.listdir(source.parent)) == sorted(
        ["session.lock", source.name, target.name]
    ), "no migration temp is left behind"
    assert handle.next_seq == 9
    handle.append([_e("turn/start", 9, {"turn": 2})])
    await handle.close()
    reopened = JsonlSessionPersistence(str(tmp_path), compression)  # type: ignore[arg-type]
    load = await (await reopened.open("old", "read")).read()
    assert load.source_version == 3, "the highest generation wins"
    assert wire(load.events) == [*expected_v3(), _e("turn/start", 9, {"turn": 2})]
    assert _digest(source) == before


async def test_source_drift_rejects_publication(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_v0(tmp_path, "old", "zstd", v0_events())
    real_verify = migrate_module._verify

    def verify_then_drift(*args: Any) -> None:
        real_verify(*args)
        with open(source, "ab") as handle:  # a newer writer appended meanwhile
            handle.write(
                compress_frame(b'{"type":"turn/start","seq":14,"time":0,"data":{"turn":2}}\n')
            )

    monkeypatch.setattr(migrate_module, "_verify", verify_then_drift)
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(SessionGenerationSourceChangedError, match="changed while it was being"):
        await backend.open("old", "write")
    assert sorted(os.listdir(source.parent)) == ["session.jsonl.zstd", "session.lock"]
    monkeypatch.undo()
    handle = await backend.open("old", "write")  # the lock was released; a retry works
    assert handle.next_seq == 10  # and it migrates the source as it is now
    await handle.close()


async def test_an_existing_different_target_is_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_v0(tmp_path, "old", "zstd", v0_events())
    target = source.parent / "session.v3.jsonl.zstd"
    real_verify = migrate_module._verify

    def verify_then_race(*args: Any) -> None:
        real_verify(*args)
        target.write_bytes(b"someone else's bytes")

    monkeypatch.setattr(migrate_module, "_verify", verify_then_race)
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(SessionGenerationConflictError, match="refusing to overwrite"):
        await backend.open("old", "write")
    assert target.read_bytes() == b"someone else's bytes"


async def test_seeded_v0_gets_an_inherited_end_seed_marker(tmp_path: Path) -> None:
    events = [
        _e("turn/start", 0, {"turn": 1}),
        _e("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}}),
        _e("session/end-seed", 2, {}),
        _e("turn/start", 3, {"turn": 2}),
    ]
    write_v0(tmp_path, "child", "zstd", events, parentSession="parent", seedLength=2)
    backend = JsonlSessionPersistence(str(tmp_path))
    load = await (await backend.open("child", "read")).read()
    assert load.header.is_seeded is True and load.header.parent_session == "parent"
    got = wire(load.events)
    assert [e["type"] for e in got] == ["turn/start", "turn/end", "session/end-seed", "turn/start"]
    assert got[2]["data"] == {"inherited": True}


async def test_retired_v0_records_are_refused(tmp_path: Path) -> None:
    events = [_e("turn/start", 0, {"turn": 1}), _e("mode/set", 1, {"mode": "x"})]
    write_v0(
        tmp_path,
        "retired",
        "zstd",
        events + [_chunk(k, {"type": "text-delta", "index": 0, "text": "x"}) for k in (2, 3, 4)],
    )
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(SessionFormatUnsupportedError, match="mode/set event at seq 1"):
        await backend.open("retired", "read")


async def test_v2_is_migrated(tmp_path: Path) -> None:
    """A v2 log: v3's shape with the system prompt still inside request/header."""
    v3 = expected_v3()
    v2 = [dict(v3[i]) for i in (0, 1, 3, 5, 6, 7, 8)]  # no system/message events yet
    v2[3] = {
        **v2[3],
        "data": {
            "header": {"config": {"provider": "mock", "model": "m"}, "system": "be brief"},
            "reason": "initial",
        },
    }
    for seq, event in enumerate(v2):
        event["seq"] = seq
    directory = tmp_path / "--home-dev-project--" / "old"
    directory.mkdir(parents=True)
    head = {
        "type": "session",
        "version": 2,
        "id": "old",
        "createdAt": T0,
        "cwd": CWD,
        "isSeeded": False,
        "delegationDepth": 0,
    }
    rows = []
    for event in v2:
        row = dict(event)
        if "sourceEventSeqs" in row:
            row["sourceEventSeqs"] = pack_source_seqs(row["sourceEventSeqs"])
        rows.append(json.dumps(row, separators=(",", ":")))
    (directory / "session.v2.jsonl.zstd").write_bytes(
        compress_frame((json.dumps(head, separators=(",", ":")) + "\n").encode())
        + compress_frame(("\n".join(rows) + "\n").encode())
    )
    backend = JsonlSessionPersistence(str(tmp_path))
    load = await (await backend.open("old", "read")).read()
    assert load.source_version == 2
    # Same anchors (step/start 1, request/header 3) as the v0 source, so the same ids.
    assert wire(load.events) == expected_v3()


async def test_future_generation_is_unsupported(tmp_path: Path) -> None:
    """A version past v4 (the newest DSH format this build reads) says "upgrade", before its
    header's shape is judged (a future header need not satisfy today's checks)."""
    directory = tmp_path / "--home-dev-project--" / "new"
    directory.mkdir(parents=True)
    head = {
        "type": "session",
        "version": 5,
        "id": "new",
        "createdAt": T0,
        "cwd": CWD,
        "isSeeded": False,
        "delegationDepth": 0,
        "someV5Field": 1,
    }
    path = directory / "session.v5.jsonl.zstd"
    path.write_bytes(compress_frame((json.dumps(head) + "\n").encode()))
    backend = JsonlSessionPersistence(str(tmp_path))
    with pytest.raises(
        SessionFormatUnsupportedError, match=r"format v5, but this harness reads DSH's logs up to"
    ) as refused:
        await backend.open("new", "read")
    assert str(path) in str(refused.value)


async def test_a_dsh_017_migrated_directory_is_read_as_its_v4_not_its_old_v3(
    tmp_path: Path,
) -> None:
    """DSH 0.1.7 migrates a v3 log to session.v4.jsonl.zstd and keeps the v3 source beside it:
    the v3 file lacks everything written since, so the v4 generation is the session, for read
    and for write (which continues it as v4, never touching the v3 source)."""
    directory = tmp_path / "--home-dev-project--" / "both"
    directory.mkdir(parents=True)
    v3 = {
        "type": "session",
        "version": 3,
        "id": "both",
        "createdAt": T0,
        "cwd": CWD,
        "isSeeded": False,
        "delegationDepth": 0,
    }
    (directory / "session.v3.jsonl.zstd").write_bytes(
        compress_frame((json.dumps(v3) + "\n").encode())
    )
    (directory / "session.v4.jsonl.zstd").write_bytes(
        compress_frame((json.dumps({**v3, "version": 4}) + "\n").encode())
    )
    source = (directory / "session.v3.jsonl.zstd").read_bytes()
    backend = JsonlSessionPersistence(str(tmp_path))
    for mode in ("read", "write"):
        handle = await backend.open("both", mode)
        load = await handle.read()
        if mode == "read":  # (a write handle's view reports the stored file by its location)
            assert load.source_version == 4
        assert load.location is not None
        assert load.location.path == str(directory / "session.v4.jsonl.zstd")
        await handle.close()
    assert (directory / "session.v3.jsonl.zstd").read_bytes() == source
