"""Folds over a session's log that a step can read without rereading the log.

The log is the only source of truth, so a plugin that needs "the last policy switch" or
"are we inside a turn" derives it from ``session.events``. Scanning the log for it on every
step makes a step cost O(log) and a turn O(N²): the approval plugin's policy look-up, done
once a step by a backward scan, was 40 % of a 2,000-step turn. A :class:`LogFold` keeps the
answer per session and, on each read, folds in only the events appended since the last one.

It stays a pure function of the log: ``value(session)`` equals the same fold over the whole
of ``session.events`` from ``initial``, whatever was read before. That holds because a
session's events are an append-only list that is never rebuilt: a :class:`LogView`'s
``lineage`` names that list, and a snapshot of it never changes, so the state folded over its
first *n* events is the state of every later snapshot's first *n*. Anything else (a plain
sequence, a snapshot older than the one folded, a session that cannot be weakly referenced)
is folded from the start, every time: correct, only not incremental.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

from dsh_host._session.packed import PackedLog
from dsh_host._session.session import LogView

__all__ = ["HasEvents", "LogFold"]

_S = TypeVar("_S")


class HasEvents(Protocol):
    """What a fold reads: a session's event log (``Session.events``)."""

    @property
    def events(self) -> Sequence[Any]: ...


class _State(Generic[_S]):
    __slots__ = ("count", "lineage", "value")

    def __init__(self, lineage: object, value: _S) -> None:
        self.lineage = lineage
        self.count = 0
        self.value = value


class LogFold(Generic[_S]):
    """``step`` folded over a session's events from ``initial``, kept per session.

    ``step(state, event)`` must depend on nothing but its arguments (it is called once per
    event per session, in log order, never again for the same event). The states are held
    weakly by session: a disposed session's state goes with it.
    """

    __slots__ = ("_initial", "_states", "_step")

    def __init__(self, initial: _S, step: Callable[[_S, Any], _S]) -> None:
        self._initial = initial
        self._step = step
        self._states: weakref.WeakKeyDictionary[object, _State[_S]] = weakref.WeakKeyDictionary()

    def over(self, events: Iterable[Any]) -> _S:
        """The fold over ``events`` from the start (no state kept)."""
        value, step = self._initial, self._step
        for event in events:
            value = step(value, event)
        return value

    def value(self, session: HasEvents) -> _S:
        """The fold over ``session.events``; only the events new since the last read are
        visited when the session's log is the one read before."""
        events = session.events
        if type(events) is not LogView:
            return self.over(events)
        length = len(events)
        lineage = cast("list[Any] | PackedLog", events.lineage)
        try:
            state = self._states.get(session)
        except TypeError:  # not weakly referenceable: nothing to keep the state on
            return self.over(events)
        if state is None or state.lineage is not lineage:
            state = _State(lineage, self._initial)
            self._states[session] = state
        elif state.count > length:  # an older snapshot than the one folded: fold it apart
            return self.over(events)
        if state.count < length:
            # The view's backing list holds exactly the events of every longer snapshot. (A
            # slice copies only the new ones; islice would walk past the old ones one by one.)
            value, step = state.value, self._step
            new: Iterable[Any] = (
                lineage.walk(state.count, length)  # page by page, not a list (D37)
                if isinstance(lineage, PackedLog)
                else lineage[state.count : length]
            )
            for event in new:
                value = step(value, event)
            state.value, state.count = value, length
        return state.value
