"""Event envelope, vocabulary registry, two-phase codec."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dsh_host._session import (
    DSH_V3_KNOWN_EVENT_TYPES,
    AbortedReason,
    BlockedReason,
    CompletedReason,
    ErrorReason,
    ForkedReason,
    InterruptedReason,
    InvalidSessionEventError,
    LlmFailure,
    MaxTokensReason,
    ReplaceOp,
    SessionEvent,
    TurnEnd,
    UnknownEventTypeError,
    UnknownTurnEndReason,
    UserCancel,
    Wire,
    decode_event,
    encode_event,
    event_to_builtins,
    is_known_event_type,
    is_surface_type,
    register_event_type,
    register_turn_end_reason,
)

from .fixtures import EXPECTED, fixture_records


def raw(**fields: Any) -> bytes:
    base: dict[str, Any] = {"type": "turn/start", "seq": 0, "time": 5, "data": {"turn": 1}}
    base.update(fields)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    "name", [n for n, spec in EXPECTED.items() if isinstance(spec.get("recoveredEvents"), int)]
)
def test_dsh_v3_fixture_records_decode_and_reencode_byte_identically(name: str) -> None:
    records = fixture_records(name)
    expected = EXPECTED[name]
    decoded = []
    for line in records[: expected["recoveredEvents"]]:
        event = decode_event(line)
        assert encode_event(event) == line
        decoded.append(event)
    assert [e.type for e in decoded] == expected["eventTypes"]


def test_every_dsh_v3_known_type_is_registered() -> None:
    for name in DSH_V3_KNOWN_EVENT_TYPES:
        assert is_known_event_type(name), name
    assert {t for t in DSH_V3_KNOWN_EVENT_TYPES if is_surface_type(t)} == {
        "user/message",
        "assistant/message",
        "tool/result",
        "system/message",
    }


def test_opaque_known_payloads_stay_frozen_json() -> None:
    event = decode_event(raw(type="compaction/start", data={"compactionId": "c", "turn": None}))
    assert dict(event.data) == {"compactionId": "c", "turn": None}
    with pytest.raises(TypeError):
        event.data["turn"] = 1
    assert json.loads(encode_event(event))["data"] == {"compactionId": "c", "turn": None}


@pytest.mark.parametrize(
    ("record", "detail"),
    [
        (raw(seq="0"), "seq"),
        (raw(seq=0.5), "seq"),
        (raw(seq=-1), "seq must be a non-negative safe integer"),
        (raw(time=0.5), "time"),
        (raw(ignorable=False), "ignorable must be exactly true"),
        (raw(ignorable="yes"), "ignorable must be exactly true"),
        (raw(extra=1), "extra"),
        (b'{"type":"turn/start","seq":0,"time":1}', "data"),
        (b'{"type":5,"seq":0,"time":1,"data":{}}', "type"),
    ],
)
def test_invalid_envelopes_are_refused(record: bytes, detail: str) -> None:
    with pytest.raises(InvalidSessionEventError, match="invalid event envelope") as info:
        decode_event(record, where="seed event at index 0")
    assert detail in str(info.value)
    assert str(info.value).startswith("seed event at index 0")


def test_unknown_type_refuses_reconstruction_naming_the_type() -> None:
    with pytest.raises(UnknownEventTypeError, match='"future/thing"') as info:
        decode_event(raw(type="future/thing", seq=7, data={}))
    assert info.value.event_type == "future/thing"
    assert info.value.seq == 7


def test_unknown_ignorable_type_is_kept_opaque() -> None:
    event = decode_event(raw(type="future/thing", data={"x": [1]}, ignorable=True))
    assert event.ignorable is True
    assert dict(event.data) == {"x": (1,)}
    assert json.loads(encode_event(event))["ignorable"] is True


def test_data_of_a_known_type_is_validated_naming_the_type() -> None:
    with pytest.raises(InvalidSessionEventError, match=r'"turn/start".*TurnStart'):
        decode_event(raw(data={"turn": 0}))
    with pytest.raises(InvalidSessionEventError, match="turn/end"):
        decode_event(raw(type="turn/end", data={"turn": 1, "reason": "done"}))


def test_decode_from_mapping_equals_decode_from_bytes() -> None:
    line = fixture_records("root-none/--home-dev-project--/raw-clean/session.v3.jsonl")[3]
    from_bytes = decode_event(line)
    from_dict = decode_event(json.loads(line))
    assert from_bytes == from_dict


@pytest.mark.parametrize(
    "reason",
    [
        CompletedReason(),
        AbortedReason(reason=UserCancel()),
        BlockedReason(),
        ErrorReason(error=LlmFailure(message="boom", code="UNKNOWN")),
        MaxTokensReason(),
        InterruptedReason(),
        ForkedReason(),
    ],
)
def test_the_seven_turn_end_reasons_round_trip(reason: Any) -> None:
    event = SessionEvent(type="turn/end", seq=0, time=1, data=TurnEnd(turn=1, reason=reason))
    again = decode_event(encode_event(event))
    assert again == event
    assert again.data.reason == reason


def test_an_unknown_turn_end_kind_is_a_valid_value() -> None:
    event = decode_event(
        raw(type="turn/end", data={"turn": 2, "reason": {"kind": "paused", "n": 1}})
    )
    reason = event.data.reason
    assert isinstance(reason, UnknownTurnEndReason)
    assert reason.kind == "paused"
    assert reason["n"] == 1
    match reason:  # every match over reasons needs a default branch; this is where it lands
        case CompletedReason():
            pytest.fail("not completed")
        case _:
            pass
    assert json.loads(encode_event(event))["data"]["reason"] == {"kind": "paused", "n": 1}


def test_plugins_register_turn_end_kinds_and_event_types() -> None:
    class Paused(Wire, frozen=True, kw_only=True, tag="paused", tag_field="kind"):
        n: int

    class Ping(Wire, frozen=True, kw_only=True):
        count: int

    undo_reason = register_turn_end_reason(Paused)
    undo_type = register_event_type("my-plugin/ping", Ping)
    try:
        event = decode_event(
            raw(type="turn/end", data={"turn": 1, "reason": {"kind": "paused", "n": 3}})
        )
        assert event.data.reason == Paused(n=3)
        ping = decode_event(raw(type="my-plugin/ping", data={"count": 2}))
        assert ping.data == Ping(count=2)
        assert register_event_type("my-plugin/ping", Ping)() is None  # same spec: no-op
        with pytest.raises(ValueError, match="already registered"):
            register_event_type("my-plugin/ping", None)
    finally:
        undo_type()
        undo_reason()
    assert not is_known_event_type("my-plugin/ping")
    with pytest.raises(UnknownEventTypeError):
        decode_event(raw(type="my-plugin/ping", data={"count": 2}))
    assert isinstance(
        decode_event(
            raw(type="turn/end", data={"turn": 1, "reason": {"kind": "paused", "n": 3}})
        ).data.reason,
        UnknownTurnEndReason,
    )


@pytest.mark.parametrize("bad", ["Upper/case", "noslash", "a//b", ""])
def test_registering_a_malformed_type_name_fails(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid name"):
        register_event_type(bad, None)


def test_legacy_request_header_shapes_are_refused() -> None:
    with pytest.raises(InvalidSessionEventError, match="legacy request/header-delta"):
        decode_event(raw(type="request/header-delta", data={}))
    header = {"config": {"provider": "p", "model": "m"}}
    with pytest.raises(InvalidSessionEventError, match='legacy request/header reason "fallback"'):
        decode_event(raw(type="request/header", data={"header": header, "reason": "fallback"}))


@pytest.mark.parametrize(
    ("surface_op", "message"),
    [
        (None, "requires a surfaceOp marker"),
        ("prepend", "invalid surfaceOp"),
        ({"op": "replace", "start": 0}, "invalid replace surfaceOp"),
        ({"op": "replace", "start": -1, "end": 0}, "invalid replace surfaceOp"),
        ({"op": "replace", "start": 0, "end": 0, "x": 1}, "invalid replace surfaceOp"),
        ({"op": "delete", "start": 0, "end": 0}, "invalid replace surfaceOp"),
    ],
)
def test_surface_marker_shape_errors(surface_op: Any, message: str) -> None:
    data = {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}}
    fields: dict[str, Any] = {"type": "user/message", "data": data}
    if surface_op is not None:
        fields["surfaceOp"] = surface_op
    with pytest.raises(InvalidSessionEventError, match=message) as info:
        decode_event(raw(**fields))
    assert "user/message" in str(info.value)


def test_dsh_startseq_endseq_spelling_is_read_as_the_spec_spelling_and_kept_on_the_wire() -> None:
    """The typed marker is DSH's ``ReplaceOp``; the record re-encodes as it was read
    (DSH v3 spells the range startSeq/endSeq), so a copy is byte-faithful (issue 16 item 4)."""
    data = {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}}
    event = decode_event(
        raw(
            type="user/message",
            seq=3,
            data=data,
            surfaceOp={"op": "replace", "startSeq": 0, "endSeq": 1},
            sourceEventSeqs=[0, 1],
        )
    )
    assert event.surface_op == ReplaceOp(start=0, end=1)
    assert json.loads(encode_event(event))["surfaceOp"] == {
        "op": "replace",
        "startSeq": 0,
        "endSeq": 1,
    }


def test_non_surface_types_cannot_carry_surface_metadata() -> None:
    with pytest.raises(
        InvalidSessionEventError, match="not surface-eligible and cannot carry surfaceOp"
    ):
        decode_event(raw(surfaceOp="append"))
    with pytest.raises(
        InvalidSessionEventError, match="not surface-eligible and cannot carry sourceEventSeqs"
    ):
        decode_event(raw(sourceEventSeqs=[0]))


def test_encode_escapes_lone_surrogates_like_a_javascript_writer() -> None:
    event = decode_event(raw(type="session/title", data={"title": "a\ud800b"}))
    assert encode_event(event) == (
        b'{"type":"session/title","seq":0,"time":5,"data":{"title":"a\\ud800b"}}'
    )
    assert decode_event(encode_event(event)) == event


def test_event_to_builtins_is_plain_json() -> None:
    line = fixture_records("root-none/--home-dev-project--/raw-clean/session.v3.jsonl")[3]
    assert event_to_builtins(decode_event(line)) == msgspec.json.decode(line)
