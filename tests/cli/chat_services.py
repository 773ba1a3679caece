"""A ``compaction`` service and a ``tokenMeter`` service as ``dsh chat`` calls them.

Until a compaction plugin ships, the chat's ``/compact`` and ``/usage`` are tested against
this plugin, mounted as row ``chat_services:ChatServices`` (``tests/cli`` on ``PYTHONPATH``):
``compact_now(agent, signal)`` (DSH's ``compactNow(agent, signal)``) appends nothing and
says how many history items it would replace; ``measure(session)`` prices the session's
messages at four characters per token, DSH's token-meter heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsh_host import Context, NoConfig, Plugin
from dsh_host.cli.render import blocks_text


@dataclass(frozen=True)
class Measure:
    total_tokens: int
    surface_tokens: int


class Meter:
    def measure(self, session: Any) -> Measure:
        text = "".join(blocks_text(m.content) for m in session.derive_messages())
        return Measure(total_tokens=len(text) // 4 + 1, surface_tokens=len(text) // 4)


class Compaction:
    async def compact_now(self, agent: Any, signal: Any) -> str:
        assert not signal.aborted
        items = len(agent.session.derive_messages())
        return f"{items} history items in session {agent.id} (nothing replaced)"


class ChatServices(Plugin):
    name = "chat-services"
    provides = ("compaction", "tokenMeter")
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        ctx.provide("compaction", Compaction())
        ctx.provide("tokenMeter", Meter())
