"""Byte-level vectors of the v3 format (docs/format.md §3) and the scanners' rules."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard
from dsh_session_persistence_jsonl import _json
from dsh_session_persistence_jsonl._codec import (
    RowError,
    decode_header_record,
    decode_v0_row,
    encode_header_record,
    expand_stream,
    header_from_meta,
    header_json_bytes,
    pack_source_seqs,
    pack_stream,
    unpack_source_seqs,
)
from dsh_session_persistence_jsonl._frames import (
    FrameCorruption,
    compress_frame,
    decompress_frame,
    scan_frames,
)
from dsh_session_persistence_jsonl._paths import (
    decode_segment,
    encode_segment,
    generation_filename,
    parse_generation_filename,
    project_key,
)
from dsh_session_persistence_jsonl._reader import ArtifactRead, read_artifact
from hypothesis import given
from hypothesis import strategies as st

from dsh_host._persistence.persistence import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
)

from .v0_rows import pack_chunk_rows

# --------------------------------------------------------------------------- header line


@pytest.mark.parametrize(
    ("meta", "line"),
    [
        (
            {"id": "round-trip", "createdAt": 1000, "cwd": "/home/dev/project", "isSeeded": False},
            '{"type":"session","version":3,"id":"round-trip","createdAt":1000,'
            '"cwd":"/home/dev/project","isSeeded":false,"delegationDepth":0}',
        ),
        (
            {"id": "s1", "createdAt": 0, "isSeeded": False},
            '{"type":"session","version":3,"id":"s1","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0}',
        ),
        (
            {
                "agentPreset": "ptc",
                "delegationDepth": 1,
                "origin": "subagent",
                "isSeeded": True,
                "parentSession": "parent-1",
                "cwd": "/home/u/proj",
                "createdAt": 1789200000000,
                "id": "child-1",
            },
            '{"type":"session","version":3,"id":"child-1","createdAt":1789200000000,'
            '"cwd":"/home/u/proj","parentSession":"parent-1","isSeeded":true,'
            '"origin":"subagent","delegationDepth":1,"agentPreset":"ptc"}',
        ),
    ],
)
def test_header_line_bytes(meta: dict[str, Any], line: str) -> None:
    assert header_json_bytes(header_from_meta(meta)) == line.encode() + b"\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            '{"type":"session","version":3,"id":"x","createdAt":1.5,"isSeeded":false,'
            '"delegationDepth":0}',
            "createdAt",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":-1,"isSeeded":false,'
            '"delegationDepth":0}',
            "createdAt",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":9007199254740992,'
            '"isSeeded":false,"delegationDepth":0}',
            "createdAt",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false}',
            "delegationDepth",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":"1"}',
            "delegationDepth",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0.5}',
            "delegationDepth",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":-0}',
            "delegationDepth",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0,"agentPreset":7}',
            "agentPreset",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0,"extra":1}',
            "unexpected key extra",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0,"sandboxMode":"x"}',
            "retired policy baseline fields",
        ),
        (
            '{"type":"session","version":3,"id":"x","createdAt":0,"isSeeded":false,'
            '"delegationDepth":0,"approvalPolicy":"x"}',
            "retired policy baseline fields",
        ),
        ("[1,2]", "first line is not a JSON object"),
        ("{not json", "header line is not valid JSON"),
    ],
)
def test_header_line_refusals(text: str, match: str) -> None:
    with pytest.raises(SessionPersistenceCorruptionError, match=match):
        decode_header_record(text.encode() + b"\n", "/x/session.v3.jsonl")


def test_future_header_version_is_unsupported_not_corrupt() -> None:
    # A future header need not satisfy today's shape: the version gate runs first.
    with pytest.raises(SessionFormatUnsupportedError, match="upgrade the harness") as refused:
        decode_header_record(b'{"version":9,"id":"s","whatever":true}\n', "/r/s.v9.jsonl")
    assert "(raw log: /r/s.v9.jsonl)" in str(refused.value)
    assert refused.value.location == "/r/s.v9.jsonl"


def test_header_version_must_match_the_file_name() -> None:
    line = header_json_bytes(header_from_meta({"id": "x", "createdAt": 0}))
    with pytest.raises(SessionPersistenceCorruptionError, match="does not match the generation"):
        decode_header_record(line.replace(b'"version":3', b'"version":2'), "/p", 3)


def test_header_key_order_is_dsh_order_whatever_the_input_order() -> None:
    record = encode_header_record(
        header_from_meta({"agentPreset": "a", "id": "x", "createdAt": 5, "cwd": "/c"})
    )
    assert list(record) == [
        "type",
        "version",
        "id",
        "createdAt",
        "cwd",
        "isSeeded",
        "delegationDepth",
        "agentPreset",
    ]


# --------------------------------------------------------------------------- sourceEventSeqs


@pytest.mark.parametrize(
    ("plain", "packed"),
    [
        ([4], [4]),
        ([1, 2], [1, 2]),
        ([1, 2, 3], [[1, 3]]),
        ([1, 2, 3, 5, 6], [[1, 3], 5, 6]),
        ([0, 1, 2, 3, 7, 8, 9, 11], [[0, 3], [7, 9], 11]),
        ([3, 1], [3, 1]),
        ([2, 2], [2, 2]),
        ([], []),
    ],
)
def test_source_seq_packing_vectors(plain: list[int], packed: list[Any]) -> None:
    assert pack_source_seqs(plain) == packed
    if len(set(plain)) == len(plain):  # duplicates never reach storage (the surface refuses)
        assert unpack_source_seqs(packed, 100) == plain


@pytest.mark.parametrize(
    ("stored", "seq", "match"),
    [
        ([[1, 3]], 3, "exceeds its event seq"),
        ([[3, 1]], 9, "exceeds its event seq"),
        ([[1, 2, 3]], 9, r"\[start, end\] pair"),
        ([5], 5, "unique earlier seqs"),
        ([1, [1, 3]], 9, "unique earlier seqs"),
        ([5, [1, 3]], 9, "strictly increasing"),
        ("x", 9, "must be an array"),
        ([-1], 9, "non-negative safe integer"),
    ],
)
def test_source_seq_unpacking_refusals(stored: Any, seq: int, match: str) -> None:
    with pytest.raises(RowError, match=match):
        unpack_source_seqs(stored, seq)


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=30))
def test_source_seq_packing_round_trips(values: list[int]) -> None:
    packed = pack_source_seqs(values)
    if len(set(values)) == len(values):
        assert unpack_source_seqs(packed, 61) == values
    else:
        with pytest.raises(RowError, match="unique earlier seqs"):
            unpack_source_seqs(packed, 61)


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("raw", "segment"),
    [
        ("..", "~002E~002E"),
        (".", "~002E"),
        ("a/b", "a~002Fb"),
        ("/etc/passwd", "~002Fetc~002Fpasswd"),
        ("a\0b", "a~0000b"),
        ("a~b", "a~007Eb"),
        ("../../etc/pwn", "..~002F..~002Fetc~002Fpwn"),
        ("clean-id_1.x", "clean-id_1.x"),
        ("é", "~00E9"),
        ("😀", "~D83D~DE00"),
        ("\ud800", "~D800"),
    ],
)
def test_encode_segment_vectors(raw: str, segment: str) -> None:
    assert encode_segment(raw) == segment
    assert decode_segment(segment) == raw


def test_encode_segment_rejects_empty() -> None:
    with pytest.raises(ValueError, match="cannot encode an empty path segment"):
        encode_segment("")


@given(st.text(min_size=1), st.text(min_size=1))
def test_encode_segment_is_injective_and_traversal_free(a: str, b: str) -> None:
    ea, eb = encode_segment(a), encode_segment(b)
    assert (ea == eb) == (a == b)
    assert "/" not in ea and "\0" not in ea and ea not in (".", "..")
    assert decode_segment(ea) == a


@pytest.mark.parametrize(
    ("cwd", "key"),
    [
        ("/home/dev/project", "--home-dev-project--"),
        ("/", "--root--"),
        ("C:\\Users\\me", "--C-Users-me--"),
        ("//a::b\\\\c", "--a-b-c--"),
        ("/a b/~x", "--a~0020b-~007Ex--"),
        ("/" + "x" * 300, "--" + "x" * 251 + "--"),
    ],
)
def test_project_key_vectors(cwd: str, key: str) -> None:
    assert project_key(cwd) == key


def test_project_key_rejects_empty() -> None:
    with pytest.raises(ValueError, match="cannot encode an empty project path"):
        project_key("")


def test_generation_names() -> None:
    assert generation_filename(0, "none") == "session.jsonl"
    assert generation_filename(1, "none") == "session.v1.jsonl"
    assert generation_filename(27, "zstd") == "session.v27.jsonl.zstd"
    assert parse_generation_filename("session.v3.jsonl.zstd", "zstd") == 3
    assert parse_generation_filename("session.jsonl.zstd", "zstd") == 0
    assert parse_generation_filename("session.v3.jsonl", "none") == 3
    assert parse_generation_filename("session.v3.jsonl.zstd", "none") is None
    for name in (
        "session.v0.jsonl",
        "session.v01.jsonl",
        "session.V1.jsonl",
        "session.v1.backup.jsonl",
        "session.migration.deadbeef.tmp.jsonl",
        "session.v9007199254740992.jsonl",
        "session.lock",
        "session.v3.jsonl.zstd.1a2b3c4d5e6f.tmp",
    ):
        assert parse_generation_filename(name, "none") is None, name


# --------------------------------------------------------------------------- frames


CLEAN_HEADER = (
    b'{"type":"session","version":3,"id":"clean","createdAt":1789200000000,'
    b'"cwd":"/home/dev/project","isSeeded":false,"delegationDepth":0}\n'
)
CLEAN_HEADER_FRAME = bytes.fromhex(
    "28b52ffd24856d03001287171b804b7348d78ad442d844b4fe98e875e8049b60081bbd318d29580f804882"
    "56b61db130b568f1f5f45d1752a0f3f92754f9bce90cc6b4d33ccf1b4c398ee44b0486022180de437ed199"
    "84be92d1a97c0364def8bc30a57a35faedb1860404004b0512970b4ffbda96268158a992"
)


def test_header_frame_layout() -> None:
    frame = compress_frame(CLEAN_HEADER)
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    assert frame[4] == 0x24  # single segment + content checksum
    assert frame[5] == len(CLEAN_HEADER) == 133
    assert decompress_frame(frame) == CLEAN_HEADER
    assert decompress_frame(CLEAN_HEADER_FRAME) == CLEAN_HEADER
    if zstandard.ZSTD_VERSION == (1, 5, 7):
        assert frame == CLEAN_HEADER_FRAME


def test_one_shot_frame_of_300_bytes_uses_a_two_byte_size() -> None:
    frame = compress_frame(os.urandom(150).hex().encode())
    assert frame[4] == 0x64
    assert int.from_bytes(frame[5:7], "little") + 256 == 300


def test_streamed_frames_are_accepted() -> None:
    """Migration-written frames carry no content size (FHD 0x04); readers take them too."""
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=False)
    chunker = cctx.chunker(chunk_size=64)
    body = b"".join(chunker.compress(b"x" * 100_000 + os.urandom(5000)))
    body += b"".join(chunker.finish())  # type: ignore[no-untyped-call]  # zstandard's stub
    assert body[4] & 0xC4 == 0x04
    scan = scan_frames(body + compress_frame(b"tail\n"))
    assert len(scan.frames) == 2 and scan.torn_start is None
    assert len(decompress_frame(body[: scan.frames[0][1]])) == 105_000


def _frame(blocks: list[bytes], fhd: int = 0x20, extra_header: bytes = b"\x05") -> bytes:
    return b"\x28\xb5\x2f\xfd" + bytes([fhd]) + extra_header + b"".join(blocks)


def _block(kind: int, size: int, last: bool, payload: bytes) -> bytes:
    header = (size << 3) | (kind << 1) | int(last)
    return header.to_bytes(3, "little") + payload


def test_scanner_structures() -> None:
    raw_last = _block(0, 5, True, b"hello")
    assert scan_frames(_frame([raw_last])).frames == ((0, 14),)
    rle = _block(1, 9, True, b"z")  # RLE: one payload byte
    assert scan_frames(_frame([rle])).frames == ((0, 10),)
    multi = _frame([_block(0, 2, False, b"ab"), _block(0, 3, True, b"cde")])
    assert scan_frames(multi).frames == ((0, len(multi)),)
    with_checksum = _frame([raw_last], fhd=0x24) + b"\x00\x01\x02\x03"
    assert scan_frames(with_checksum).frames == ((0, len(with_checksum)),)
    # window descriptor present when not single-segment, 4-byte dictionary id, 8-byte size
    full = b"\x28\xb5\x2f\xfd" + bytes([0xC3]) + b"\x00" + b"\x01" * 4 + b"\x02" * 8 + raw_last
    assert scan_frames(full).frames == ((0, len(full)),)


@pytest.mark.parametrize("cut", range(1, 14))
def test_scanner_reports_every_short_frame_as_torn(cut: int) -> None:
    head = compress_frame(b"h\n")
    frame = _frame([_block(0, 5, True, b"hello")], fhd=0x24) + b"\x00\x01\x02\x03"
    scan = scan_frames(head + frame[:cut])
    assert scan.frames == ((0, len(head)),) and scan.torn_start == len(head)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x00\x00\x00\x00\x20\x05", "invalid frame magic at byte 0"),
        (b"\x28\xb5\x2f\xfd\x28\x05", "reserved frame-header bit at byte 4"),
        (b"\x28\xb5\x2f\xfd\x30\x05", "reserved frame-header bit at byte 4"),
        (_frame([_block(3, 1, True, b"x")]), "reserved block type at byte 6"),
    ],
)
def test_scanner_refusals(data: bytes, match: str) -> None:
    with pytest.raises(FrameCorruption, match=match):
        scan_frames(data)


def test_skippable_frames_are_not_part_of_the_format() -> None:
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"abcd"
    with pytest.raises(FrameCorruption, match="invalid frame magic"):
        scan_frames(compress_frame(b"h\n") + skippable)


# --------------------------------------------------------------------------- line scanner (raw)


def _raw(tmp_path: Path, *lines: bytes, tail: bytes = b"") -> str:
    path = tmp_path / "session.v3.jsonl"
    head = header_json_bytes(header_from_meta({"id": "s", "createdAt": 0}))
    path.write_bytes(head + b"".join(line + b"\n" for line in lines) + tail)
    return str(path)


def _line(kind: str, seq: int, data: Any = None) -> bytes:
    return _json.dumps_bytes({"type": kind, "seq": seq, "time": seq, "data": data or {}})


def test_raw_header_only(tmp_path: Path) -> None:
    path = _raw(tmp_path)
    read = read_artifact(path, "none", 3)
    assert read.events == [] and read.torn is None
    assert read.complete_end == os.path.getsize(path)


def rows(read: ArtifactRead) -> list[dict[str, Any]]:
    """The rows of an untyped read, which are plain records."""
    out: list[dict[str, Any]] = []
    for row in read.events:
        assert isinstance(row, dict), row
        out.append(row)
    return out


def test_raw_torn_fragment_is_ignored(tmp_path: Path) -> None:
    path = _raw(tmp_path, _line("a/x", 0), tail=b'{"type":"assistant/chunk","seq":1,"ti')
    read = read_artifact(path, "none", 3)
    assert [e["seq"] for e in rows(read)] == [0]
    assert read.torn is not None and read.torn.truncate_to == os.path.getsize(path) - 37


def test_raw_damaged_suffix_is_tolerated_until_a_later_turn_end(tmp_path: Path) -> None:
    tolerated = _raw(tmp_path, _line("a/x", 0), b"garbage", _line("a/x", 2))
    read = read_artifact(tolerated, "none", 3)
    assert [e["seq"] for e in rows(read)] == [0]
    refused = _raw(tmp_path, _line("a/x", 0), b"garbage", _line("turn/end", 2))
    with pytest.raises(SessionPersistenceCorruptionError, match="unparsable committed event"):
        read_artifact(refused, "none", 3)


def test_raw_seq_gap_before_a_turn_end_is_refused_after_it_tolerated(tmp_path: Path) -> None:
    with pytest.raises(SessionPersistenceCorruptionError, match=r"seq gap .*expected 1, got 2"):
        read_artifact(_raw(tmp_path, _line("a/x", 0), _line("turn/end", 2)), "none", 3)
    read = read_artifact(
        _raw(tmp_path, _line("turn/end", 0), _line("a/x", 2), _line("a/x", 3)), "none", 3
    )
    assert [e["seq"] for e in rows(read)] == [0]


def test_raw_row_with_gap_in_tail_is_dropped_whole(tmp_path: Path) -> None:
    read = read_artifact(
        _raw(tmp_path, _line("a/x", 0), _line("a/x", 1), _line("a/x", 3), _line("a/x", 4)),
        "none",
        3,
    )
    assert [e["seq"] for e in rows(read)] == [0, 1]
    assert read.torn is not None


def test_rows_with_long_digit_runs_are_not_vouched_for(tmp_path: Path) -> None:
    """The reader marks a row ``plain`` (its data needs no lossless-JSON walk) only when
    no run of 16 digits appears in it; decoding with the mark gives what the full walk
    gives, and an unsafe integer is still refused with the walk's error."""
    import copy

    from dsh_host._persistence.persistence import decode_stored_event

    def ignorable(seq: int, data: Any) -> bytes:
        row = {"type": "x/y", "seq": seq, "time": seq, "data": data, "ignorable": True}
        return _json.dumps_bytes(row)

    path = _raw(
        tmp_path,
        ignorable(0, {"n": 900719925474099, "f": 1.5, "s": "\ud800", "l": [1, {"a": None}]}),
        ignorable(1, {"s": "1234567890123456"}),
        ignorable(2, {"n": 9007199254740993}),
    )
    read = read_artifact(path, "none", 3)
    assert read.plain == [True, False, False]
    for row, plain in zip(rows(read)[:2], read.plain[:2], strict=True):
        walked = decode_stored_event(copy.deepcopy(row), session_id="s", seq=0, where=path)
        fast = decode_stored_event(row, session_id="s", seq=0, where=path, parsed_plain=plain)
        assert fast == walked
    with pytest.raises(SessionPersistenceCorruptionError, match="outside the safe range"):
        decode_stored_event(
            rows(read)[2], session_id="s", seq=2, where=path, parsed_plain=read.plain[2]
        )


