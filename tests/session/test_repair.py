"""Crash repair: interrupted_turn_closers is pure and exact."""

from __future__ import annotations

import pytest

from dsh_host._session import (
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    InterruptedReason,
    Session,
    SessionEvent,
    TextBlock,
    decode_event,
    event_to_builtins,
    interrupted_turn_closers,
)

from .builders import assistant, call_block, new_session, one_turn, tool_call, tool_result, user
from .fixtures import EXPECTED, fixture_records, repairable_fixtures


@pytest.mark.parametrize("name", repairable_fixtures())
def test_closers_equal_the_reference_fixtures(name: str) -> None:
    expected = EXPECTED[name]
    events = [decode_event(line) for line in fixture_records(name)[: expected["recoveredEvents"]]]
    assert len(events) == expected["recoveredEvents"]
    closers = interrupted_turn_closers(events)
    assert [event_to_builtins(c) for c in closers] == expected["closers"]
    # Pure: the same input gives the same output, and the input is untouched.
    assert interrupted_turn_closers(events) == closers
    # The closers are valid appends: the balanced log restores and balances.
    balanced = Session.restore(
        {"version": 3, "id": "r", "createdAt": 1}, events + closers, mark_seed_end=False
    )
    assert interrupted_turn_closers(list(balanced.events)) == []


def test_constants_and_texts() -> None:
    assert TOOL_NOT_STARTED == "TOOL_NOT_STARTED"
    assert TOOL_OUTCOME_UNKNOWN == "TOOL_OUTCOME_UNKNOWN"
    assert TOOL_OUTCOME_UNKNOWN_TEXT.endswith("Do not retry blindly.")
    assert TOOL_NOT_STARTED_TEXT == (
        "The tool call was interrupted before the Harness recorded it as started. "
        "Retry it if it is still needed."
    )


def test_balanced_or_empty_logs_need_nothing() -> None:
    assert interrupted_turn_closers([]) == []
    session = new_session()
    one_turn(session)
    assert interrupted_turn_closers(list(session.events)) == []


def test_an_open_turn_without_a_step_gets_only_turn_end() -> None:
    session = new_session()
    one_turn(session)
    session.append("turn/start", {"turn": 2})
    session.append("user/message", user("u2"), surface_op="append")
    last = session.events[-1]
    closers = interrupted_turn_closers(list(session.events))
    assert [(c.type, c.seq, c.time) for c in closers] == [("turn/end", last.seq + 1, last.time)]
    assert closers[0].data.turn == 2
    assert closers[0].data.reason == InterruptedReason()


def test_an_open_step_gets_step_end_then_turn_end() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("step/start", {"turn": 1, "step": 2})
    closers = interrupted_turn_closers(list(session.events))
    assert [(c.type, c.seq) for c in closers] == [("step/end", 4), ("turn/end", 5)]
    assert (closers[0].data.turn, closers[0].data.step) == (1, 2)


def test_pending_calls_in_order_with_exact_codes_ids_and_provenance() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})  # 0
    session.append("step/start", {"turn": 1, "step": 1})  # 1
    session.append(
        "assistant/message",
        assistant(
            1, 1, "a", TextBlock(text="x"), call_block("b"), call_block("a"), call_block("done")
        ),
        surface_op="append",
    )  # 2
    session.append("tool/call", tool_call(1, 1, "a"))  # 3
    session.append("tool/call", tool_call(1, 1, "done"))  # 4
    session.append(
        "tool/result", tool_result(1, 1, "done"), surface_op="append", source_event_seqs=[4]
    )  # 5
    session.append("tool/call", tool_call(1, 1, "orphan"))  # 6: no assistant block
    closers = interrupted_turn_closers(list(session.events))
    assert [c.type for c in closers] == ["tool/result", "tool/result", "step/end", "turn/end"]
    not_started, unknown = closers[0], closers[1]
    assert not_started.data.message.source.call_id == "b"
    assert not_started.data.message.id == "interrupted-tool-result-b-7"
    assert not_started.data.error.code == TOOL_NOT_STARTED
    assert not_started.data.error.name == "ToolNotStartedError"
    assert not_started.data.message.content[0].content == (TextBlock(text=TOOL_NOT_STARTED_TEXT),)
    assert not_started.data.message.content[0].is_error is True
    assert "sourceEventSeqs" not in event_to_builtins(not_started)
    assert unknown.data.message.id == "interrupted-tool-result-a-8"
    assert unknown.data.error.code == TOOL_OUTCOME_UNKNOWN
    assert unknown.data.error.name == "ToolOutcomeUnknownError"
    assert unknown.source_event_seqs == (3,)
    assert unknown.surface_op == "append"
    assert unknown.data.message.content[0].content == (TextBlock(text=TOOL_OUTCOME_UNKNOWN_TEXT),)
    assert {c.time for c in closers} == {session.events[-1].time}
    # Appending the closers balances the log and the transcript pairs every call.
    for closer in closers:
        session.append(
            closer.type,
            closer.data,
            surface_op=closer.surface_op or None,
            source_event_seqs=closer.source_event_seqs or None,
        )
    assert interrupted_turn_closers(list(session.events)) == []
    roles = [m.role for m in session.derive_messages()]
    assert roles == ["assistant", "user", "user", "user"]


