"""``decode_event_line``: one typed decode of a stored line, or None for the general path.

Whatever it returns must be exactly what the general path (the line read as plain JSON with
JavaScript number semantics, then ``decode_event(parsed_plain=True)``) gives: the same
event, field types included (``2`` is not ``2.0``, a tuple is not a list), and no ``wire``.
Every line it is not sure of returns None, and a refused line is refused by the general path.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from dsh_host._jsonsafe import parse_js_float
from dsh_host._session.errors import InvalidSessionEventError
from dsh_host._session.events import (
    SessionEvent,
    decode_event,
    decode_event_line,
    encode_event,
    register_event_type,
)
from dsh_host._session.messages import Wire

from .fixtures import EXPECTED, fixture_records

_PLAIN = msgspec.json.Decoder(float_hook=parse_js_float)

_MESSAGE = {
    "id": "m1",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Step 1."},
        {"type": "tool-call", "id": "c1", "name": "noop", "arguments": '{"i":1}'},
    ],
    "source": {"kind": "model", "provider": "p", "model": "m"},
}
_STREAM = [
    {"type": "chunk", "time": 5, "chunk": {"type": "block-start", "index": 0, "blockType": "text"}},
    {"type": "text-chunks", "time0": 5, "index": 0, "dt": [0, 1], "texts": ["Step ", "1."]},
    {"type": "chunk", "time": 7, "chunk": {"type": "finish", "reason": {"kind": "tool-calls"}}},
]
_RESULT = {
    "id": "m2",
    "role": "user",
    "content": [
        {
            "type": "tool-result",
            "toolCallId": "c1",
            "content": [{"type": "text", "text": "ok"}],
            "isError": False,
        }
    ],
    "source": {"kind": "tool", "callId": "c1"},
}


def _row(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": 1_700_000_000_000 + seq, "data": data, **extra}


#: Rows of (nearly) every shape a log of this build holds, as plain records.
ROWS: list[dict[str, Any]] = [
    _row("turn/start", 0, {"turn": 1}),
    _row("step/start", 1, {"turn": 1, "step": 1}),
    _row(
        "user/message",
        2,
        {
            "id": "u1",
            "role": "user",
            "content": [{"type": "text", "text": "héllo 😀"}, {"type": "file", "x": [1, 2.5]}],
            "source": {"kind": "user"},
        },
        surfaceOp="append",
    ),
    _row(
        "user/message",
        3,
        {"id": "u2", "role": "user", "content": [], "source": {"kind": "cron", "at": 0.25}},
        surfaceOp={"op": "replace", "startSeq": 2, "endSeq": 2},
    ),
    _row(
        "assistant/message",
        4,
        {
            "turn": 1,
            "step": 1,
            "message": _MESSAGE,
            "stream": _STREAM,
            "usage": {"inputTokens": 10, "outputTokens": 2},
        },
        surfaceOp="append",
    ),
    _row("tool/call", 5, {"turn": 1, "step": 1, "callId": "c1", "name": "noop", "arguments": "{}"}),
    _row(
        "tool/result",
        6,
        {"turn": 1, "step": 1, "message": _RESULT, "meta": {"a": [0.5, None, True]}},
        sourceEventSeqs=[5],
        surfaceOp="append",
    ),
    _row("step/end", 7, {"turn": 1, "step": 1}),
    _row("turn/end", 8, {"turn": 1, "reason": {"kind": "completed"}}),
    _row("turn/end", 9, {"turn": 1, "reason": {"kind": "a-newer-kind", "n": 1.5}}),
    _row("session/end-seed", 10, {}),
    _row("session/title", 11, {"title": "t", "score": 0.75, "nested": {"k": [1, "2"]}}),
    _row("todo/write", 12, {"todos": [{"content": "x", "status": "pending"}]}, ignorable=True),
    _row("approval/asked", 13, {"id": "a1", "toolName": "bash", "stage": "pre-execute"}),
]


def general(line: bytes) -> SessionEvent:
    """The reference: the general path, as a stored-log reader takes it."""
    return decode_event(_PLAIN.decode(line), parsed_plain=True)


def assert_same(fast: SessionEvent, line: bytes) -> None:
    reference = general(line)
    assert fast == reference
    assert repr(fast) == repr(reference)  # field types too: 2 vs 2.0, tuple vs list, frozen
    assert fast.wire is UNSET and reference.wire is UNSET
    assert encode_event(fast) == line


def canonical(row: dict[str, Any]) -> bytes:
    """The line this build writes for ``row``."""
    return encode_event(decode_event(row))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['seq']}-{r['type']}")
def test_a_line_this_build_wrote_decodes_in_one_pass_to_the_general_paths_event(
    row: dict[str, Any],
) -> None:
    line = canonical(row)
    fast = decode_event_line(line)
    assert fast is not None
    assert_same(fast, line)


def test_reference_fixture_lines_decode_in_one_pass() -> None:
    """DSH's own writer prints what this build prints: its lines take the one-pass decode."""
    seen = 0
    for name, spec in EXPECTED.items():
        if spec["scenario"].startswith("corrupt"):
            continue
        for line in fixture_records(name):
            fast = decode_event_line(line)
            assert fast is not None, line
            assert_same(fast, line)
            seen += 1
    assert seen > 20