def test_raw_without_newline_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "session.v3.jsonl"
    path.write_bytes(b'{"type":"session"')
    with pytest.raises(SessionPersistenceCorruptionError, match="empty or header-less"):
        read_artifact(str(path), "none", 3)


def test_split_records_and_multibyte_characters_across_frames(tmp_path: Path) -> None:
    """The scanner joins a record split across chunks, even inside a UTF-8 character;
    only the last complete frame must end on a record boundary."""
    path = tmp_path / "session.v3.jsonl.zstd"
    head = header_json_bytes(header_from_meta({"id": "s", "createdAt": 0}))
    line = _line("a/x", 0, {"t": "é😀"}) + b"\n"
    cut = line.index("😀".encode()) + 2  # inside the 4-byte character
    path.write_bytes(compress_frame(head) + compress_frame(line[:cut]) + compress_frame(line[cut:]))
    read = read_artifact(str(path), "zstd", 3)
    assert [e["data"] for e in rows(read)] == [{"t": "é😀"}]
    path.write_bytes(compress_frame(head) + compress_frame(line[:cut]))
    with pytest.raises(SessionPersistenceCorruptionError, match="contains a torn JSONL record"):
        read_artifact(str(path), "zstd", 3)


def test_zero_frame_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "session.v3.jsonl.zstd"
    path.write_bytes(b"")
    with pytest.raises(SessionPersistenceCorruptionError, match="empty or header-less Zstandard"):
        read_artifact(str(path), "zstd", 3)