def test_calls_of_a_closed_step_in_the_open_turn_are_repaired() -> None:
    # D18: a log that closed a step with a call unanswered (older dsh on SIGINT did) must
    # not keep that call open forever: the next model request would carry a tool call with
    # no tool message, which OpenAI-compatible providers reject with HTTP 400.
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append(
        "assistant/message",
        assistant(1, 1, "a", call_block("old"), call_block("never")),
        surface_op="append",
    )
    session.append(
        "tool/call", {"turn": 1, "step": 1, "callId": "old", "name": "t", "arguments": "{}"}
    )
    session.append("step/end", {"turn": 1, "step": 1})  # unanswered, but the step closed
    session.append("step/start", {"turn": 1, "step": 2})
    closers = interrupted_turn_closers(list(session.events))
    assert [c.type for c in closers] == ["tool/result", "tool/result", "step/end", "turn/end"]
    unknown, not_started = closers[0].data, closers[1].data
    assert (unknown.step, unknown.message.source.call_id, unknown.error.code) == (
        1,
        "old",
        "TOOL_OUTCOME_UNKNOWN",
    )
    assert closers[0].source_event_seqs == (3,)  # cites its durable tool/call
    assert (not_started.message.source.call_id, not_started.error.code) == (
        "never",
        "TOOL_NOT_STARTED",
    )
    assert closers[2].data.step == 2


def test_calls_of_closed_turns_are_not_repaired() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append(
        "assistant/message", assistant(1, 1, "a", call_block("old")), surface_op="append"
    )
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    session.append("turn/start", {"turn": 2})
    closers = interrupted_turn_closers(list(session.events))
    assert [c.type for c in closers] == ["turn/end"]


def test_closers_do_not_mutate_their_input() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    events: list[SessionEvent] = list(session.events)
    interrupted_turn_closers(events)
    assert events == list(session.events)


# --- approval events as evidence (D19) ----------------------------------------------------


def _gated_call(session: Session, call_id: str, *, stage: bool = True) -> str:
    """A call whose tool/call is durable and whose pre-execute approval was asked."""
    session.append("tool/call", tool_call(1, 1, call_id))
    asked: dict[str, object] = {"id": f"ask-{call_id}", "toolName": "bash", "callId": call_id}
    if stage:
        asked["stage"] = "pre-execute"
    session.append("approval/asked", asked)
    return f"ask-{call_id}"


def _open_step(session: Session, *call_ids: str) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    blocks = [call_block(c) for c in call_ids]
    session.append("assistant/message", assistant(1, 1, "a1", *blocks), surface_op="append")


def _codes(closers: list[SessionEvent]) -> dict[str, str]:
    return {
        c.data.message.source.call_id: c.data.error.code
        for c in closers
        if c.type == "tool/result"
    }


def test_an_asked_but_undecided_call_cannot_have_run() -> None:
    """tool/call durable, pre-execute approval asked, never decided → NOT_STARTED (D19)."""
    session = new_session()
    _open_step(session, "c1")
    _gated_call(session, "c1")
    closers = interrupted_turn_closers(list(session.events))
    assert _codes(closers) == {"c1": TOOL_NOT_STARTED}
    assert closers[0].data.message.content[0].content[0].text == TOOL_NOT_STARTED_TEXT


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        ("rejected", TOOL_NOT_STARTED),
        ("cancelled", TOOL_NOT_STARTED),
        ("unavailable", TOOL_NOT_STARTED),
        # the checkpoint flush before the body follows the decision: it may have started
        ("allowed-once", TOOL_OUTCOME_UNKNOWN),
    ],
)
def test_a_decided_gate_says_whether_the_body_may_have_started(outcome: str, code: str) -> None:
    session = new_session()
    _open_step(session, "c1")
    ask = _gated_call(session, "c1")
    session.append("approval/decided", {"id": ask, "outcome": outcome})
    assert _codes(interrupted_turn_closers(list(session.events))) == {"c1": code}


def test_an_ask_without_the_pre_execute_stage_is_no_evidence() -> None:
    """An escalation ask comes from inside a running body: conservative, outcome unknown."""
    session = new_session()
    _open_step(session, "c1")
    _gated_call(session, "c1", stage=False)
    assert _codes(interrupted_turn_closers(list(session.events))) == {"c1": TOOL_OUTCOME_UNKNOWN}


