"""LogFold: a fold over a session's log, kept per session, that folds each event once.

What it promises: ``value(session)`` always equals the same fold over the whole log from the
start (whatever was read before, for any snapshot), and a session's live log is folded
incrementally: each event is handed to ``step`` once, however many times the value is read.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from dsh_host._session import Session
from dsh_host._session.folds import LogFold

from .builders import new_session, one_turn


class Kinds:
    """A fold of the event types in log order, counting the events it was handed."""

    def __init__(self) -> None:
        self.visited = 0
        self.fold: LogFold[tuple[str, ...]] = LogFold((), self.step)

    def step(self, state: tuple[str, ...], event: Any) -> tuple[str, ...]:
        self.visited += 1
        return (*state, event.type)


def types(events: Sequence[Any]) -> tuple[str, ...]:
    return tuple(event.type for event in events)


def test_each_event_is_folded_once_however_often_the_value_is_read() -> None:
    session = new_session()
    kinds = Kinds()
    assert kinds.fold.value(session) == ()
    for turn in range(1, 11):
        one_turn(session, turn)
        for _ in range(3):
            assert kinds.fold.value(session) == types(session.events)
    assert kinds.visited == len(session.events)


def test_an_older_snapshot_is_folded_apart_and_the_live_state_is_kept() -> None:
    session = new_session()
    one_turn(session, 1)
    old = session.events
    one_turn(session, 2)
    kinds = Kinds()
    assert kinds.fold.value(session) == types(session.events)

    class Snapshot:
        events = old

    assert kinds.fold.value(Snapshot()) == types(old)  # not kept on the session's state
    before, folded = kinds.visited, len(session.events)
    one_turn(session, 3)
    assert kinds.fold.value(session) == types(session.events)
    assert kinds.visited - before == len(session.events) - folded  # only turn 3's events


def test_two_sessions_keep_their_own_state() -> None:
    first, second = new_session("a"), new_session("b")
    kinds = Kinds()
    one_turn(first, 1)
    assert kinds.fold.value(first) == types(first.events)
    one_turn(second, 1)
    one_turn(second, 2)
    assert kinds.fold.value(second) == types(second.events)
    assert kinds.fold.value(first) == types(first.events)
    assert kinds.visited == len(first.events) + len(second.events)


def test_a_plain_sequence_or_an_unreferenceable_holder_is_folded_from_the_start() -> None:
    session = new_session()
    one_turn(session, 1)
    kinds = Kinds()

    class Plain:  # a tuple, not a LogView: nothing says it only grows
        events = tuple(session.events)

    class Slotted:  # cannot be weakly referenced: nowhere to keep a state
        __slots__ = ()
        events = session.events

    for holder in (Plain(), Plain(), Slotted(), Slotted()):
        assert kinds.fold.value(holder) == types(session.events)
    assert kinds.visited == 4 * len(session.events)


def test_a_disposed_session_takes_its_state_with_it() -> None:
    kinds = Kinds()
    session: Session | None = new_session()
    assert session is not None
    one_turn(session, 1)
    kinds.fold.value(session)
    assert len(kinds.fold._states) == 1
    session = None
    gc.collect()
    assert len(kinds.fold._states) == 0
