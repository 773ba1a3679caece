"""``session-persistence-memory``: session logs in process memory (``sessionPersistence``).

The session layer's :class:`~dsh_host._persistence.storage.MemoryStorage` as a plugin row:
every write-handle guarantee of the other backends (ownership, the window, the flush
barrier, resume through ``open(id, "write")``) except surviving the process. Rows that
name the same ``store`` share one storage, so two hosts of one process see the same
sessions (an embedding's resume, a test's second host). See README.md.
"""

from __future__ import annotations

import threading
from typing import Annotated

import msgspec

from dsh_host.sdk import (
    Context,
    MemoryStorage,
    Plugin,
    wire_storage,
)

__all__ = ["MemoryConfig", "SessionPersistenceMemory", "shared_store"]

_STORES: dict[str, MemoryStorage] = {}
_STORES_LOCK = threading.Lock()


def shared_store(name: str) -> MemoryStorage:
    """The process-wide in-memory storage called ``name`` (made on first use)."""
    with _STORES_LOCK:
        store = _STORES.get(name)
        if store is None:
            store = _STORES[name] = MemoryStorage()
        return store


class MemoryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``session-persistence-memory`` row."""

    #: Which process-wide store this row uses; rows with the same name share sessions.
    store: Annotated[str, msgspec.Meta(min_length=1)] = "default"


class SessionPersistenceMemory(Plugin):
    """Entry point ``session-persistence-memory``: provides ``sessionPersistence``."""

    name = "session-persistence-memory"
    provides = ("sessionPersistence",)
    inject = ("sessions",)
    Config = MemoryConfig

    def apply(self, ctx: Context, config: MemoryConfig) -> None:
        wire_storage(ctx, shared_store(config.store), name=self.name)