def test_header_frame_must_be_exactly_one_line(tmp_path: Path) -> None:
    path = tmp_path / "session.v3.jsonl.zstd"
    head = header_json_bytes(header_from_meta({"id": "s", "createdAt": 0}))
    path.write_bytes(compress_frame(head + _line("a/x", 0) + b"\n"))
    with pytest.raises(SessionPersistenceCorruptionError, match="not exactly one header line"):
        read_artifact(str(path), "zstd", 3)


def test_v3_rows_with_retired_header_system_are_refused(tmp_path: Path) -> None:
    row = _line("request/header", 0, {"header": {"system": "x"}, "reason": "initial"})
    with pytest.raises(SessionFormatUnsupportedError, match=r"retired header\.system"):
        read_artifact(_raw(tmp_path, row), "none", 3)


# --------------------------------------------------------------------------- chunk rows and streams


def _chunk(
    seq: int, time: int, chunk: dict[str, Any], turn: int = 1, step: int = 1
) -> dict[str, Any]:
    return {
        "type": "assistant/chunk",
        "seq": seq,
        "time": time,
        "data": {"turn": turn, "step": step, "chunk": chunk},
    }


def test_v0_packed_row_vectors() -> None:
    texts = [
        _chunk(i, 100 + i, {"type": "text-delta", "index": 0, "text": c})
        for i, c in enumerate("abcde")
    ]
    rows = pack_chunk_rows(texts)
    assert rows == [
        {
            "type": "text-chunks",
            "seq0": 0,
            "time0": 100,
            "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 1, 1, 1], "texts": list("abcde")},
        }
    ]
    assert decode_v0_row(rows[0]) == texts
    short = texts[:2]
    assert pack_chunk_rows(short) == short
    tools = [
        _chunk(
            i, 5 - i, {"type": "tool-call-delta", "index": 1, "id": "c", "argumentsDelta": str(i)}
        )
        for i in range(3)
    ]
    (row,) = pack_chunk_rows(tools)
    assert row["type"] == "tool-call-chunks" and "name" not in row["data"]
    assert row["data"]["dt"] == [-1, -1]
    assert decode_v0_row(row) == tools


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": {}, "x": 1}, "envelope must be"),
        ({"type": "text-chunks", "seq0": -1, "time0": 0, "data": {}}, "seq0"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0.5, "data": {}}, "time0"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": []}, "data must be an object"),
        (
            {"type": "text-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1}},
            "data must be exactly",
        ),
        (
            {
                "type": "tool-call-chunks",
                "seq0": 0,
                "time0": 0,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "id": 5, "args": ["a"]},
            },
            "id \\(and name when present\\) must be strings",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 0,
                "time0": 0,
                "data": {"turn": "1", "step": 1, "index": 0, "dt": [], "texts": ["a"]},
            },
            "turn/step/index must be numbers",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 0,
                "time0": 0,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": []},
            },
            "texts must be a non-empty string array",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 0,
                "time0": 0,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [0.5], "texts": ["a", "b"]},
            },
            "dt must be an array of safe integers",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 0,
                "time0": 0,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": ["a", "b"]},
            },
            "dt length 0 does not match 2 members",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 2**53 - 1,
                "time0": 0,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [0], "texts": ["a", "b"]},
            },
            "member seqs must stay safe integers",
        ),
        (
            {
                "type": "text-chunks",
                "seq0": 0,
                "time0": 2**53 - 1,
                "data": {"turn": 1, "step": 1, "index": 0, "dt": [1], "texts": ["a", "b"]},
            },
            "member times must stay safe integers",
        ),
    ],
)
def test_v0_malformed_rows(row: dict[str, Any], match: str) -> None:
    with pytest.raises(RowError, match=match):
        decode_v0_row(row)


