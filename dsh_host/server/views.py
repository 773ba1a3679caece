"""What the API says about a stored session: folds over its events, no I/O.

Everything here is recomputed from the log (the only source of truth), so any
worker that can read the store answers the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from dsh_host.session.events import SessionEvent, event_to_builtins, to_builtins
from dsh_host.session.messages import TextBlock, UserSource
from dsh_host.session.prices import PriceTable
from dsh_host.session.usage import USAGE_KEYS, UsageLedger

__all__ = [
    "TITLE_CHARS",
    "USAGE_KEYS",
    "last_turn",
    "last_turn_end",
    "title",
    "updated_at",
    "usage",
]

TITLE_CHARS: Final = 80


def title(events: Sequence[SessionEvent]) -> str | None:
    """The session's first prompt on one line, clipped: what people recognise it by."""
    for event in events:
        if event.type == "user/message" and isinstance(event.data.source, UserSource):
            text = " ".join(
                "".join(b.text for b in event.data.content if isinstance(b, TextBlock)).split()
            )
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return None


def usage(events: Sequence[SessionEvent], prices: PriceTable | None = None) -> dict[str, Any]:
    """Usage and cost of every billed call of the session (the token meter's ledger)."""
    ledger = UsageLedger(prices if prices is not None else PriceTable())
    for event in events:
        ledger.feed(event)
    return ledger.usage.to_wire()


def last_turn(events: Sequence[SessionEvent]) -> int:
    """The number of the last turn started (0 before the first)."""
    for event in reversed(events):
        if event.type == "turn/start":
            turn = to_builtins(event.data).get("turn")
            return turn if isinstance(turn, int) else 0
    return 0


def last_turn_end(events: Sequence[SessionEvent]) -> dict[str, Any] | None:
    """``{turn, kind}`` of the last ``turn/end`` (plus ``code`` / ``message`` when it has them)."""
    for event in reversed(events):
        if event.type != "turn/end":
            continue
        data = event_to_builtins(event)["data"]
        reason = data.get("reason") if isinstance(data, dict) else None
        if not isinstance(reason, dict):
            return {"turn": data.get("turn"), "kind": "unknown"}
        out: dict[str, Any] = {"turn": data.get("turn"), "kind": reason.get("kind")}
        found = reason.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        for key in ("code", "message"):
            value = error.get(key) or reason.get(key)
            if value is not None:
                out[key] = value
        return out
    return None


def updated_at(events: Sequence[SessionEvent], created_at: int) -> int:
    """The time of the last event (epoch ms), else the creation time."""
    return events[-1].time if events else created_at


def event_json(event: SessionEvent) -> bytes:
    """One stored event in its wire form, as compact JSON."""
    return msgspec.json.encode(event_to_builtins(event))
