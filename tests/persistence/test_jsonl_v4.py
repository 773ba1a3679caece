"""DSH format v4 (DSH 0.1.7 and later): read, continued, written, refused, round-tripped.

The fixtures (tests/fixtures/dsh-v4, README there) are the v3 reference fixtures rewritten
by DSH's v4 writer rules in a script of their own, so each v4 file must read as exactly
its v3 source does, and what this build writes into a v4 log must be the script's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._frames import decompress_frame, scan_frames
from dsh_session_persistence_jsonl._plugin import JsonlConfig

from dsh_host._persistence.persistence import SessionPersistenceCorruptionError
from dsh_host._session.events import event_to_builtins

from .helpers import header, log, plain, turn

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
V4 = FIXTURES / "dsh-v4"
EXPECTED: dict[str, Any] = json.loads((V4 / "expected.json").read_text())
CASES = sorted(EXPECTED.items())
IDS = [rel.split("/")[2] for rel, _ in CASES]


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def _split(rel: str) -> tuple[str, str, str]:
    root, _project, sid, _name = rel.split("/")
    return root, sid, "zstd" if rel.endswith(".zstd") else "none"


def _file_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fixture_set_is_present() -> None:
    assert len(CASES) == 11


@pytest.mark.parametrize("write_version", [3, 4])
@pytest.mark.parametrize(("rel", "want"), CASES, ids=IDS)
async def test_v4_file_reads_as_its_v3_source(
    rel: str, want: dict[str, Any], write_version: int
) -> None:
    """Every v4 fixture gives the events, header, torn tail and closers its v3 source gives,
    whatever format the root writes new sessions in; a read never changes the file."""
    root, sid, compression = _split(rel)
    path = V4 / rel
    assert path.stat().st_size == want["bytes"]
    before = _digest(path)
    source_root = FIXTURES / want["fromV3"].split("/")[0] / root
    v3 = JsonlSessionPersistence(str(source_root), compression)  # type: ignore[arg-type]
    v4 = JsonlSessionPersistence(
        str(V4 / root),
        compression,  # type: ignore[arg-type]
        write_version=write_version,
    )
    got = await (await v4.open(sid, "read")).read()
    ref = await (await v3.open(sid, "read")).read()
    assert got.source_version == 4
    assert got.location is not None and got.location.path == str(path)
    assert got.header == ref.header
    assert wire(got.events) == wire(ref.events)
    if want["tornTruncateTo"] is None and not want["readerMustRefuse"]:
        assert got.torn_tail is None
    else:
        assert got.torn_tail is not None and ref.torn_tail is not None
        assert got.torn_tail.recovered == ref.torn_tail.recovered
        if want["tornTruncateTo"] is not None:
            assert got.torn_tail.truncate_to == want["tornTruncateTo"]
    assert wire((await v4.inspect(sid)).closers) == wire((await v3.inspect(sid)).closers)
    listed = {s.header.id: s for s in await v4.list()}
    assert listed[sid].source_version == 4
    assert _digest(path) == before


@pytest.mark.parametrize(
    ("rel", "want"),
    [c for c in CASES if c[1]["closersV4Lines"]],
    ids=[i for i, c in zip(IDS, CASES, strict=True) if c[1]["closersV4Lines"]],
)
async def test_resume_continues_a_v4_log_in_v4(
    rel: str, want: dict[str, Any], tmp_path: Path
) -> None:
    """A v3-configured root resumes a v4 session in v4: the closers land in session.v4 as
    DSH's v4 rows (tool-role results), byte for byte in raw mode, and no v3 file appears."""
    from dsh_host._session.repair import interrupted_turn_closers

    root, sid, compression = _split(rel)
    shutil.copytree(V4 / root, tmp_path / root)
    path = tmp_path / rel
    backend = JsonlSessionPersistence(str(tmp_path / root), compression)  # type: ignore[arg-type]
    handle = await backend.open(sid, "write")
    load = await handle.read()
    assert load.location is not None and load.location.path == str(path)
    start = load.torn_tail.truncate_to if load.torn_tail is not None else path.stat().st_size
    closers = interrupted_turn_closers(load.events)
    handle.append(closers)
    await handle.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["session.lock", path.name]
    after = await (await backend.open(sid, "read")).read()
    assert after.torn_tail is None and after.source_version == 4
    assert wire(after.events[len(load.events) :]) == wire(closers)
    results = [json.loads(line) for line in want["closersV4Lines"]]
    results = [r for r in results if r["type"] == "tool/result"]
    assert all(r["data"]["message"]["role"] == "tool" for r in results)
    if compression == "none":
        tail = path.read_bytes()[start:].decode().splitlines()
        if load.torn_tail is not None:
            tail = tail[-len(want["closersV4Lines"]) :]
        assert tail == want["closersV4Lines"]