_delta = st.one_of(
    st.builds(
        lambda i, t: {"type": "text-delta", "index": i, "text": t},
        st.integers(0, 2),
        st.text(max_size=3),
    ),
    st.builds(
        lambda i, t: {"type": "reasoning-delta", "index": i, "text": t},
        st.integers(0, 2),
        st.text(max_size=3),
    ),
    st.builds(
        lambda i, c, n, a: {
            "type": "tool-call-delta",
            "index": i,
            "id": c,
            **({"name": n} if n else {}),
            "argumentsDelta": a,
        },
        st.integers(0, 2),
        st.sampled_from(["c1", "c2"]),
        st.sampled_from([None, "bash"]),
        st.text(max_size=3),
    ),
    st.just({"type": "block-start", "index": 0, "blockType": "text"}),
    st.just({"type": "finish", "reason": {"kind": "stop"}}),
)


@given(st.lists(st.tuples(st.integers(-5, 5), _delta), max_size=25))
def test_stream_packing_is_lossless(items: list[tuple[int, dict[str, Any]]]) -> None:
    time = 1000
    timed = []
    for gap, chunk in items:
        time += gap
        timed.append((time, chunk))
    records = pack_stream(timed)
    assert expand_stream(json.loads(json.dumps(records))) == timed


@given(st.lists(st.tuples(st.integers(0, 3), _delta), max_size=25))
def test_v0_chunk_rows_are_lossless(items: list[tuple[int, dict[str, Any]]]) -> None:
    events = []
    time = 10
    for seq, (gap, chunk) in enumerate(items):
        time += gap
        events.append(_chunk(seq, time, chunk))
    rows = pack_chunk_rows(events)
    decoded = [e for row in rows for e in decode_v0_row(json.loads(json.dumps(row)))]
    assert decoded == events


