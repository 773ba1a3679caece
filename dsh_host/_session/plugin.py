"""The ``sessions`` plugin: provides ``ctx.sessions`` (a :class:`SessionStore`).

The store dispatches through this plugin's context: ``session/created``,
``session/event`` and ``session/disposed`` with ``ctx.emit`` (each listener's
failure contained), and ``session/flush`` with ``ctx.parallel`` (all listeners
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

        bus = ctx.host.bus
        store = SessionStore(
            emit=ctx.emit,
            parallel=ctx.parallel,
            listener_count=lambda name: len(bus.listeners(name)),
        )
        ctx.provide(SESSIONS, store)
        ctx.effect(store.close, "close session store")
