"""The ``tools`` plugin: provides the :class:`~dsh_host._tools.runtime.ToolRuntime` service."""

from __future__ import annotations

from dsh_host._context import Context
from dsh_host._plugin import NoConfig, Plugin

from .keys import TOOLS, TOOLS_EVENTS
from .runtime import ToolRuntime

__all__ = ["ToolsPlugin"]


class ToolsPlugin(Plugin):
    """Service ``tools``: tool registration, guards and the non-bypassable call pipeline.

    Declares the pipeline's events (``tools/pre-execute``, ``tools/execute``,
    ``tools/post-execute``, ``tools/result``) and ``tools/change`` (EMIT, no
    arguments, emitted whenever a tool is registered or unregistered); their
    keys are in :mod:`dsh_host._tools.keys`.
    """

    name = "tools"
    provides = ("tools",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        for event in TOOLS_EVENTS:
            ctx.declare_event(event)
        ctx.provide(TOOLS, ToolRuntime(ctx))
