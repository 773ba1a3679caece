"""The events the session layer dispatches: one typed key each.

The ``sessions`` plugin declares them on the bus (undone when it is unloaded);
its :class:`~dsh_host._session.store.SessionStore` dispatches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._bus import Emit, EventSpec, Parallel
from dsh_host._context import ServiceKey

if TYPE_CHECKING:
    from .compaction import CompactionEngine, ResultPruner
    from .events import SessionEvent
    from .session import Session
    from .store import SessionStore
    from .tokens import TokenMeter

__all__ = [
    "COMPACTION",
    "SESSIONS",
    "SESSION_CREATED",
    "SESSION_DISPOSED",
    "SESSION_EVENT",
    "SESSION_EVENTS",
    "SESSION_FLUSH",
    "TELEMETRY",
    "TOKEN_METER",
    "TOOL_RESULT_PRUNER",
]

#: The ``sessions`` service (the ``sessions`` plugin's store).
SESSIONS: ServiceKey[SessionStore] = ServiceKey("sessions")
#: prices and measures requests (``token-meter``); absent, readers build a catalogue-only meter
TOKEN_METER: ServiceKey[TokenMeter] = ServiceKey("tokenMeter")
#: the compaction backend (``compaction-basic``)
COMPACTION: ServiceKey[CompactionEngine] = ServiceKey("compaction")
#: the optional tool-result pruner a compaction engine consults
TOOL_RESULT_PRUNER: ServiceKey[ResultPruner] = ServiceKey("toolResultPruner")
#: a trace exporter (``telemetry-otel``); nothing in the host calls it, so it is opaque here
TELEMETRY: ServiceKey[object] = ServiceKey("telemetry")

SESSION_EVENT: Emit[[Session, SessionEvent]] = Emit(
    "session/event", 2, "(session, event) after every append"
)
SESSION_CREATED: Emit[[Session]] = Emit("session/created", 1, "(session) when the store adds one")
SESSION_DISPOSED: Emit[[Session]] = Emit(
    "session/disposed", 1, "(session) when the store drops one"
)
SESSION_FLUSH: Parallel[[Session]] = Parallel(
    "session/flush", 1, "(session) the durability barrier"
)

#: Everything the ``sessions`` plugin declares.
SESSION_EVENTS: tuple[EventSpec, ...] = (
    SESSION_EVENT,
    SESSION_CREATED,
    SESSION_DISPOSED,
    SESSION_FLUSH,
)