async def test_v3_v4_round_trip_is_byte_identical(tmp_path: Path) -> None:
    """The compacted session (tool results, a system-prompt source, compaction checkpoints):
    its v3 events written into a v4 root give the v4 fixture's bytes, and read back from
    there and written into a v3 root give the v3 fixture's bytes."""
    rel = "root-none/--home-dev-project--/compacted-session/session.v4.jsonl"
    v4_bytes = (V4 / rel).read_bytes()
    v3_bytes = (FIXTURES / EXPECTED[rel]["fromV3"]).read_bytes()
    source = JsonlSessionPersistence(str(FIXTURES / "dsh-compacted-session" / "root-none"), "none")
    load = await (await source.open("compacted-session", "read")).read()

    async def write(root: Path, version: int, events: Any) -> str:
        backend = JsonlSessionPersistence(str(root), "none", write_version=version)
        handle = await backend.create(load.header)
        handle.append(list(events))
        await handle.close()
        return backend.locate(load.header).path

    def read(path: str) -> bytes:
        return Path(path).read_bytes()

    assert read(await write(tmp_path / "v4", 4, load.events)) == v4_bytes
    back = JsonlSessionPersistence(str(tmp_path / "v4"), "none")
    again = await (await back.open("compacted-session", "read")).read()
    assert wire(again.events) == wire(load.events)
    assert read(await write(tmp_path / "v3", 3, again.events)) == v3_bytes


def _v4_log(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    directory = tmp_path / "--home-dev-project--" / "bad"
    directory.mkdir(parents=True)
    head = {
        "type": "session",
        "version": 4,
        "id": "bad",
        "createdAt": 1789200000000,
        "cwd": "/home/dev/project",
        "isSeeded": False,
        "delegationDepth": 0,
    }
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in [head, *rows])
    path = directory / "session.v4.jsonl"
    path.write_text(text)
    return path


def _v3_rows() -> list[dict[str, Any]]:
    """One closed turn with a tool call, as the core's v3 rows."""
    return [plain(e) for e in log(1, tools=1)]


def _v4_result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    (result,) = [r for r in rows if r["type"] == "tool/result"]
    return result


def _lift(result: dict[str, Any]) -> dict[str, Any]:
    message = result["data"]["message"]
    (wrapper,) = message["content"]
    lifted = {
        "role": "tool",
        "source": message["source"],
        "toolCallId": wrapper["toolCallId"],
        "content": wrapper["content"],
        "id": message["id"],
    }
    return {**result, "data": {**result["data"], "message": lifted}}


def _refused_case(name: str) -> list[dict[str, Any]]:
    rows = _v3_rows()
    index = next(i for i, r in enumerate(rows) if r["type"] == "tool/result")
    lifted = _lift(rows[index])
    message = lifted["data"]["message"]
    if name == "v3-wrapper-result":
        return rows  # the tool result left in v3's user-role wrapper shape
    if name == "plugin-source":
        user = next(i for i, r in enumerate(rows) if r["type"] == "user/message")
        rows[user] = {
            **rows[user],
            "data": {**rows[user]["data"], "source": {"kind": "plugin", "plugin": "goal"}},
        }
    elif name == "call-id-mismatch":
        message["toolCallId"] = "call-other"
    elif name == "wrapper-inside-tool-message":
        message["content"] = [{"type": "tool-result", "toolCallId": "x", "content": []}]
    elif name == "error-without-isError":
        lifted["data"]["error"] = {"name": "Boom", "code": "TOOL_FAILED"}
    elif name == "isError-not-boolean":
        message["isError"] = "yes"
    elif name == "wrapper-streamed":
        assistant = next(i for i, r in enumerate(rows) if r["type"] == "assistant/message")
        stream = rows[assistant]["data"]["stream"]
        stream.append(
            {
                "type": "chunk",
                "time": stream[-1]["time"],
                "chunk": {"type": "block-start", "index": 9, "blockType": "tool-result"},
            }
        )
    rows[index] = lifted
    return rows


REFUSALS = {
    "v3-wrapper-result": "needs a tool-role message",
    "plugin-source": "retired plugin source wrapper",
    "call-id-mismatch": "needs toolCallId matching its tool source",
    "wrapper-inside-tool-message": "holds a retired tool-result wrapper block",
    "error-without-isError": "error metadata for a non-error result",
    "isError-not-boolean": "isError must be a boolean",
    "wrapper-streamed": "streams a retired tool-result block",
}