# --------------------------------------------------------------------------- JS-compatible JSON


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (1e-05, "0.00001"),
        (1e-07, "1e-7"),
        (1.5e21, "1.5e+21"),
        (123456789012345680000.0, "123456789012345680000"),
        (0.1, "0.1"),
        ("\ud800", '"\\ud800"'),
        ("é\n\x01", '"é\\n\\u0001"'),
        ({"a": [1, 2.5]}, '{"a":[1,2.5]}'),
    ],
)
def test_json_text_matches_javascript(value: Any, text: str) -> None:
    assert _json.dumps(value) == text


def test_json_reader_refuses_non_json_numbers() -> None:
    for text in ("NaN", "Infinity", "-Infinity", "1e400"):
        with pytest.raises(ValueError):
            _json.loads(text)
    assert _json.loads("2.0") == 2 and type(_json.loads("2.0")) is int


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text()
    | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=())),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(_json_values)
def test_fast_json_path_equals_the_exact_path(value: Any) -> None:
    assert _json.dumps_bytes(value) == _json.dumps(value).encode("utf-8")
    # Compared as UTF-16 (ASCII-escaped JSON), the unit JS strings are made of: a surrogate
    # pair written as two code points reads back as the one character it encodes.
    assert json.dumps(_json.loads(_json.dumps_bytes(value))) == json.dumps(value)


