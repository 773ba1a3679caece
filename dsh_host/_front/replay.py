"""``dsh_host.replay``: the harness replay of a stored session, for a test (D32).

An application builds its :class:`~.agent.Agent` the way it runs it (model, tools, instructions,
composition, store); ``await replay(agent, session_id)`` derives each model request of the stored
session again with that agent's composition and compares it with the log, without calling the
model or writing anything. ``dsh replay ID --same-model`` is the same comparison from the
command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._agent.harness import HarnessReport, harness_replay

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["replay"]


async def replay(agent: Agent, session_id: str) -> HarnessReport:
    """Re-derive every model request of the stored ``session_id`` with ``agent``'s composition.

    ``report.identical`` is True when each request is derived as recorded; otherwise
    ``report.differences`` names the turn, step and part (system prompt, tool schemas, runtime
    context, request config, messages) with a short diff, and ``str(report)`` says it all, so
    ``assert report.identical, report`` is a test. Call it inside ``async with agent``.
    """
    return await harness_replay(agent.host.ctx, session_id)