@pytest.mark.parametrize(("name", "text"), sorted(REFUSALS.items()))
async def test_v4_row_admission_refuses_the_whole_log(name: str, text: str, tmp_path: Path) -> None:
    """DSH's native v4 rules (tool-role.ts, message-sources.ts) refuse the file, naming the
    row; nothing is cut as a torn tail (the row is a v4 writer's impossibility), nothing
    changes on disk — for the read and the write handle alike."""
    rows = _refused_case(name)
    path = _v4_log(tmp_path, rows)
    before = path.read_bytes()
    backend = JsonlSessionPersistence(str(tmp_path), "none")
    for mode in ("read", "write"):
        with pytest.raises(SessionPersistenceCorruptionError, match=text) as refused:
            await backend.open("bad", mode)
        assert refused.value.path == str(path)
        assert "never dropped as a tail" in str(refused.value)
    assert path.read_bytes() == before


async def test_the_same_rows_lifted_are_admitted(tmp_path: Path) -> None:
    """The control of the refusals above: the unbroken v4 rows read as the v3 rows."""
    rows = _v3_rows()
    index = next(i for i, r in enumerate(rows) if r["type"] == "tool/result")
    v4_rows = [*rows]
    v4_rows[index] = _lift(rows[index])
    _v4_log(tmp_path, v4_rows)
    load = await (await JsonlSessionPersistence(str(tmp_path), "none").open("bad", "read")).read()
    assert wire(load.events) == rows


def test_format_is_a_per_root_choice_defaulting_to_v3() -> None:
    assert JsonlConfig().format == "v3"
    assert msgspec.convert({"format": "v4"}, JsonlConfig).format == "v4"
    with pytest.raises(msgspec.ValidationError, match=r"format"):
        msgspec.convert({"format": "v5"}, JsonlConfig)


async def test_a_v4_root_writes_new_sessions_as_v4(tmp_path: Path) -> None:
    backend = JsonlSessionPersistence(str(tmp_path), "zstd", write_version=4)
    handle = await backend.create(header("fresh"))
    handle.append(log(1, tools=1))
    await handle.close()
    path = Path(backend.locate(header("fresh")).path)
    assert path.name == "session.v4.jsonl.zstd"
    load = await (await JsonlSessionPersistence(str(tmp_path)).open("fresh", "read")).read()
    assert load.source_version == 4
    assert wire(load.events) == [plain(e) for e in log(1, tools=1)]
    with pytest.raises(ValueError, match="write_version must be 3 or 4"):
        JsonlSessionPersistence(str(tmp_path), write_version=5)


def _developer(seq: int, content: list[Any], **data: Any) -> dict[str, Any]:
    """A DSH 0.2 ``developer/message`` row, in the key order ``createDeveloperMessage``
    gives (the producer's input, then role and id)."""
    message = {"content": content, "source": {"kind": "tool-registry"}}
    message.update(role="developer", id=f"developer-{seq}")
    return {
        "type": "developer/message",
        "seq": seq,
        "time": 1789200000002,
        "data": {"turn": 1, "step": 1, **data, "message": message},
        "surfaceOp": "append",
    }


_CATALOG = {"version": 1, "childId": "child-1", "childCreatedAt": 5, "mode": "unknown"}