# --------------------------------------------------------------------------- reader: fast = exact
#
# _json.loads tries msgspec first and redoes whatever it refuses with the stdlib parser. The
# pair must read every line alike: for any bytes, loads gives exactly what the reference reading
# gives (the stdlib parser with DSH's number rules, written out here independently), or both
# refuse.

_MAX_SAFE = 2**53 - 1


def _reference_float(text: str) -> Any:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError("overflow")
    return int(number) if number.is_integer() and abs(number) <= _MAX_SAFE else number


def _reference_constant(name: str) -> Any:
    raise ValueError(name)


def _reference_loads(data: bytes) -> tuple[str, Any]:
    try:
        text = data.decode("utf-8")
        return "ok", json.loads(
            text, parse_float=_reference_float, parse_constant=_reference_constant
        )
    except ValueError:
        return "refused", None
    except RecursionError:
        return "too deep", None


def _same_json(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down and the same key order (iterative: lines
    nest deeper than Python recurses)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if type(x) is dict:
            if list(x) != list(y):
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif type(x) is list:
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


_number_tokens = st.from_regex(r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?\Z")
_odd_tokens = st.sampled_from([
    "-0", "-0.0", "0e0", "1.0", "1e400", "-1e400", "1e-400", "9007199254740993", "1E+2",
    "01", "1.", ".5", "+1", "1e", "-", "NaN", "Infinity", "-Infinity", "true", "nul",
    '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"\\u00e9"', '"\\x"', '"a\tb"',
    '{"a":1,"b":2,"a":3}', '{"a":1,}', "[1,]", "[] []", " [ 1 , 2 ] ", "\ufeff[]",
])  # fmt: skip
_texts = st.recursive(
    _number_tokens | _odd_tokens | st.text(max_size=6).map(json.dumps),
    lambda inner: st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
    | st.lists(st.tuples(st.text(max_size=3).map(json.dumps), inner), max_size=4).map(
        lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
    ),
    max_leaves=12,
)


@st.composite
def _lines(draw: st.DrawFn) -> tuple[bytes, int]:
    """A line and how deep its core is nested in extra brackets (0: not at all)."""
    kind = draw(st.sampled_from(["text", "value", "mutated", "deep"]))
    if kind == "value":  # what a writer emits, lone surrogates in any encoding
        value = draw(_json_values | st.integers() | st.floats(allow_nan=False))
        ascii_only = draw(st.booleans())
        return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"), 0
    data = draw(_texts).encode("utf-8")
    if kind == "mutated" and data:
        at = draw(st.integers(0, len(data) - 1))
        byte = draw(st.integers(0, 255))
        data = data[:at] + bytes([byte]) + data[at + draw(st.integers(0, 1)) :]
    return data, draw(st.integers(100, 3000)) if kind == "deep" else 0


@given(_lines())
def test_the_fast_json_reader_reads_every_line_as_the_exact_reader(line: tuple[bytes, int]) -> None:
    core, depth = line
    data = b"[" * depth + core + b"]" * depth
    verdict, expected = _reference_loads(core)
    for _ in range(depth):
        expected = [expected]
    if verdict == "ok":
        try:
            value = _json.loads(data)
        except ValueError:
            # refusing a valid line is allowed only where the exact parser cannot go either
            assert _reference_loads(data)[0] == "too deep", data[:200]
        else:
            assert _same_json(value, expected), data[:200]
    else:
        with pytest.raises(ValueError):
            _json.loads(data)