def _swap_data_keys(row: dict[str, Any]) -> bytes:
    data = row["data"]
    swapped = {**row, "data": dict(reversed(list(data.items())))}
    return json.dumps(swapped, separators=(",", ":"), ensure_ascii=False).encode()


GENERAL_ONLY: list[tuple[str, bytes]] = [
    ("unknown ignorable type", canonical(_row("x-newer/thing", 0, {"a": 1}, ignorable=True))),
    ("another key order", _swap_data_keys(_row("step/start", 1, {"turn": 1, "step": 2}))),
    (
        "a key this build does not model",
        json.dumps(_row("step/end", 1, {"turn": 1, "step": 2, "extra": 1})).encode(),
    ),
    ("integral float in open JSON", b'{"type":"session/title","seq":0,"time":0,"data":{"n":2.0}}'),
    ("integral float typed", b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":1.0}}'),
    ("float overflow", b'{"type":"session/title","seq":0,"time":0,"data":{"n":1e400}}'),
    ("-0", b'{"type":"session/title","seq":0,"time":0,"data":{"n":-0}}'),
    ("escaped lone surrogate", b'{"type":"session/title","seq":0,"time":0,"data":"\\ud800"}'),
    ("escape of a printable", b'{"type":"session/title","seq":0,"time":0,"data":"\\u00e9"}'),
    (
        "duplicate key",
        b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"data":{"turn":2}}',
    ),
    (
        "surfaceOp on a non-surface type",
        b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"surfaceOp":"append"}',
    ),
    (
        "surface type without surfaceOp",
        canonical(ROWS[2]).replace(b',"surfaceOp":"append"', b""),
    ),
    (
        "ignorable false",
        b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"ignorable":false}',
    ),
    ("negative seq", b'{"type":"turn/start","seq":-1,"time":0,"data":{"turn":1}}'),
    ("unsafe time", b'{"type":"turn/start","seq":0,"time":9007199254740992,"data":{"turn":1}}'),
    ("turn 0", b'{"type":"turn/start","seq":0,"time":0,"data":{"turn":0}}'),
    ("role missing", canonical(ROWS[2]).replace(b'"role":"user",', b"")),
    (
        "mismatched tool call ids",
        canonical(ROWS[6]).replace(b'"toolCallId":"c1"', b'"toolCallId":"c9"'),
    ),
    (
        "request/header",
        canonical(
            _row(
                "request/header",
                0,
                {"header": {"config": {"provider": "p", "model": "m"}}, "reason": "initial"},
            )
        ),
    ),
    ("not an object", b'["turn/start"]'),
    ("not JSON", b'{"type":"turn/start","seq":0,'),
    ("no closing quote", b'{"type":"turn/start'),
    ("non-ASCII type", '{"type":"tür/start","seq":0,"time":0,"data":{}}'.encode()),
    ("empty", b""),
]


