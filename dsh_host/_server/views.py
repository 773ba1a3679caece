"""What the API says about a stored session: folds over its events, no I/O.

Everything here is recomputed from the log (the only source of truth), so any
worker that can read the store answers the same way; the summary itself is
:class:`~dsh_host._session.summary.SessionSummary`, shared with ``dsh sessions list``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsh_host._session.events import SessionEvent, event_to_builtins
from dsh_host._session.summary import SessionSummary

__all__ = ["event_json", "session_fields"]


def session_fields(summary: SessionSummary) -> dict[str, Any]:
    """The OpenAPI ``Session``'s fields but ``status`` (what runs now adds it)."""
    end = summary.last_turn_end
    return {
        "id": summary.id,
        "title": summary.title,
        "createdAt": summary.created_at,
        "updatedAt": summary.updated_at,
        "workspace": summary.workspace,
        "composition": summary.composition,
        "events": summary.events,
        "lastTurn": summary.last_turn,
        "lastTurnEnd": None if end is None else end.to_wire(),
        "usage": summary.usage.to_wire(),
    }


def event_json(event: SessionEvent) -> bytes:
    """One stored event in its wire form, as compact JSON."""
    return msgspec.json.encode(event_to_builtins(event))
