"""Session: append, validation at the append site, observers, seeds, restore."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from dsh_host._jsonsafe import FrozenJson
from dsh_host._session import (
    AbortedReason,
    CompletedReason,
    EpochHeader,
    InvalidSeedError,
    InvalidSessionEventError,
    LlmCallConfig,
    MaxTokensReason,
    RequestContextData,
    RequestHeaderData,
    Session,
    SessionAppendReentryError,
    SessionEvent,
    TextBlock,
    ToolSchema,
    TurnEnd,
    TurnStart,
    UnknownEventTypeError,
    UserCancel,
    UserMessage,
    UserSource,
    Wire,
    decode_event,
    encode_event,
    event_to_builtins,
    register_event_type,
)
from dsh_host.testing import FakeClock

from .builders import assistant, new_session, one_turn, tool_result, user


def test_append_commits_contiguous_frozen_events() -> None:
    session = new_session()
    first = session.append("turn/start", {"turn": 1})
    second = session.append("user/message", user("u1"), surface_op="append")
    assert (first.seq, second.seq) == (0, 1)
    assert (first.time, second.time) == (1001, 1002)  # 1000 went to createdAt
    assert first.data == TurnStart(turn=1)
    assert session.seq == 2
    assert list(session.events) == [first, second]
    with pytest.raises(AttributeError):
        first.seq = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        second.data.id = "x"
    assert isinstance(second.data.content, tuple)


def test_caller_mutation_after_append_is_ignored() -> None:
    session = new_session()
    payload: dict[str, Any] = {
        "id": "u",
        "role": "user",
        "content": [{"type": "text", "text": "before"}],
        "source": {"kind": "user"},
    }
    event = session.append("user/message", payload, surface_op="append")
    payload["content"][0]["text"] = "after"
    payload["id"] = "changed"
    assert event.data == user("u", "before")
    meta = {"k": [1]}
    result = session.append("tool/result", tool_result(1, 1, "c", meta=meta), surface_op="append")
    meta["k"].append(2)
    assert result.data.meta == {"k": (1,)}
    with pytest.raises(TypeError):
        result.data.meta["k"] = 3


def test_events_snapshot_is_cached_and_never_grows() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    snapshot = session.events
    assert session.events is snapshot
    session.append("step/start", {"turn": 1, "step": 1})
    assert len(snapshot) == 1
    assert session.events is not snapshot
    assert len(session.events) == 2
    assert session.events[-1].type == "step/start"
    assert session.events[0:2] == tuple(session.events)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (float("nan"), "non-finite"),
        (float("inf"), "non-finite"),
        (-0.0, "negative zero"),
        (2**60, "outside the safe range"),
        ({1, 2}, "set"),
        (lambda: 1, "function"),
        (object(), "object"),
    ],
)
def test_non_json_data_is_rejected_naming_the_event_type(value: Any, problem: str) -> None:
    session = new_session()
    with pytest.raises(InvalidSessionEventError) as info:
        session.append(
            "tool/result", tool_result(1, 1, "c", meta={"x": [value]}), surface_op="append"
        )
    message = str(info.value)
    assert message.startswith('session event "tool/result" carries non-JSON-serializable data')
    assert problem in message
    assert "$.meta.x[0]" in message
    assert info.value.event_type == "tool/result"
    assert session.seq == 0  # the log is unchanged


def test_non_json_plain_data_is_rejected() -> None:
    session = new_session()
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for bad in ({"turn": float("nan")}, {"turn": 1, 2: 3}, {"turn": cyclic}):
        with pytest.raises(InvalidSessionEventError, match='"turn/start" carries non-JSON'):
            session.append("turn/start", bad)
    assert session.seq == 0


def test_surface_marker_rules_at_append() -> None:
    session = new_session()
    with pytest.raises(InvalidSessionEventError, match='"turn/start" is not surface-eligible'):
        session.append("turn/start", {"turn": 1}, surface_op="append")
    with pytest.raises(InvalidSessionEventError, match="cannot carry sourceEventSeqs"):
        session.append("turn/start", {"turn": 1}, source_event_seqs=[0])
    with pytest.raises(InvalidSessionEventError, match='"user/message" is surface-eligible and'):
        session.append("user/message", user("u"))
    with pytest.raises(InvalidSessionEventError, match="invalid surfaceOp"):
        session.append("user/message", user("u"), surface_op="prepend")  # type: ignore[arg-type]
    assert session.seq == 0


def test_unknown_type_is_refused_unless_ignorable() -> None:
    session = new_session()
    with pytest.raises(UnknownEventTypeError, match='"acme/audit"') as info:
        session.append("acme/audit", {"x": 1})
    assert info.value.event_type == "acme/audit"
    event = session.append("acme/audit", {"x": 1}, ignorable=True)
    assert event.ignorable is True
    assert b'"ignorable":true' in encode_event(event)


def test_invalid_typed_data_is_refused_naming_the_type() -> None:
    session = new_session()
    with pytest.raises(InvalidSessionEventError, match='"step/start"'):
        session.append("step/start", {"turn": 1})
    with pytest.raises(InvalidSessionEventError, match='"turn/start"'):
        session.append("turn/start", {"turn": True})  # bool is not a number
    with pytest.raises(InvalidSessionEventError, match="must contain one tool-result block"):
        session.append(
            "tool/result",
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "id": "r",
                    "role": "user",
                    "content": [],
                    "source": {"kind": "tool", "callId": "c"},
                },
            },
            surface_op="append",
        )
    mismatched = tool_result(1, 1, "c")
    mismatched = msgspec.structs.replace(
        mismatched,
        message=msgspec.structs.replace(
            mismatched.message,
            source=msgspec.structs.replace(mismatched.message.source, call_id="other"),
        ),
    )
    with pytest.raises(InvalidSessionEventError, match="mismatched tool call ids"):
        session.append("tool/result", mismatched, surface_op="append")
    assert session.seq == 0


def test_reason_kinds_round_trip_through_append_json_and_seeded_replay() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("turn/end", TurnEnd(turn=1, reason=MaxTokensReason()))
    session.append("turn/start", {"turn": 2})
    session.append(
        "turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "user"}}}
    )
    assert session.events[3].data.reason == AbortedReason(reason=UserCancel())
    copy = [decode_event(encode_event(e)) for e in session.events]
    assert copy == list(session.events)
    replay = Session.create("r", seed=[event_to_builtins(e) for e in session.events])
    assert list(replay.events)[:4] == list(session.events)


class TestObservers:
    def test_observers_see_committed_events_and_failures_are_contained(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        session = new_session("obs")
        seen: list[tuple[int, int]] = []

        def first(s: Session, event: SessionEvent) -> None:
            seen.append((event.seq, len(s.events)))
            raise RuntimeError("observer bug")

        def second(s: Session, event: SessionEvent) -> None:
            seen.append((event.seq, -1))

        session.add_observer(first)
        remove = session.add_observer(second)
        with caplog.at_level(logging.WARNING, logger="dsh.session"):
            event = session.append("turn/start", {"turn": 1})
        assert event.seq == 0
        assert seen == [(0, 1), (0, -1)]  # committed before observers run; later ones still run
        assert 'session "obs": session/event listener threw: observer bug' in caplog.text
        remove()
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        assert seen[-1] == (1, 2)  # only the remaining observer ran

    def test_reentrant_append_from_an_observer_is_rejected_and_contained(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        session = new_session("re")
        errors: list[BaseException] = []
        later: list[int] = []

        def reenter(s: Session, event: SessionEvent) -> None:
            try:
                s.append("turn/start", {"turn": 9})
            except SessionAppendReentryError as exc:
                errors.append(exc)
                raise

        session.add_observer(reenter)
        session.add_observer(lambda s, e: later.append(e.seq))
        with caplog.at_level(logging.WARNING, logger="dsh.session"):
            session.append("turn/start", {"turn": 1})
        assert len(errors) == 1
        assert str(errors[0]) == (
            "session append cannot reenter while another append is being published"
        )
        assert later == [0]
        assert session.seq == 1
        assert "cannot reenter" in caplog.text
        other = new_session("other")
        session.add_observer(lambda s, e: other.append("turn/start", {"turn": e.seq + 1}))
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        assert other.seq == 1  # appending to another session from an observer is fine

    def test_rejected_append_notifies_no_one(self) -> None:
        session = new_session()
        seen: list[SessionEvent] = []
        session.add_observer(lambda s, e: seen.append(e))
        with pytest.raises(InvalidSessionEventError):
            session.append("turn/start", {"turn": 0})
        assert seen == []
        assert session.append("turn/start", {"turn": 1}).seq == 0  # the retry gets the same seq


class TestSeeds:
    def _log(self) -> list[SessionEvent]:
        session = new_session()
        one_turn(session)
        return list(session.events)

    def test_seeded_replay_equals_the_original(self) -> None:
        original = new_session()
        one_turn(original)
        n = original.seq
        replay = Session.create("r", seed=list(original.events), clock=FakeClock())
        assert list(replay.events)[:n] == list(original.events)
        assert replay.seq == n + 1
        assert replay.events[n].type == "session/end-seed"
        assert replay.first_live_seq == n
        assert list(replay.derive_messages()) == list(original.derive_messages())

    def test_end_seed_rules(self) -> None:
        fresh = new_session()
        assert fresh.seq == 0 and fresh.first_live_seq == 0
        empty = Session.create("e", seed=[])
        assert [e.type for e in empty.events] == ["session/end-seed"]
        assert empty.first_live_seq == 0
        again = Session.create("a", seed=list(empty.events))
        assert again.seq == 1  # a seed ending in a marker is not re-marked
        assert again.first_live_seq == 1

    def test_seed_with_a_gap_is_refused(self) -> None:
        log = self._log()
        with pytest.raises(
            InvalidSeedError, match=r"seed event at index 2 has seq 3 \(expected 2\)"
        ):
            Session.create("g", seed=log[:2] + log[3:])
        with pytest.raises(InvalidSeedError, match="contiguous from 0"):
            Session.restore({"version": 3, "id": "g", "createdAt": 1}, log[1:])

    @pytest.mark.parametrize(
        ("record", "message"),
        [
            (
                {
                    "type": "user/message",
                    "seq": 0,
                    "time": 1,
                    "data": {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}},
                },
                "requires a surfaceOp marker",
            ),
            (
                {
                    "type": "turn/start",
                    "seq": 0,
                    "time": 1,
                    "data": {"turn": 1},
                    "surfaceOp": "append",
                },
                "not surface-eligible",
            ),
            ({"type": "mystery/type", "seq": 0, "time": 1, "data": {}}, '"mystery/type"'),
            (
                {"type": "turn/start", "seq": "0", "time": 1, "data": {"turn": 1}},
                "invalid event envelope",
            ),
            (
                {"type": "turn/start", "seq": 0, "time": 0.5, "data": {"turn": 1}},
                "invalid event envelope",
            ),
            ({"type": "turn/start", "seq": 0, "time": 1}, "invalid event envelope"),
            (
                {
                    "type": "user/message",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {"role": "user", "content": [], "source": {"kind": "user"}},
                },
                "lacks an identified message",
            ),
            (
                {
                    "type": "user/message",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {
                        "id": "u",
                        "role": "assistant",
                        "content": [],
                        "source": {"kind": "user"},
                    },
                },
                'message must have role "user"',
            ),
            (
                {
                    "type": "user/message",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {"id": "u", "role": "user", "content": [], "source": {}},
                },
                "message has invalid source",
            ),
            (
                {
                    "type": "user/message",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {"id": "u", "role": "user", "content": "x", "source": {"kind": "user"}},
                },
                "message has invalid content",
            ),
            (
                {
                    "type": "assistant/message",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {
                        "turn": 1,
                        "step": 1,
                        "message": {
                            "id": "a",
                            "role": "assistant",
                            "content": [],
                            "source": {"kind": "model", "provider": ""},
                        },
                    },
                },
                "message must have model source",
            ),
            (
                {
                    "type": "tool/result",
                    "seq": 0,
                    "time": 1,
                    "surfaceOp": "append",
                    "data": {
                        "turn": 1,
                        "step": 1,
                        "message": {
                            "id": "r",
                            "role": "user",
                            "content": [],
                            "source": {"kind": "user"},
                        },
                    },
                },
                "message must have tool source",
            ),
        ],
    )
    def test_bad_seed_events_are_refused_naming_index_and_type(
        self, record: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(InvalidSeedError, match="index 0") as info:
            Session.create("bad", seed=[record])
        assert message in str(info.value)
        assert info.value.index == 0

    def test_ignorable_unknown_seed_events_are_preserved(self) -> None:
        record = {"type": "mystery/type", "seq": 0, "time": 1, "data": {"a": 1}, "ignorable": True}
        session = Session.create("ok", seed=[record])
        assert session.events[0].ignorable is True
        assert event_to_builtins(session.events[0]) == record

    def test_restore_adopts_decoded_events_without_notifying(self) -> None:
        log = self._log()
        records = [encode_event(e) for e in log]
        decoded = [decode_event(r) for r in records]
        header = {"version": 3, "id": "stored", "createdAt": 5, "cwd": "/w"}
        restored = Session.restore(header, decoded)
        assert restored.seq == len(log) + 1
        assert restored.events[-1].type == "session/end-seed"
        assert restored.events[0] is decoded[0]  # ownership transfer: no copy
        read_only = Session.restore(header, decoded, mark_seed_end=False)
        assert read_only.seq == len(log)
        with pytest.raises(InvalidSeedError, match="decode_event"):
            Session.restore(header, [event_to_builtins(e) for e in log])  # type: ignore[misc]

    def test_restore_refuses_unknown_types(self) -> None:
        stray = SessionEvent(type="mystery/type", seq=0, time=1, data={})
        with pytest.raises(UnknownEventTypeError, match='"mystery/type"'):
            Session.restore({"version": 3, "id": "x", "createdAt": 1}, [stray])


def test_request_header_and_context_folds() -> None:
    session = new_session()
    assert session.request_header() is None and session.request_context() is None
    config = LlmCallConfig(provider="p", model="m")
    session.append("turn/start", {"turn": 1})
    session.append(
        "request/header",
        RequestHeaderData(header=EpochHeader(config=config, tools=()), reason="initial"),
    )
    assert session.request_header() == EpochHeader(config=config)  # canonical: empties dropped
    tools = (ToolSchema(name="t", description="d", parameters={"type": "object"}),)
    session.append(
        "request/header",
        {
            "header": {
                "config": {"provider": "p", "model": "m2"},
                "tools": [{"name": "t", "description": "d", "parameters": {"type": "object"}}],
            },
            "reason": "change",
        },
    )
    assert session.request_header() == EpochHeader(
        config=LlmCallConfig(provider="p", model="m2"), tools=tools
    )
    session.append(
        "request/context", RequestContextData(provider="p", model="m2", context_window=1000)
    )
    assert session.request_context() == RequestContextData(
        provider="p", model="m2", context_window=1000
    )


def test_derivation_roles_and_empty_assistant_anchor() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user("u1"), surface_op="append")
    session.append("step/start", {"turn": 1, "step": 1})
    from .builders import call_block

    session.append(
        "assistant/message",
        assistant(1, 1, "a1", TextBlock(text="let me"), call_block("c1")),
        surface_op="append",
        source_event_seqs=[],
    )
    session.append(
        "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "bash", "arguments": "{}"}
    )
    session.append(
        "tool/result", tool_result(1, 1, "c1"), surface_op="append", source_event_seqs=[4]
    )
    session.append("assistant/message", assistant(1, 1, "a2"), surface_op="append")
    messages = session.derive_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert len(messages[1].content) == 2
    assert len(session.surface.nodes) == 4  # the empty anchor is a node that derives nothing
    snapshot = session.derive_messages()
    session.append("user/message", user("u2"), surface_op="append")
    assert len(snapshot) == 3  # an earlier result never grows
    assert len(session.derive_messages()) == 4
    with pytest.raises(AttributeError):
        snapshot[0].id = "x"  # type: ignore[misc]
    assert session.events[3].data.message is messages[1]  # shared, not copied


def test_completed_turn_helper_sanity() -> None:
    session = new_session()
    one_turn(session)
    assert session.events[-1].data.reason == CompletedReason()
    assert session.events[1].data == UserMessage(
        id="u1", content=(TextBlock(text="hi"),), source=UserSource()
    )


def test_typed_plugin_payloads_get_the_same_lossless_checks() -> None:
    class FrozenJsonProbe(Wire, frozen=True, kw_only=True):
        n: int
        ratio: float
        blob: FrozenJson

    undo = register_event_type("probe/typed", FrozenJsonProbe)
    try:
        session = new_session()
        ok = session.append("probe/typed", FrozenJsonProbe(n=1, ratio=0.5, blob={"a": [1]}))
        assert ok.data.blob == {"a": (1,)}
        bad_values: list[dict[str, Any]] = [
            {"n": 2**60},  # a bare int field: unsafe for JavaScript readers
            {"ratio": float("nan")},
            {"ratio": -0.0},
            {"blob": {"a": float("inf")}},
            {"blob": {1: "x"}},
            {"blob": {"s": {1}}},
        ]
        for changes in bad_values:
            fields: dict[str, Any] = {"n": 1, "ratio": 0.5, "blob": None, **changes}
            with pytest.raises(InvalidSessionEventError, match='"probe/typed" carries non-JSON'):
                session.append("probe/typed", FrozenJsonProbe(**fields))
        assert session.seq == 1
    finally:
        undo()
