"""The typed read (``read_artifact(..., typed=True)``, what the backend and ``agent.resume``
use): rows decoded straight into events must give what the plain read plus
``decode_stored_event`` gives, and every refusal must be the plain read's, word for word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl._codec import header_from_meta, header_json_bytes
from dsh_session_persistence_jsonl._frames import compress_frame
from dsh_session_persistence_jsonl._paths import Compression
from dsh_session_persistence_jsonl._reader import ArtifactRead, read_artifact

from dsh_host._jsonsafe import may_hold_unsafe_int
from dsh_host._persistence.persistence import (
    SessionPersistenceCorruptionError,
    decode_stored_event,
)
from dsh_host._session.events import (
    SessionEvent,
    decode_event,
    decode_event_line,
    encode_event,
    event_to_builtins,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-reference"

_RESULT = {
    "turn": 1,
    "step": 1,
    "message": {
        "id": "m2",
        "role": "user",
        "content": [{"type": "tool-result", "toolCallId": "c1", "content": []}],
        "source": {"kind": "tool", "callId": "c1"},
    },
}


def _line(kind: str, seq: int, data: Any, **extra: Any) -> bytes:
    """A row exactly as this build writes it."""
    return encode_event(
        decode_event({"type": kind, "seq": seq, "time": seq, "data": data, **extra})
    )


def _turn(first: int = 0) -> list[bytes]:
    return [
        _line("turn/start", first, {"turn": 1}),
        _line("step/start", first + 1, {"turn": 1, "step": 1}),
        _line("step/end", first + 2, {"turn": 1, "step": 1}),
        _line("turn/end", first + 3, {"turn": 1, "reason": {"kind": "completed"}}),
    ]


def _write(tmp_path: Path, lines: list[bytes], compression: Compression, tail: bytes = b"") -> str:
    head = header_json_bytes(header_from_meta({"id": "s", "createdAt": 0}))
    if compression == "zstd":
        path = tmp_path / "session.v3.jsonl.zstd"
        frames = [compress_frame(head)] + [compress_frame(line + b"\n") for line in lines]
        path.write_bytes(b"".join(frames) + tail)
    else:
        path = tmp_path / "session.v3.jsonl"
        path.write_bytes(head + b"".join(line + b"\n" for line in lines) + tail)
    return str(path)


def _events(read: ArtifactRead) -> list[SessionEvent]:
    plain = read.plain or [False] * len(read.events)
    return [
        row
        if isinstance(row, SessionEvent)
        else decode_stored_event(
            row, session_id="s", seq=row["seq"], where=read.path, parsed_plain=p
        )
        for row, p in zip(read.events, plain, strict=True)
    ]


def _outcome(path: str, compression: Compression, typed: bool) -> Any:
    """What a read gives: its events (typed), torn tail and recovered records, or its refusal."""
    try:
        read = read_artifact(path, compression, 3, typed=typed)
    except SessionPersistenceCorruptionError as error:
        return ("refused", type(error), str(error), error.offset)
    return ("read", _events(read), read.torn, read.recovered, read.complete_end)


def _same_both_ways(path: str, compression: Compression) -> Any:
    plain = _outcome(path, compression, typed=False)
    typed = _outcome(path, compression, typed=True)
    assert typed == plain
    return typed


@pytest.mark.parametrize(
    "name", sorted(p.parent.name for p in FIXTURES.glob("root-*/*/*/session.v3*"))
)
def test_reference_fixtures_read_the_same_typed(name: str) -> None:
    (path,) = FIXTURES.glob(f"root-*/*/{name}/session.v3*")
    compression: Compression = "zstd" if path.name.endswith(".zstd") else "none"
    _same_both_ways(str(path), compression)
    try:
        read = read_artifact(str(path), compression, 3, typed=True)
    except SessionPersistenceCorruptionError:
        return
    if read.torn is None:  # every row DSH wrote decodes in one pass
        assert all(isinstance(row, SessionEvent) for row in read.events)
    assert all(isinstance(row, dict) for row in read.recovered)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_clean_log_reads_as_typed_events(tmp_path: Path, compression: Compression) -> None:
    path = _write(tmp_path, _turn(), compression)
    read = read_artifact(path, compression, 3, typed=True)
    assert all(isinstance(row, SessionEvent) for row in read.events)
    assert read.plain == [True] * 4
    _same_both_ways(path, compression)


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize(
    ("why", "sources"),
    [("not earlier", [2]), ("later", [7]), ("duplicated", [0, 0]), ("fine", [0, 1])],
)
def test_source_seqs_follow_the_storage_rule(
    tmp_path: Path, compression: Compression, why: str, sources: list[int]
) -> None:
    lines = [
        _line("turn/start", 0, {"turn": 1}),
        _line("tool/call", 1, {"turn": 1, "step": 1, "callId": "c1", "name": "n", "arguments": ""}),
        _line("tool/result", 2, _RESULT, sourceEventSeqs=sources, surfaceOp="append"),
        *_turn(2)[1:],
    ]
    outcome = _same_both_ways(_write(tmp_path, lines, compression), compression)
    if why == "fine":
        assert outcome[0] == "read" and outcome[1][2].source_event_seqs == (0, 1)
    elif compression == "zstd":
        assert outcome[0] == "refused" and "sourceEventSeqs ranges" in outcome[2]


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_seq_gap_is_the_plain_reads_verdict(tmp_path: Path, compression: Compression) -> None:
    closed = _write(tmp_path, [*_turn()[:2], *_turn(3)[1:]], compression)  # 0, 1, 4, 5, 6
    outcome = _same_both_ways(closed, compression)
    assert outcome[0] == "refused" and "seq gap in committed region" in outcome[2]
    open_turn = _write(
        tmp_path, [*_turn()[:2], _line("step/start", 3, {"turn": 1, "step": 2})], compression
    )
    outcome = _same_both_ways(open_turn, compression)
    if compression == "none":  # a gap in the damaged-tail region is dropped, no turn closed
        assert outcome[0] == "read" and len(outcome[1]) == 2


def test_damage_before_typed_rows_is_the_plain_reads_verdict(tmp_path: Path) -> None:
    turn = _turn()
    tolerated = _write(tmp_path, [turn[0], b"garbage", turn[2]], "none")
    assert len(_same_both_ways(tolerated, "none")[1]) == 1
    refused = _write(tmp_path, [turn[0], b"garbage", turn[3]], "none")
    assert "unparsable committed event" in _same_both_ways(refused, "none")[2]


def test_rows_the_one_pass_decode_leaves_stay_plain_records(tmp_path: Path) -> None:
    """A row with a 16-digit run, another writer's key order, an unknown ignorable type:
    the one-pass decode leaves them (``plain`` marks which rows came straight from the
    parser), and the general path types them as the load did (a zstd read hands every row
    over typed, in a ``PackedLog``: docs/decisions.md D37)."""
    lines = [
        _line("turn/start", 0, {"turn": 1}),
        _line("session/title", 1, {"title": "1234567890123456"}),
        b'{"seq":2,"type":"step/start","time":2,"data":{"turn":1,"step":1}}',
        _line("x-newer/thing", 3, {"a": 1}, ignorable=True),
    ]
    path = _write(tmp_path, lines, "zstd")
    read = read_artifact(path, "zstd", 3, typed=True)
    left = [may_hold_unsafe_int(line) or decode_event_line(line) is None for line in lines]
    assert left == [False, True, True, True]
    assert [type(row) for row in read.events] == [SessionEvent] * 4
    assert read.plain == [True, False, True, True]
    _same_both_ways(path, "zstd")


def test_a_torn_tails_recovered_rows_stay_plain_records(tmp_path: Path) -> None:
    turn = _turn()
    torn = compress_frame(turn[2] + b"\n" + turn[3] + b"\n")
    path = _write(tmp_path, turn[:2], "zstd", tail=torn[: len(torn) - 3])
    outcome = _same_both_ways(path, "zstd")
    assert outcome[0] == "read" and outcome[2] is not None
    read = read_artifact(path, "zstd", 3, typed=True)
    assert [type(row) for row in read.events] == [SessionEvent] * 4  # typed, in pages (D37)
    assert all(isinstance(row, dict) for row in read.recovered)
    typed = [row for row in read.events[2:] if isinstance(row, SessionEvent)]
    assert read.recovered == [event_to_builtins(event) for event in typed]