# --- a front-door tool guardrail's gate as evidence (D23) ------------------------------------


def _guarded(session: Session, call_id: str, *names: str) -> None:
    session.append("tool/call", tool_call(1, 1, call_id))
    gate = {"turn": 1, "callId": call_id, "guardrails": list(names)}
    session.append("guardrail/asked", gate, ignorable=True)


def _verdict(session: Session, call_id: str, name: str, *, tripped: bool) -> None:
    verdict = {"turn": 1, "kind": "tool", "name": name, "tripwireTriggered": tripped}
    session.append("guardrail/verdict", {**verdict, "callId": call_id}, ignorable=True)


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ((), TOOL_NOT_STARTED),  # killed while the first guardrail deliberated
        ((("a", False),), TOOL_NOT_STARTED),  # the second had not passed it
        ((("a", True),), TOOL_NOT_STARTED),  # tripped: denied, the body never runs
        ((("a", False), ("b", False)), TOOL_OUTCOME_UNKNOWN),  # all passed: it may have run
    ],
)
def test_a_guardrail_gate_says_whether_the_body_may_have_started(
    verdicts: tuple[tuple[str, bool], ...], code: str
) -> None:
    """tool/call and guardrail/asked durable: the body may have started only once every
    guardrail the gate names durably passed it (D23)."""
    session = new_session()
    _open_step(session, "c1")
    _guarded(session, "c1", "a", "b")
    for name, tripped in verdicts:
        _verdict(session, "c1", name, tripped=tripped)
    assert _codes(interrupted_turn_closers(list(session.events))) == {"c1": code}


def test_a_verdict_for_another_call_is_no_evidence() -> None:
    session = new_session()
    _open_step(session, "c1", "c2")
    _guarded(session, "c1", "a")
    _verdict(session, "c2", "a", tripped=False)
    session.append("tool/call", tool_call(1, 1, "c2"))
    assert _codes(interrupted_turn_closers(list(session.events))) == {
        "c1": TOOL_NOT_STARTED,
        "c2": TOOL_OUTCOME_UNKNOWN,
    }


def _awaiting(session: Session, *call_ids: str) -> list[str]:
    """Turn 1 defers ``call_ids`` and ends awaiting-approval; returns their ask ids."""
    _open_step(session, *call_ids)
    asks = [_gated_call(session, c) for c in call_ids]
    session.append("step/end", {"turn": 1, "step": 1})
    session.append(
        "turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "callIds": list(call_ids)}}
    )
    return asks


def test_calls_awaiting_approval_are_pending_not_crashed() -> None:
    session = new_session()
    asks = _awaiting(session, "c1", "c2")
    assert interrupted_turn_closers(list(session.events)) == []
    session.append("approval/decided", {"id": asks[0], "outcome": "allowed-once"})
    assert interrupted_turn_closers(list(session.events)) == []


def test_a_continued_turn_carries_the_pending_calls() -> None:
    """Crash while a continued turn applies decisions: a fresh tool/call is the start evidence."""
    session = new_session()
    asks = _awaiting(session, "c1", "c2")
    for ask in asks:
        session.append("approval/decided", {"id": ask, "outcome": "allowed-once"})
    session.append("turn/start", {"turn": 2})
    # crash before step 1: allowed but never started
    closers = interrupted_turn_closers(list(session.events))
    assert _codes(closers) == {"c1": TOOL_NOT_STARTED, "c2": TOOL_NOT_STARTED}
    session.append("step/start", {"turn": 2, "step": 1})
    session.append("tool/call", tool_call(2, 1, "c1"))
    closers = interrupted_turn_closers(list(session.events))
    assert _codes(closers) == {"c1": TOOL_OUTCOME_UNKNOWN, "c2": TOOL_NOT_STARTED}
    assert all(c.data.turn == 2 and c.data.step == 1 for c in closers if c.type == "tool/result")
    assert [c.type for c in closers][-2:] == ["step/end", "turn/end"]
    session.append("tool/result", tool_result(2, 1, "c1"), surface_op="append")
    assert _codes(interrupted_turn_closers(list(session.events))) == {"c2": TOOL_NOT_STARTED}
    # the closers are valid appends: the balanced log balances
    balanced = Session.restore(
        {"version": 3, "id": "r", "createdAt": 1},
        [*session.events, *interrupted_turn_closers(list(session.events))],
        mark_seed_end=False,
    )
    assert interrupted_turn_closers(list(balanced.events)) == []


def test_a_turn_that_did_not_end_awaiting_carries_nothing() -> None:
    session = new_session()
    _open_step(session, "c1")
    _gated_call(session, "c1")
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    session.append("turn/start", {"turn": 2})
    assert _codes(interrupted_turn_closers(list(session.events))) == {}