@pytest.mark.parametrize(("why", "line"), GENERAL_ONLY, ids=[w for w, _ in GENERAL_ONLY])
def test_every_other_line_is_left_to_the_general_path(why: str, line: bytes) -> None:
    assert decode_event_line(line) is None


def test_what_the_general_path_makes_of_the_lines_left_to_it() -> None:
    """The lines above are not all refusals: some are valid events the general path keeps
    (with their ``wire`` when the typed fields would lose something), some it refuses."""
    lines = dict(GENERAL_ONLY)
    assert general(lines["unknown ignorable type"]).ignorable is True
    assert general(lines["another key order"]) == general(
        canonical(_row("step/start", 1, {"turn": 1, "step": 2}))
    )
    assert general(lines["a key this build does not model"]).wire is not UNSET
    assert general(lines["integral float in open JSON"]).data == {"n": 2}
    assert general(lines["integral float typed"]).data.turn == 1
    for why in ("surfaceOp on a non-surface type", "role missing", "mismatched tool call ids"):
        with pytest.raises(InvalidSessionEventError):
            general(lines[why])


def test_float_positions_and_plain_value_admission_types_always_take_the_general_path() -> None:
    retry = {
        "retryId": "r",
        "turn": 1,
        "step": 1,
        "provider": "p",
        "mode": "always",
        "policyKey": "k",
        "retry": 1,
        "delayMs": 2.5,
        "failure": {"message": "m", "code": "RATE_LIMIT"},
    }
    line = canonical(_row("llm/retry", 0, retry))
    assert general(line).data.delay_ms == 2.5
    assert decode_event_line(line) is None
    system = _row(
        "system/message",
        0,
        {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "s",
                "role": "system",
                "content": [{"type": "text", "text": "be brief"}],
                "source": {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"},
            },
        },
        surfaceOp="append",
    )
    assert decode_event_line(canonical(system)) is None


def test_a_plugin_type_is_decoded_as_registered_now() -> None:
    class Ping(Wire, frozen=True, kw_only=True):
        count: int

    class Pong(Wire, frozen=True, kw_only=True):
        count: int
        label: str = "pong"

    line = b'{"type":"my-plugin/ping","seq":0,"time":0,"data":{"count":2}}'
    assert decode_event_line(line) is None  # not registered: unknown
    undo = register_event_type("my-plugin/ping", Ping)
    try:
        fast = decode_event_line(line)
        assert fast is not None and fast.data == Ping(count=2)
        assert_same(fast, line)
    finally:
        undo()
    assert decode_event_line(line) is None  # the cached decoder went with the registration
    undo = register_event_type("my-plugin/ping", Pong)
    try:
        assert decode_event_line(line) is None  # Pong writes its default label: not this line
        pong = b'{"type":"my-plugin/ping","seq":0,"time":0,"data":{"count":2,"label":"pong"}}'
        fast = decode_event_line(pong)
        assert fast is not None and fast.data == Pong(count=2)
    finally:
        undo()


def test_mutated_lines_are_either_left_to_the_general_path_or_decoded_exactly() -> None:
    """Single-byte edits of real lines: whenever one still decodes in one pass, the general
    path accepts it too and gives the same event."""
    rng = random.Random(25)
    lines = [canonical(row) for row in ROWS]
    alphabet = b'0123456789.-e",:{}[]aAtnu\\ '
    fast_hits = 0
    for _ in range(3000):
        line = bytearray(rng.choice(lines))
        at = rng.randrange(len(line))
        action = rng.randrange(3)
        if action == 0:
            del line[at]
        elif action == 1:
            line.insert(at, rng.choice(alphabet))
        else:
            line[at] = rng.choice(alphabet)
        mutated = bytes(line)
        fast = decode_event_line(mutated)
        if fast is not None:
            fast_hits += 1
            assert_same(fast, mutated)
    assert fast_hits > 0  # some edits (a digit, a letter in a string) keep a valid line
