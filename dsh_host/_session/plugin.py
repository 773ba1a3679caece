"""The ``sessions`` plugin: provides ``ctx.sessions`` (a :class:`SessionStore`).

The store dispatches on the host's event bus (what ``ctx.emit`` and ``ctx.parallel``
call): ``session/created``, ``session/event`` and ``session/disposed`` as emits (each
listener's failure contained), and ``session/flush`` in parallel (all listeners
awaited, first failure re-raised). When the plugin is disposed, every live
session is detached (``session/disposed`` for each, newest first).
"""

from __future__ import annotations

from dsh_host._context import Context
from dsh_host._plugin import NoConfig, Plugin
from dsh_host._session.keys import SESSION_EVENTS, SESSIONS

__all__ = ["SessionsPlugin"]


class SessionsPlugin(Plugin):
    """Entry point ``sessions``: the in-memory session store service."""

    name = "sessions"
    provides = ("sessions",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        for event in SESSION_EVENTS:
            ctx.declare_event(event)
        # here: resolving this row (a listing does) loads no store (docs/decisions.md D44)
        from dsh_host._session.store import SessionStore

        # The bus's own dispatch, not the context's: the store dispatches by name with
        # positional arguments only, so ``Context``'s keyword check and its frame (three
        # barriers and every append of a step) guard nothing here (docs/decisions.md D50).
        bus = ctx.host.bus
        store = SessionStore(
            emit=bus.emit,
            parallel=bus.parallel,
            listener_count=bus.listener_count,
        )
        ctx.provide(SESSIONS, store)
        ctx.effect(store.close, "close session store")