def _with_v4_events(dev: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One closed turn (no tools) holding a developer message after its step/start, and a
    subagent/catalog and workspace/changes after it (DSH 0.2's v4-only or newly read rows)."""
    rows = [plain(e) for e in log(1, tools=0)]
    at = next(i for i, r in enumerate(rows) if r["type"] == "step/start") + 1
    additions = [{"type": "tool-addition", "toolName": "read"}]
    rows.insert(
        at,
        dev
        or _developer(at, [*additions, {"type": "tool-removal", "toolName": "old"}], headerSeq=0),
    )
    for seq, row in enumerate(rows):
        row["seq"] = seq
    rows.append(
        {"type": "subagent/catalog", "seq": len(rows), "time": 1789200000009, "data": _CATALOG}
    )
    rows.append(
        {"type": "workspace/changes", "seq": len(rows), "time": 1789200000009, "data": {"turn": 1}}
    )
    return rows


async def test_v4_only_events_are_read_typed_projected_and_round_trip(tmp_path: Path) -> None:
    """DSH 0.2's ``developer/message`` is read as a typed surface event and the model sees it
    as a system message ("[tool enabled: read]", DSH's text rendering); ``subagent/catalog``
    and ``workspace/changes`` are kept as data; the log written back into a v4 root is the
    same bytes, and a write handle continues it (docs/format.md §10.1 rows 9, 11)."""
    from dsh_host._session.events import DeveloperMessageData
    from dsh_host._session.messages import SystemMessage, TextBlock
    from dsh_host._session.session import derive_messages_from_events

    path = _v4_log(tmp_path / "in", _with_v4_events())
    backend = JsonlSessionPersistence(str(tmp_path / "in"), "none")
    load = await (await backend.open("bad", "read")).read()
    (dev,) = [e for e in load.events if e.type == "developer/message"]
    assert isinstance(dev.data, DeveloperMessageData) and dev.data.header_seq == 0
    (system,) = [m for m in derive_messages_from_events(load.events) if m.role == "system"]
    assert isinstance(system, SystemMessage) and system.id == dev.data.message.id
    assert system.content == (
        TextBlock(text="[tool enabled: read]"),
        TextBlock(text="[tool disabled: old]"),
    )
    catalog = next(e for e in load.events if e.type == "subagent/catalog")
    assert dict(catalog.data) == _CATALOG
    out = JsonlSessionPersistence(str(tmp_path / "out"), "none", write_version=4)
    handle = await out.create(load.header)
    handle.append(load.events)
    await handle.close()
    written = _file_bytes(out.locate(load.header).path)
    assert written == _file_bytes(str(path))
    writer = await backend.open("bad", "write")
    writer.append(turn(len(load.events), 2, closed=True, tools=0))
    await writer.close()
    again = await (await backend.open("bad", "read")).read()
    assert wire(again.events[: len(load.events)]) == wire(load.events)
    assert _file_bytes(str(path)).startswith(written)


def _catalog(**change: Any) -> dict[str, Any]:
    return {**_CATALOG, **change}


V4_ONLY_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "developer-role-elsewhere": ({"role": "developer"}, "developer role must occur together"),
    "addition-without-headerSeq": ({"headerSeq": None}, "headerSeq must be a non-negative"),
    "headerSeq-without-additions": ({"content": []}, "must omit headerSeq"),
    "inline-tool-definition": ({"inline": True}, "must omit inline tool definitions"),
    "empty-toolName": ({"toolName": ""}, "requires a nonempty toolName"),
    "plugin-source": ({"source": {"kind": "plugin", "plugin": "x"}}, "retired plugin source"),
    "tool-change-in-user-message": ({"user": True}, "requires developer role"),
    "catalog-version": ({"catalog": _catalog(version=2)}, "version must be 0 or 1"),
    "catalog-unknown-mode-v0": ({"catalog": _catalog(version=0)}, "mode must be one of"),
    "catalog-continuable-unlabelled": (
        {"catalog": _catalog(mode="continuable")},
        "needs a string label",
    ),
    "deferLoading-false": ({"defer": False}, "deferLoading must be true"),
}


def _broken(change: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _with_v4_events()
    dev = next(r for r in rows if r["type"] == "developer/message")
    message = dev["data"]["message"]
    if change.get("role"):
        user = next(r for r in rows if r["type"] == "user/message")
        user["data"]["role"] = "developer"
    if "headerSeq" in change:
        del dev["data"]["headerSeq"]
    if "content" in change:
        message["content"] = change["content"]
    if change.get("inline"):
        message["content"][0]["tool"] = {"name": "read"}
    if "toolName" in change:
        message["content"][1]["toolName"] = change["toolName"]
    if "source" in change:
        message["source"] = change["source"]
    if change.get("user"):
        user = next(r for r in rows if r["type"] == "user/message")
        user["data"]["content"].append({"type": "tool-removal", "toolName": "bash"})
    if "catalog" in change:
        next(r for r in rows if r["type"] == "subagent/catalog")["data"] = change["catalog"]
    if "defer" in change:
        request = {
            "turn": 1,
            "header": {"tools": [{"name": "read", "deferLoading": change["defer"]}]},
        }
        rows.append({"type": "request/header", "seq": len(rows), "time": 1, "data": request})
    return rows


@pytest.mark.parametrize(("name", "case"), sorted(V4_ONLY_REFUSALS.items()))
async def test_v4_only_rules_refuse_the_whole_log(
    name: str, case: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    """DSH's native rules for the v4-only rows (``developer.ts``; the catalog rules of the
    v3-to-v4 README) refuse the file naming the row, never cut it as a tail; the unbroken
    rows (the test above) are admitted."""
    change, text = case
    path = _v4_log(tmp_path, _broken(change))
    backend = JsonlSessionPersistence(str(tmp_path), "none")
    with pytest.raises(SessionPersistenceCorruptionError, match=text) as refused:
        await backend.open("bad", "read")
    assert "never dropped as a tail" in str(refused.value) and refused.value.path == str(path)


async def test_a_v3_log_never_holds_a_v4_only_event(tmp_path: Path) -> None:
    """DSH 0.1.5 refuses a v3 log holding ``developer/message``: so does the reader (the
    whole log, naming it), and the writer refuses to put one into a v3 log."""
    from dsh_host._persistence.persistence import SessionFormatUnsupportedError, SessionWriteError

    rows = [r for r in _with_v4_events() if r["type"] != "subagent/catalog"]
    path = _v4_log(tmp_path / "v3", rows)
    v3_path = path.with_name("session.v3.jsonl")
    head, *rest = path.read_text().splitlines(keepends=True)
    v3_path.write_text(head.replace('"version":4', '"version":3') + "".join(rest))
    path.unlink()
    backend = JsonlSessionPersistence(str(tmp_path / "v3"), "none")
    with pytest.raises(
        SessionFormatUnsupportedError, match=r'format v4 event type "developer/message"'
    ):
        await backend.open("bad", "read")
    source = _v4_log(tmp_path / "v4", rows)
    load = await (
        await JsonlSessionPersistence(str(tmp_path / "v4"), "none").open("bad", "read")
    ).read()
    assert source.exists()
    out = JsonlSessionPersistence(str(tmp_path / "out"), "none")
    handle = await out.create(load.header)
    handle.append(load.events)
    with pytest.raises(SessionWriteError, match="into a format v3 log"):
        await handle.flush()
    with pytest.raises(SessionWriteError):  # the handle stays failed: nothing was stored
        await handle.close()
    assert not await anyio.Path(out.locate(load.header).path).exists()


def _dsh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DSH_SESSION_ROOT", None)
    env.pop("DSH_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    if path.name.endswith(".zstd"):
        data = b"".join(decompress_frame(data[s:e]) for s, e in scan_frames(data).frames)
    return [json.loads(line) for line in data.splitlines()]


def _v4_shaped(rows: list[dict[str, Any]]) -> None:
    assert rows[0]["version"] == 4
    results = [r for r in rows if r["type"] == "tool/result"]
    assert results, "the run called tools"
    assert all(r["data"]["message"]["role"] == "tool" for r in results)
    assert '"kind":"plugin"' not in json.dumps(rows, separators=(",", ":"))


@pytest.mark.slow
def test_cli_resumes_repairs_and_continues_a_v4_session(tmp_path: Path) -> None:
    """``dsh resume`` repairs a v4 log (closers as v4 rows), runs a new turn with tools in it,
    ``dsh sessions verify`` finds it intact, and no v3 file ever appears."""
    root = tmp_path / "root-zstd"
    shutil.copytree(V4 / "root-zstd", root)
    work = tmp_path / "work"
    for sid in ("tool-missing-result", "clean"):
        resumed = _dsh(
            "resume", sid, "do it", "--model", "demo", "--root", str(root),
            "--workspace", str(work), "--create-workspace", cwd=tmp_path,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        verify = _dsh("sessions", "verify", sid, "--root", str(root), cwd=tmp_path)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "intact and balanced" in verify.stdout
        directory = root / "--home-dev-project--" / sid
        assert sorted(p.name for p in directory.iterdir()) == [
            "session.lock",
            "session.v4.jsonl.zstd",
        ]
        _v4_shaped(_rows(directory / "session.v4.jsonl.zstd"))
    listed = _dsh("sessions", "list", "--root", str(root), cwd=tmp_path)
    assert listed.returncode == 0 and "tool-missing-result" in listed.stdout


@pytest.mark.slow
def test_cli_run_in_a_v4_root_writes_v4(tmp_path: Path) -> None:
    """A composition whose JSONL row says ``format: v4`` stores a new session as v4."""
    shipped = (Path(__file__).resolve().parents[2] / "configs" / "default.yml").read_text()
    row = "  name: session-persistence-jsonl\n"
    assert row in shipped
    config = tmp_path / "v4.yml"
    config.write_text(shipped.replace(row, row + "  config:\n    format: v4\n", 1))
    root = tmp_path / "root"
    ran = _dsh(
        "run", "do it", "--config", str(config), "--model", "demo", "--root", str(root),
        "--workspace", str(tmp_path / "work"), "--create-workspace", cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (log_file,) = root.glob("*/*/session.v*.jsonl.zstd")
    assert log_file.name == "session.v4.jsonl.zstd"
    _v4_shaped(_rows(log_file))
    verify = _dsh("sessions", "verify", log_file.parent.name, "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


# --------------------------------------------------------------------------- v3 -> v4 migration

V3_SOURCES = sorted({want["fromV3"] for _, want in CASES})


def _plain_text(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".zstd"):
        return b"".join(decompress_frame(data[s:e]) for s, e in scan_frames(data).frames)
    return data


@pytest.mark.parametrize("source_rel", V3_SOURCES, ids=[s.split("/")[3] for s in V3_SOURCES])
async def test_every_v3_fixture_migrates_to_v4_or_is_refused(
    source_rel: str, tmp_path: Path
) -> None:
    """Each v3 fixture: published as a v4 sibling holding the script's v4 rows (the same
    plaintext as its dsh-v4 twin) that reads back as the v3 events, the source byte-identical;
    or, torn or damaged, refused with nothing published."""
    from dsh_host._persistence.persistence import SessionFormatUnsupportedError

    fixture_set, root, _project, sid, name = source_rel.split("/")
    compression = "zstd" if name.endswith(".zstd") else "none"
    shutil.copytree(FIXTURES / fixture_set / root, tmp_path / root)
    source = tmp_path / root / _project / sid / name
    before = source.read_bytes()
    backend = JsonlSessionPersistence(str(tmp_path / root), compression)  # type: ignore[arg-type]
    twin_rel = f"{root}/{_project}/{sid}/{name.replace('.v3.', '.v4.')}"
    twin = EXPECTED[twin_rel]
    if twin["tornTruncateTo"] is not None or twin["readerMustRefuse"]:
        with pytest.raises(SessionFormatUnsupportedError, match="torn tail"):
            await backend.migrate_to_v4(sid)
        assert sorted(p.name for p in source.parent.iterdir()) == ["session.lock", name]
        assert source.read_bytes() == before
        return
    ref = await (await backend.open(sid, "read")).read()
    published = Path(await backend.migrate_to_v4(sid))
    assert published == source.parent / name.replace(".v3.", ".v4.")
    assert source.read_bytes() == before, "the v3 source stays byte-identical"
    assert sorted(p.name for p in source.parent.iterdir()) == sorted(
        ["session.lock", name, published.name]
    ), "no migration temp is left behind"
    assert _plain_text(published) == _plain_text(V4 / twin_rel)
    got = await (await backend.open(sid, "read")).read()
    assert got.source_version == 4 and wire(got.events) == wire(ref.events)
    assert await backend.migrate_to_v4(sid) == str(published), "a v4 session stays as it is"


async def test_a_migrated_session_continues_in_v4(tmp_path: Path) -> None:
    root = tmp_path / "root-none"
    shutil.copytree(FIXTURES / "dsh-reference" / "root-none", root)
    backend = JsonlSessionPersistence(str(root), "none")
    source = root / "--home-dev-project--" / "raw-tool-missing-result" / "session.v3.jsonl"
    before = source.read_bytes()
    await backend.migrate_to_v4("raw-tool-missing-result")
    from dsh_host._session.repair import interrupted_turn_closers

    handle = await backend.open("raw-tool-missing-result", "write")
    load = await handle.read()
    handle.append(interrupted_turn_closers(load.events))
    await handle.close()
    want = EXPECTED["root-none/--home-dev-project--/raw-tool-missing-result/session.v4.jsonl"]
    v4_file = source.with_name("session.v4.jsonl")
    assert v4_file.read_text().splitlines()[-4:] == want["closersV4Lines"]
    assert source.read_bytes() == before


async def test_source_drift_refuses_the_v4_publication(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_session_persistence_jsonl import _migrate as migrate_module

    from dsh_host._persistence.persistence import SessionGenerationSourceChangedError

    root = tmp_path / "root-none"
    shutil.copytree(FIXTURES / "dsh-reference" / "root-none", root)
    source = root / "--home-dev-project--" / "raw-clean" / "session.v3.jsonl"
    real_verify = migrate_module._verify

    def verify_then_drift(*args: Any) -> None:
        real_verify(*args)
        with open(source, "ab") as log_file:  # a DSH 0.1.5 writer appended meanwhile
            log_file.write(
                b'{"type":"turn/start","seq":6,"time":1789200000007,"data":{"turn":2}}\n'
            )

    monkeypatch.setattr(migrate_module, "_verify", verify_then_drift)
    backend = JsonlSessionPersistence(str(root), "none")
    with pytest.raises(SessionGenerationSourceChangedError, match="changed while it was being"):
        await backend.migrate_to_v4("raw-clean")
    assert sorted(p.name for p in source.parent.iterdir()) == ["session.lock", source.name]
    monkeypatch.undo()
    await backend.migrate_to_v4("raw-clean")  # the lock was released; a retry publishes
    load = await (await backend.open("raw-clean", "read")).read()
    assert load.source_version == 4 and load.last_seq == 6


async def test_no_migration_while_a_writer_holds_the_session(tmp_path: Path) -> None:
    from dsh_host._persistence.persistence import SessionAlreadyOwnedError

    root = tmp_path / "root-none"
    shutil.copytree(FIXTURES / "dsh-reference" / "root-none", root)
    backend = JsonlSessionPersistence(str(root), "none")
    handle = await backend.open("raw-clean", "write")
    other = JsonlSessionPersistence(str(root), "none")
    with pytest.raises(SessionAlreadyOwnedError):
        await other.migrate_to_v4("raw-clean")
    await handle.close()
    assert not (root / "--home-dev-project--" / "raw-clean" / "session.v4.jsonl").exists()


def _v3_log(tmp_path: Path, sid: str, rows: list[dict[str, Any]], **head: Any) -> Path:
    directory = tmp_path / "--home-dev-project--" / sid
    directory.mkdir(parents=True)
    record = {
        "type": "session",
        "version": 3,
        "id": sid,
        "createdAt": 1789200000000,
        "cwd": "/home/dev/project",
        "isSeeded": False,
        "delegationDepth": 0,
        **head,
    }
    path = directory / "session.v3.jsonl"
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in [record, *rows]))
    return path


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("reopened-turn", "starts a turn while one is open"),
        ("ignorable", "is renamed by DSH's migration"),
        ("children", r"subagent children \(kid\)"),
    ],
)
async def test_what_dshs_migration_would_rewrite_is_refused(
    case: str, text: str, tmp_path: Path
) -> None:
    """DSH's edge does more than lift rows in these cases (turn closing, namespacing,
    catalog facts); rather than publish a v4 DSH would read differently, nothing is
    published and the v3 session stays as it is. The control: the same log without the
    case migrates."""
    from dsh_host._persistence.persistence import SessionFormatUnsupportedError

    rows = _v3_rows()
    if case == "reopened-turn":
        reopen = {"type": "turn/start", "seq": 2, "time": 1789200000003, "data": {"turn": 2}}
        rows = [*rows[:2], reopen]
    elif case == "ignorable":
        rows.append(
            {
                "type": "acme/note",
                "seq": len(rows),
                "time": 1789200000099,
                "data": {},
                "ignorable": True,
            }
        )
    else:
        _v3_log(tmp_path, "kid", [], parentSession="s", origin="subagent", delegationDepth=1)
    source = _v3_log(tmp_path, "s", rows)
    before = source.read_bytes()
    backend = JsonlSessionPersistence(str(tmp_path), "none")
    with pytest.raises(SessionFormatUnsupportedError, match=text) as refused:
        await backend.migrate_to_v4("s")
    assert "it stays v3" in str(refused.value)
    assert sorted(p.name for p in source.parent.iterdir()) == ["session.lock", source.name]
    assert source.read_bytes() == before
    control = tmp_path / "control"
    _v3_log(control, "s", _v3_rows())
    await JsonlSessionPersistence(str(control), "none").migrate_to_v4("s")


@pytest.mark.parametrize("write_version", [3, 4])
async def test_a_write_handle_reports_the_format_of_the_log_it_writes(
    write_version: int, tmp_path: Path
) -> None:
    """A write handle's read says what its log is: a v4 log continued in either root is 4,
    a v3 log is 3, a new session is the root's format before and after its first flush (a
    write handle used to report 3 for every log)."""
    for root in ("root-none",):
        shutil.copytree(V4 / root, tmp_path / "v4" / root)
        shutil.copytree(FIXTURES / "dsh-reference" / root, tmp_path / "v3" / root)
    v4 = JsonlSessionPersistence(
        str(tmp_path / "v4" / "root-none"), "none", write_version=write_version
    )
    v3 = JsonlSessionPersistence(
        str(tmp_path / "v3" / "root-none"), "none", write_version=write_version
    )
    for backend, want in ((v4, 4), (v3, 3)):
        handle = await backend.open("raw-clean", "write")
        assert (await handle.read()).source_version == want
        reader = await (await backend.open("raw-clean", "read")).read()
        assert reader.source_version == want
        await handle.close()
    fresh = await v4.create(header("fresh"))
    assert (await fresh.read()).source_version == write_version
    fresh.append(log(1))
    await fresh.flush()
    assert (await fresh.read()).source_version == write_version
    await fresh.close()
    assert (await (await v4.open("fresh", "read")).read()).source_version == write_version


@pytest.mark.slow
def test_cli_migrates_a_v3_session_to_v4_and_refuses_clearly(tmp_path: Path) -> None:
    """``dsh sessions migrate --to v4 ID`` publishes session.v4 beside the v3 log, which
    stays byte-identical (the backup); the session then reads and verifies as v4, and a
    second migration says so and writes nothing. A torn v3 log, an unknown id and a bad
    ``--to`` are refused in one line (no traceback) and write nothing."""
    root = tmp_path / "root-zstd"
    shutil.copytree(FIXTURES / "dsh-reference" / "root-zstd", root)
    directory = root / "--home-dev-project--" / "clean"
    source = directory / "session.v3.jsonl.zstd"
    before = source.read_bytes()
    ran = _dsh("sessions", "migrate", "--to", "v4", "clean", "--root", str(root),
               "--json", cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout)
    assert report["path"] == str(directory / "session.v4.jsonl.zstd")
    assert report["kept"] == str(source)
    assert source.read_bytes() == before
    assert sorted(p.name for p in directory.iterdir()) == [
        "session.lock",
        "session.v3.jsonl.zstd",
        "session.v4.jsonl.zstd",
    ]
    migrated = _rows(directory / "session.v4.jsonl.zstd")
    assert migrated[0]["version"] == 4 and len(migrated) == len(_rows(source))
    verify = _dsh("sessions", "verify", "clean", "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    again = _dsh("sessions", "migrate", "--to", "v4", "clean", "--root", str(root), cwd=tmp_path)
    assert again.returncode == 0 and "already format v4" in again.stdout, again.stderr
    refusals = {
        "torn-midframe": "torn",
        "no-such-session": "not found",
    }
    for sid, text in refusals.items():
        snapshot = sorted(str(p) for p in root.rglob("*"))
        again = _dsh("sessions", "migrate", "--to", "v4", sid, "--root", str(root), cwd=tmp_path)
        assert again.returncode != 0, sid
        assert text in again.stderr, again.stderr
        assert "Traceback" not in again.stderr
        assert sorted(str(p) for p in root.rglob("*")) == snapshot
    bad = _dsh("sessions", "migrate", "--to", "v5", "clean", "--root", str(root), cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


async def test_sessions_show_renders_the_v4_only_events(tmp_path: Path) -> None:
    """What ``dsh sessions show`` prints of a v4 log: the transcript shows the developer
    message's tool changes as the model reads them and the subagent catalog entry; the
    events view summarizes the catalog entry (its renderers, on the events as read)."""
    from dsh_host._cli.render import event_summary, transcript_lines

    _v4_log(tmp_path, _with_v4_events())
    backend = JsonlSessionPersistence(str(tmp_path), "none")
    load = await (await backend.open("bad", "read")).read()
    text = "\n".join(line for _, line in transcript_lines(load.events))
    assert "developer: [tool enabled: read]" in text and "[tool disabled: old]" in text
    assert "subagent child-1 (mode unknown)" in text
    catalog = next(e for e in load.events if e.type == "subagent/catalog")
    assert "subagent/catalog" in event_summary(catalog)
    assert "subagent child-1 (mode unknown)" in event_summary(catalog)


async def test_a_v4_session_with_developer_history_resumes_and_continues(tmp_path: Path) -> None:
    """The library end to end: a v4 session holding a developer message and a catalog entry is
    resumed by a front-door Agent, runs a turn (the developer node is on the surface it
    builds the request from), and stays one v4 file."""
    from dsh_host import Agent

    _v4_log(tmp_path / "raw", _with_v4_events())
    load = await (
        await JsonlSessionPersistence(str(tmp_path / "raw"), "none").open("bad", "read")
    ).read()
    store = JsonlSessionPersistence(str(tmp_path / "root"), "zstd", write_version=4)
    handle = await store.create(load.header)
    handle.append(load.events)
    await handle.close()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "continued"}]}))
    async with Agent(f"scripted:{script}", store=tmp_path / "root", approval="never") as agent:
        await agent.resume("bad")
        result = await agent.run("go on")
    assert result.completed and result.output == "continued"
    (log_file,) = (tmp_path / "root").rglob("session.v*.jsonl*")
    assert log_file.name == "session.v4.jsonl.zstd"
    again = await (await JsonlSessionPersistence(str(tmp_path / "root")).open("bad", "read")).read()
    assert wire(again.events[: len(load.events)]) == wire(load.events)
    assert again.events[-1].type == "turn/end" and again.source_version == 4
