"""DSH v3's structural row admission runs before the torn-tail rule (issue 16 items 2 and 3).

A row DSH refuses — a ``request/header`` or ``system/message`` without ``data``,
a ``system/message`` DSH would not have written, a required ``tool/code-dispatch*``
— refuses the whole file wherever it sits: mid-file, as the last row, before or
after a ``turn/end``, in raw and in zstd mode (in the torn frame too). It is never
read as a droppable tail, so no write handle ever truncates committed events
because of it. And append refuses what DSH refuses, so this harness never writes
a log DSH cannot open.

The property test at the end damages logs at random and checks the rule itself:
no read ever proposes truncating a row that structural admission would refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._codec import StructuralRefusal, admit_v3_row
from dsh_session_persistence_jsonl._frames import compress_frame, decompress_partial
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
)
from dsh_host._session import Session
from dsh_host._session.errors import InvalidSessionEventError, UnknownEventTypeError
from dsh_host._session.events import event_to_builtins

from .helpers import ev, header, log, plain

pytestmark = pytest.mark.anyio

SID = "admission"
REFUSED = (SessionPersistenceCorruptionError, SessionFormatUnsupportedError)


def _system(seq: int, **changes: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": f"sys-{seq}",
        "role": "system",
        "source": {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"},
        "content": [{"type": "text", "text": "You are helpful."}],
    }
    data: dict[str, Any] = {"turn": 1, "step": 1, "message": message}
    if "source" in changes:
        message["source"] = changes.pop("source")
    data.update(changes)
    return ev("system/message", seq, data, surfaceOp="append")


#: Rows DSH refuses whole, built for a given seq (each keeps the envelope valid or not as DSH
#: meets it in the wild: the issue's reproductions are the first two).
BAD_ROWS: dict[str, Any] = {
    "request/header without data": lambda seq: {"type": "request/header", "seq": seq, "time": 7},
    "system/message without data": lambda seq: {
        "type": "system/message",
        "seq": seq,
        "time": 7,
        "surfaceOp": "append",
    },
    "request/header with a non-object header": lambda seq: ev(
        "request/header", seq, {"header": "x", "reason": "initial"}
    ),
    "request/header with header.system": lambda seq: ev(
        "request/header",
        seq,
        {"header": {"config": {"provider": "p", "model": "m"}, "system": "s"}, "reason": "initial"},
    ),
    "system/message with a user source": lambda seq: _system(seq, source={"kind": "user"}),
    "system/message with an extra data key": lambda seq: _system(seq, extra=1),
    "required tool/code-dispatch": lambda seq: ev(
        "tool/code-dispatch",
        seq,
        {"rootCallId": "a", "parentCallId": "a", "subCallId": "b", "name": "n"},
    ),
    "required tool/code-dispatch-start": lambda seq: ev(
        "tool/code-dispatch-start",
        seq,
        {"rootCallId": "a", "parentCallId": "a", "subCallId": "b", "name": "n"},
    ),
}

EVENTS = log(2, tools=1)  # two closed turns: turn/end at seq 7 and 15


def _line(row: Any) -> bytes:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _header_line() -> bytes:
    return _line({"type": "session", "version": 3, **_header_fields()})


def _header_fields() -> dict[str, Any]:
    return {
        "id": SID,
        "createdAt": 1789200000000,
        "cwd": "/home/dev/project",
        "isSeeded": False,
        "delegationDepth": 0,
    }


def _path(root: Path, compression: str) -> Path:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    path = Path(backend.locate(header(SID)).path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _put(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _get(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


async def _open(root: Path, compression: str, mode: str = "read") -> Any:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    if mode == "read":
        return await backend.open(SID, "read")
    return await backend.open(SID, "write")


POSITIONS = {
    "mid-file, before a turn/end": 5,
    "right before a turn/end": 6,
    "mid-file, after a turn/end": 9,
    "the last row": len(EVENTS) - 1,
    "right after the last turn/end": len(EVENTS),
}


@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
@pytest.mark.parametrize("position", sorted(POSITIONS))
async def test_raw_refuses_a_structurally_refused_row_at_every_position(
    tmp_path: Path, bad: str, position: str
) -> None:
    at = POSITIONS[position]
    rows = [*EVENTS, ev("turn/start", len(EVENTS), {"turn": 3})]
    rows[at] = BAD_ROWS[bad](at)
    path = _path(tmp_path, "none")
    data = _header_line() + b"".join(_line(r) for r in rows)
    _put(path, data)
    with pytest.raises(REFUSED) as refused:
        await (await _open(tmp_path, "none")).read()
    assert "Traceback" not in str(refused.value)
    with pytest.raises(REFUSED):  # a write open refuses too, and so never truncates
        await _open(tmp_path, "none", "write")
    assert _get(path) == data


@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
@pytest.mark.parametrize("torn", [False, True])
async def test_zstd_refuses_a_structurally_refused_row_in_a_complete_or_torn_frame(
    tmp_path: Path, bad: str, torn: bool
) -> None:
    rows = [dict(r) for r in EVENTS[:12]]
    rows[10] = BAD_ROWS[bad](10)
    frames = [
        compress_frame(_header_line()),
        compress_frame(b"".join(_line(r) for r in rows[:9])),
        compress_frame(b"".join(_line(r) for r in rows[9:])),
    ]
    data = b"".join(frames)
    if torn:
        data = data[:-4]  # the last frame's checksum is missing: a torn frame
    path = _path(tmp_path, "zstd")
    _put(path, data)
    with pytest.raises(REFUSED):
        await (await _open(tmp_path, "zstd")).read()
    assert _get(path) == data


async def test_an_ordinary_damaged_last_row_is_still_a_torn_tail(tmp_path: Path) -> None:
    """The control: a last row DSH *would* drop (a bad envelope on an ordinary type) stays a
    recoverable tail, so the refusals above are about the row kinds, not about any bad row."""
    rows = [*EVENTS[:-1], {"type": "step/end", "seq": len(EVENTS) - 1, "time": 7}]
    path = _path(tmp_path, "none")
    good = _header_line() + b"".join(_line(r) for r in rows[:-1])
    _put(path, good + _line(rows[-1]))
    load = await (await _open(tmp_path, "none")).read()
    assert [plain(event_to_builtins(e)) for e in load.events] == plain(rows[:-1])
    assert load.torn_tail is not None and load.torn_tail.truncate_to == len(good)


def test_an_ignorable_code_dispatch_is_admitted() -> None:
    row = BAD_ROWS["required tool/code-dispatch"](3)
    admit_v3_row({**row, "ignorable": True})
    with pytest.raises(StructuralRefusal):
        admit_v3_row(row)


# --------------------------------------------------------------------------- append side


def test_append_refuses_what_dsh_refuses() -> None:
    session = Session.create("s")
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    good = _system(0)["data"]
    session.append("system/message", good, surface_op="append")
    with pytest.raises(InvalidSessionEventError, match="plugin source"):
        session.append(
            "system/message", _system(0, source={"kind": "user"})["data"], surface_op="append"
        )
    for kind in ("tool/code-dispatch", "tool/code-dispatch-start", "assistant/chunk"):
        with pytest.raises(UnknownEventTypeError):
            session.append(kind, {"x": 1})
    # DSH keeps an ignorable unknown event, so this harness may write one.
    session.append("tool/code-dispatch", {"x": 1}, ignorable=True)


# --------------------------------------------------------------------------- property


def _refused(row: object) -> bool:
    try:
        admit_v3_row(row)
    except StructuralRefusal:
        return True
    return False


def _proposed_dropped_rows(data: bytes, compression: str, truncate_to: int) -> list[object]:
    """The parsable rows in the bytes a write handle would cut."""
    if compression == "zstd":
        tail = decompress_partial(data[truncate_to:])
    else:
        tail = data[truncate_to:]
    rows: list[object] = []
    for line in tail.split(b"\n"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


_ROW_KINDS = st.sampled_from(["good", *sorted(BAD_ROWS)])
_DAMAGE = st.sampled_from(["cut", "flip", "zeros", "none"])


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    compression=st.sampled_from(["none", "zstd"]),
    kinds=st.lists(_ROW_KINDS, min_size=len(EVENTS), max_size=len(EVENTS)),
    bad_weight=st.integers(min_value=0, max_value=3),
    split=st.integers(min_value=1, max_value=len(EVENTS) - 1),
    damage=_DAMAGE,
    where=st.floats(min_value=0.0, max_value=1.0),
    mask=st.integers(min_value=1, max_value=255),
)
async def test_no_read_proposes_truncating_a_row_admission_refuses(
    tmp_path_factory: pytest.TempPathFactory,
    compression: str,
    kinds: list[str],
    bad_weight: int,
    split: int,
    damage: str,
    where: float,
    mask: int,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    rows: list[Any] = [dict(r) for r in EVENTS]
    bad_seen = 0
    for seq, kind in enumerate(kinds):
        if kind != "good" and bad_seen < bad_weight and seq >= split - 1:
            rows[seq] = BAD_ROWS[kind](seq)
            bad_seen += 1
    body_a = b"".join(_line(r) for r in rows[:split])
    body_b = b"".join(_line(r) for r in rows[split:])
    if compression == "zstd":
        data = compress_frame(_header_line()) + compress_frame(body_a) + compress_frame(body_b)
    else:
        data = _header_line() + body_a + body_b
    start = len(data) // 3
    offset = start + int(where * (len(data) - start - 1))
    if damage == "cut":
        data = data[:offset]
    elif damage == "flip":
        data = data[:offset] + bytes([data[offset] ^ mask]) + data[offset + 1 :]
    elif damage == "zeros":
        data = data[:offset] + b"\x00" * (len(data) - offset)
    path = _path(root, compression)
    _put(path, data)
    try:
        load = await (await _open(root, compression)).read()
    except REFUSED:
        return  # refusing is always allowed
    torn = load.torn_tail
    if torn is None:
        return
    dropped = _proposed_dropped_rows(data, compression, torn.truncate_to)
    kept_seqs = {e.seq for e in load.events}
    for row in dropped:
        if isinstance(row, dict) and row.get("seq") in kept_seqs and compression == "zstd":
            continue  # recovered from the torn frame and rewritten, not lost
        assert not _refused(row), (compression, damage, offset, row)


def test_a_replace_marker_is_written_in_dshs_v3_spelling() -> None:
    """DSH v3 refuses a replace spelled other than ``{op, startSeq, endSeq}``; the older
    ``{op, start, end}`` spelling is still read."""
    from dsh_host._session.events import ReplaceOp, encode_event

    session = Session.create("s")
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    first = session.append("system/message", _system(0)["data"], surface_op="append")
    replaced = session.append(
        "system/message",
        _system(0)["data"],
        surface_op=ReplaceOp(start=first.seq, end=first.seq),
        source_event_seqs=[first.seq],
    )
    assert json.loads(encode_event(replaced))["surfaceOp"] == {
        "op": "replace",
        "startSeq": first.seq,
        "endSeq": first.seq,
    }
