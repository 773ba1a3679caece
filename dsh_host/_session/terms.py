"""A session's run terms in its log: the ``run/terms`` events (see :class:`RunTerms`).

The log says what happened; these events say *how the session runs*: its model route, workspace,
sandbox mode and network, approval policy and what an unanswered ask becomes, and the identity
of the composition it runs under. Every entry point that continues a session reads them here
and continues under them (``dsh_host._front.runner`` decides; this module only reads and writes).

``run/terms`` is not one of DSH's event types, so it is always written ``ignorable: true``: DSH
keeps such a record without interpreting it and reads the rest of the log as usual, so a log with
terms stays a DSH v3 log. The session header is not used: DSH's header admission refuses keys it
does not know, and the header cannot change, while an explicit override on a later command must
be recorded too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from dsh_host._session.events import SessionEvent
from dsh_host._session.events.data import RunTerms
from dsh_host._session.packed import packed_under

if TYPE_CHECKING:
    from dsh_host._session.session import Session

__all__ = ["TERMS_EVENT", "record_terms", "recorded_terms"]

#: The event type of a terms record.
TERMS_EVENT: Final = "run/terms"


def recorded_terms(events: Iterable[SessionEvent]) -> RunTerms | None:
    """The terms in force: the last ``run/terms`` record, or None (the session predates them).

    A session's packed log (docs/decisions.md D46) knows where its last ``run/terms`` is: it
    is read alone, not after a walk of the whole log (a resume reads the terms before it boots).
    """
    under = packed_under(events)
    if under is not None:
        log, stop = under
        at = log.last_of(TERMS_EVENT, stop)
        while at is not None:
            data = log[at].data
            if isinstance(data, RunTerms):
                return data
            at = log.last_of(TERMS_EVENT, at)
        return None
    found: RunTerms | None = None
    for event in events:
        if event.type == TERMS_EVENT and isinstance(event.data, RunTerms):
            found = event.data
    return found


def record_terms(session: Session, terms: RunTerms) -> SessionEvent:
    """Append ``terms`` to ``session`` (ignorable, so DSH still reads the log)."""
    return session.append(TERMS_EVENT, terms, ignorable=True)
