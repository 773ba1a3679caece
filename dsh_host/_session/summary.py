"""The summary of a stored session: what a listing says about it, read from its log.

One owner for every listing: ``dsh sessions list`` (its rows and ``--json``) and ``dsh serve``
(the OpenAPI ``Session``) both fold a stored session through :meth:`SessionSummary.of` and only
render the result in their own shape. Before, each computed its own: titles clipped at 60
characters in one and 80 in the other, the last turn's end a bare kind in one and
``{turn, kind, code, message}`` in the other, computed from different event sequences.

Everything here is a fold over events already read (no I/O), so any process that can read the
store summarises a session the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from dsh_host._session.events import SessionEvent, event_to_builtins, to_builtins
from dsh_host._session.events.data import RunTerms
from dsh_host._session.messages import TextBlock, UserSource
from dsh_host._session.prices import PriceTable
from dsh_host._session.terms import TERMS_EVENT
from dsh_host._session.usage import UsageLedger, UsageTotals

if TYPE_CHECKING:
    from dsh_host._session.header import SessionHeader

__all__ = [
    "TITLE_CHARS",
    "LoadedLog",
    "SessionSummary",
    "SummaryFold",
    "TurnEnd",
    "last_turn",
    "last_turn_end",
    "title",
]

#: A title is the first prompt on one line, at most this many characters (the last one ``…``
#: when it was cut). A terminal listing may cut it further to fit its column.
TITLE_CHARS: Final = 80


def title(events: Iterable[SessionEvent]) -> str | None:
    """The session's first prompt on one line, clipped to :data:`TITLE_CHARS`: what people
    recognise it by (None: no prompt yet)."""
    for event in events:
        if event.type == "user/message" and isinstance(event.data.source, UserSource):
            text = " ".join(
                "".join(b.text for b in event.data.content if isinstance(b, TextBlock)).split()
            )
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return None


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How a turn ended: its number, the reason's kind, and the error's code and message when
    the reason carries them."""

    turn: Any
    kind: Any
    code: Any = None
    message: Any = None

    def to_wire(self) -> dict[str, Any]:
        """``{turn, kind}`` plus ``code`` / ``message`` when present (the API's shape)."""
        out: dict[str, Any] = {"turn": self.turn, "kind": self.kind}
        if self.code is not None:
            out["code"] = self.code
        if self.message is not None:
            out["message"] = self.message
        return out


def last_turn_end(events: Sequence[SessionEvent]) -> TurnEnd | None:
    """The end of the last ``turn/end`` in ``events`` (None: no turn ended)."""
    for event in reversed(events):
        if event.type != "turn/end":
            continue
        data = event_to_builtins(event)["data"]
        reason = data.get("reason") if isinstance(data, dict) else None
        turn = data.get("turn") if isinstance(data, dict) else None
        if not isinstance(reason, dict):
            return TurnEnd(turn, "unknown")
        found = reason.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        return TurnEnd(
            turn,
            reason.get("kind"),
            error.get("code") or reason.get("code"),
            error.get("message") or reason.get("message"),
        )
    return None


def last_turn(events: Sequence[SessionEvent]) -> int:
    """The number of the last turn started (0 before the first)."""
    for event in reversed(events):
        if event.type == "turn/start":
            turn = to_builtins(event.data).get("turn")
            return turn if isinstance(turn, int) else 0
    return 0


class LoadedLog(Protocol):
    """What a summary reads of a loaded session (the persistence layer's ``SessionLoad``)."""

    @property
    def header(self) -> SessionHeader: ...
    @property
    def events(self) -> Sequence[SessionEvent]: ...
    @property
    def closers(self) -> Sequence[SessionEvent]: ...


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """What a listing shows of one stored session (see the module docstring)."""

    id: str
    created_at: int
    #: the time of the last stored event (epoch ms), else the creation time
    updated_at: int
    workspace: str | None
    composition: str | None
    #: how many events are stored
    events: int
    title: str | None
    #: the number of the last turn started (0 before the first)
    last_turn: int
    #: how the last stored turn ended
    last_turn_end: TurnEnd | None
    #: a turn was left open by a process that stopped (the read added closers)
    interrupted: bool
    #: the ``turn/end`` among the closers a resume appends, else None
    repair_turn_end: TurnEnd | None
    #: tokens and cost of every billed call, priced with the table the summary was made with
    usage: UsageTotals

    @property
    def ended(self) -> TurnEnd | None:
        """How the last turn ended, or will have ended once a resume repairs the log."""
        return self.repair_turn_end or self.last_turn_end

    @classmethod
    def of(cls, load: LoadedLog, prices: PriceTable | None = None) -> SessionSummary:
        """Summarise ``load`` (usage priced with ``prices``, else the default table)."""
        fold = SummaryFold(prices)
        fold.feed(load.events)
        return fold.summary(load.header, load.closers)


class SummaryFold:
    """:meth:`SessionSummary.of`'s folds, fed the log in order a page at a time, keeping only
    what a summary needs: counts, the title, the last turn's start and end, the usage ledger,
    and the events of the last ended turn and after it (what :func:`~dsh_host._session.approvals.
    pending_approvals` reads). A reader that walks a 100k-event log holds a page and these (D33).
    """

    def __init__(self, prices: PriceTable | None = None) -> None:
        self.ledger = UsageLedger(prices if prices is not None else PriceTable())
        self.count = 0
        self.last_time: int | None = None
        self.title: str | None = None
        self.last_turn_start: SessionEvent | None = None
        self.last_turn_end: SessionEvent | None = None
        #: the terms in force: the last ``run/terms`` record's (None: none seen)
        self.terms: RunTerms | None = None
        #: the events from the ``turn/start`` of the last ended turn on (all of them, before a
        #: turn ended), one list a turn
        self._turns: list[list[SessionEvent]] = [[]]

    def feed(self, events: Iterable[SessionEvent]) -> None:
        turns = self._turns
        for event in events:
            self.count += 1
            self.last_time = event.time
            self.ledger.feed(event)
            kind = event.type
            if kind == "turn/start":
                self.last_turn_start = event
                turns.append([])
            elif kind == "user/message" and self.title is None:
                self.title = title((event,))
            elif kind == TERMS_EVENT and isinstance(event.data, RunTerms):
                self.terms = event.data
            turns[-1].append(event)
            if kind == "turn/end":
                self.last_turn_end = event
                del turns[:-1]

    @property
    def turn_open(self) -> bool:
        """The last turn started has no end (a resume would append closers)."""
        start, end = self.last_turn_start, self.last_turn_end
        return start is not None and (end is None or end.seq < start.seq)

    def last_events(self) -> list[SessionEvent]:
        """The events of the last ended turn and after it."""
        return [event for turn in self._turns for event in turn]

    def summary(
        self, header: SessionHeader, closers: Sequence[SessionEvent] = ()
    ) -> SessionSummary:
        """The summary of the log fed so far; ``closers``: what a read added for an open turn."""
        return SessionSummary(
            id=header.id,
            created_at=header.created_at,
            updated_at=self.last_time if self.last_time is not None else header.created_at,
            workspace=header.cwd if isinstance(header.cwd, str) else None,
            composition=header.agent_preset if isinstance(header.agent_preset, str) else None,
            events=self.count,
            title=self.title,
            last_turn=last_turn([self.last_turn_start] if self.last_turn_start else []),
            last_turn_end=last_turn_end([self.last_turn_end] if self.last_turn_end else []),
            interrupted=bool(closers),
            repair_turn_end=last_turn_end(closers),
            usage=self.ledger.usage,
        )
