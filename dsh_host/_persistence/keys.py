"""The persistence layer's service key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._context import ServiceKey

if TYPE_CHECKING:
    from .persistence import SessionPersistence

__all__ = ["SESSION_PERSISTENCE"]

#: The ``sessionPersistence`` service (a persistence plugin's backend).
SESSION_PERSISTENCE: ServiceKey[SessionPersistence] = ServiceKey("sessionPersistence")
