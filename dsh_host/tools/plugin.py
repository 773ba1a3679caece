"""The ``tools`` plugin: provides the :class:`~dsh_host.tools.runtime.ToolRuntime` service."""

from __future__ import annotations

from dsh_host.bus import EventMode
from dsh_host.context import Context
from dsh_host.plugin import NoConfig, Plugin

from .runtime import ToolRuntime

__all__ = ["ToolsPlugin"]


class ToolsPlugin(Plugin):
    """Service ``tools``: tool registration, guards and the non-bypassable call pipeline.

    The pipeline's events (``tools/pre-execute``, ``tools/execute``,
    ``tools/post-execute``, ``tools/result``) are declared by the host; this
    plugin adds ``tools/change`` (EMIT, no arguments), emitted whenever a tool
    is registered or unregistered.
    """

    name = "tools"
    provides = ("tools",)
    Config = NoConfig

    def apply(self, ctx: Context, config: NoConfig) -> None:
        ctx.declare_event("tools/change", EventMode.EMIT, 0)
        ctx.provide("tools", ToolRuntime(ctx))
