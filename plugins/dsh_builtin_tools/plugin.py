"""The ``builtin-tools`` plugin: registers ``bash``, ``read_file`` and ``write_file``."""

from __future__ import annotations

import os

from dsh_host.context import Context
from dsh_host.plugin import Plugin

from .bash import bash_tool
from .config import BuiltinToolsConfig, BuiltinToolsConfigError, canonical_workspace
from .files import read_file_tool, workspace_root, write_file_tool

__all__ = ["BuiltinTools"]


class BuiltinTools(Plugin):
    """Entry point ``builtin-tools``: the three built-in tools (D11).

    The sandbox is a soft dependency: ``ctx.get("sandbox")`` is read per
    ``bash`` call, so a composition without ``sandbox-local`` still boots and
    every confined ``bash`` call fails closed with ``SANDBOX_UNAVAILABLE``.
    """

    name = "builtin-tools"
    inject = ("tools",)
    Config = BuiltinToolsConfig

    def apply(self, ctx: Context, config: BuiltinToolsConfig) -> None:
        workspace = canonical_workspace(config.workspace)
        if not os.path.isdir(workspace):
            raise BuiltinToolsConfigError(
                f"builtin-tools: workspace {config.workspace!r} resolves to {workspace}, which is "
                "not an existing directory"
            )
        tools = ctx.tools
        tools.register(bash_tool(ctx, config, workspace), owner=ctx)
        root = workspace_root(ctx, workspace)
        tools.register(read_file_tool(config, root), owner=ctx)
        tools.register(write_file_tool(config, root), owner=ctx)
