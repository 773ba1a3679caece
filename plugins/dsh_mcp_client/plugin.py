"""The ``mcp-client`` plugin row: one MCP server, its tools as ``mcp__<serverName>__<tool>``."""

from __future__ import annotations

import os
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from dsh_host.context import Context, Host
from dsh_host.plugin import Plugin
from dsh_host.tools.types import Ask, Deny, PreToolDecision, ToolExecution

from .bridge import ServerBridge
from .config import McpClientConfig, McpClientConfigError

__all__ = ["McpClient"]

#: serverNames of the live rows, per host: a duplicate fails the later row at load.
_LIVE_NAMES: weakref.WeakKeyDictionary[Host, set[str]] = weakref.WeakKeyDictionary()


class McpClient(Plugin):
    """Entry point ``mcp-client``: connect one MCP server and register its tools.

    ``apply`` starts the connection supervisor in the background; the first step of every
    step waits (through ``agent/pre-step``) until the initial connection settled, so
    the model's first request already lists the server's tools. A tool the server annotates
    ``destructiveHint: true`` asks for approval (``askDestructive``, default on) through the
    ordinary ``tools/pre-execute`` chain, where ``tool-rules`` rows apply to ``mcp__*`` names
    like to any other tool.
    """

    name = "mcp-client"
    inject = ("tools",)
    Config = McpClientConfig
    executable_keys = ("command", "args", "env", "cwd")

    def apply(self, ctx: Context, config: McpClientConfig) -> None:
        live = _LIVE_NAMES.setdefault(ctx.host, set())
        if config.server_name in live:
            raise McpClientConfigError(
                f"mcp-client: serverName {config.server_name!r} is already used by another live "
                "mcp-client row; give each server its own serverName"
            )
        workspace = os.path.abspath(os.path.realpath(os.path.expanduser(config.workspace)))
        if not os.path.isdir(workspace):
            raise McpClientConfigError(
                f"mcp-client({config.server_name}): workspace {config.workspace!r} resolves to "
                f"{workspace}, which is not an existing directory"
            )
        live.add(config.server_name)
        ctx.effect(lambda: live.discard(config.server_name), "mcp-client server name")
        bridge = ServerBridge(ctx, config, workspace)
        self.bridge = bridge
        ctx.effect(bridge.aclose, f"mcp-client({config.server_name}) connection")

        async def ready(step: Any, next_: Callable[[], Awaitable[Any]]) -> Any:
            await bridge.wait_started()
            return await next_()

        ctx.on("agent/pre-step", ready)

        if config.ask_destructive:

            async def gate(
                execution: ToolExecution, next_: Callable[[], Awaitable[PreToolDecision]]
            ) -> PreToolDecision:
                inner = await next_()
                if not bridge.is_destructive(execution.name) or isinstance(inner, Deny):
                    return inner
                if isinstance(inner, Ask):
                    return inner
                return Ask(
                    f'MCP server "{config.server_name}" marks this tool destructive '
                    "(destructiveHint)"
                )

            ctx.on("tools/pre-execute", gate)
        ctx.start_soon(bridge.run, name=f"mcp-client({config.server_name}) supervisor")
