"""The ``mcp-client`` plugin row: one MCP server, its tools as ``mcp__<serverName>__<tool>``."""

from __future__ import annotations

import os
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from dsh_host.context import Context, Host
from dsh_host.plugin import Plugin
from dsh_host.sandbox import SandboxPolicy, confined_writable_roots, harness_state_conflict
from dsh_host.tools.types import Ask, Deny, PreToolDecision, ToolExecution

from .bridge import ServerBridge, check_command
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
        refuse_writable_harness_state(ctx, config, workspace)
        if config.transport == "stdio":
            check_command(config, workspace)
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


def refuse_writable_harness_state(ctx: Context, config: McpClientConfig, workspace: str) -> None:
    """A ``workspace-write`` server may write what a ``workspace-write`` bash call may: refuse the
    row when that reaches the session log or the user's dsh configuration, as ``builtin-tools``
    refuses its own (``read-only`` writes nothing; ``danger-full-access`` is no sandbox)."""
    if config.transport != "stdio" or config.sandbox != "workspace-write":
        return
    writable = [(workspace, f"the workspace of mcp-client row {ctx.row_id!r}")]
    sandbox = ctx.get("sandbox")
    if sandbox is not None:
        policy = SandboxPolicy(mode="workspace-write", workspace_root=workspace)
        writable += [
            (os.path.abspath(os.path.realpath(path)), "writable by the server in workspace-write")
            for path in confined_writable_roots(sandbox, policy)
            if os.path.isdir(path)
        ]
    store = ctx.get("sessionPersistence")
    root = getattr(store, "root", None)
    problem = harness_state_conflict(
        root if isinstance(root, str) else None,
        writable,
        who=f"mcp-client({config.server_name})",
        actor="the MCP server",
        elsewhere="give the row another `workspace`",
    )
    if problem is not None:
        raise McpClientConfigError(problem)
