"""The ``builtin-tools`` plugin: ``bash`` and the in-process file tools (read, edit, search)."""

from __future__ import annotations

import os
from typing import Any

from dsh_host.sdk import (
    SANDBOX,
    SESSION_PERSISTENCE,
    TOOLS,
    Context,
    Plugin,
    RunTermKeys,
    SandboxPolicy,
    ToolExecution,
    capped_mode,
    confined_writable_roots,
    harness_state_conflict,
)

from .bash import bash_tool
from .config import BuiltinToolsConfig, BuiltinToolsConfigError, canonical_workspace
from .edit import edit_file_tool
from .files import read_file_tool, workspace_root, write_file_tool
from .listing import list_dir_tool
from .policy import tool_policy
from .search import glob_tool, grep_tool, ripgrep_for
from .spill import SpillArea, bound_results, spill_base

__all__ = ["BuiltinTools"]


class BuiltinTools(Plugin):
    """Entry point ``builtin-tools``: the built-in tools (D11).

    The sandbox is a soft dependency: ``ctx.get("sandbox")`` is read per
    ``bash`` call, so a composition without ``sandbox-local`` still boots and
    every confined ``bash`` call fails closed with ``SANDBOX_UNAVAILABLE``.
    """

    name = "builtin-tools"
    inject = ("tools",)
    Config = BuiltinToolsConfig
    run_terms = RunTermKeys(workspace="workspace", sandbox="sandbox")
    #: bash runs confined: ``Agent(...)`` keeps these tools only with ``sandbox=``
    runs_confined = True

    def apply(self, ctx: Context, config: BuiltinToolsConfig) -> None:
        workspace = canonical_workspace(config.workspace)
        if not os.path.isdir(workspace):
            raise BuiltinToolsConfigError(
                f"builtin-tools: workspace {config.workspace!r} resolves to {workspace}, which is "
                "not an existing directory"
            )
        refuse_writable_harness_state(ctx, config, workspace)
        spill = SpillArea(
            spill_base(config, workspace), config.max_spill_bytes, config.spill_budget_bytes
        )
        ctx.effect(spill.dispose, "builtin-tools spill area")
        # A session's spill files go when it leaves the process: the one event every path
        # crosses (the end of `dsh run`, a `dsh chat`, each `dsh serve` turn).
        def release(session: Any) -> None:
            spill.release(session.id)

        ctx.on("session/disposed", release)
        tools = ctx.service(TOOLS)
        tools.register(bash_tool(ctx, config, workspace, spill), owner=ctx)
        root = workspace_root(ctx, workspace)

        async def row_policy(exec: ToolExecution) -> SandboxPolicy:
            # a sub-agent's ceiling narrows the row's mode (D24)
            mode = capped_mode(config.sandbox, exec.agent)
            return await tool_policy(config, workspace, mode, exec)

        tools.register(read_file_tool(config, root, spill), owner=ctx)
        tools.register(write_file_tool(config, root, row_policy), owner=ctx)
        tools.register(edit_file_tool(config, root, row_policy), owner=ctx)
        helper = ripgrep_for(ctx, config, workspace)
        tools.register(glob_tool(config, root, spill, helper), owner=ctx)
        tools.register(grep_tool(config, root, spill, helper), owner=ctx)
        tools.register(list_dir_tool(config, root, spill), owner=ctx)
        if config.max_inline_bytes is not None:
            bound_results(ctx, spill, config.max_inline_bytes)


def tool_writable_paths(
    ctx: Context, config: BuiltinToolsConfig, workspace: str
) -> list[tuple[str, str]]:
    """``(path, why)`` for every host path this row's tools may write in a confined mode: the
    workspace (``write_file``, and every call escalated to ``workspace-write``) and what the
    sandbox lets a ``workspace-write`` call write. ``danger-full-access`` is no sandbox: only the
    workspace is listed, as the in-process file tools' fence."""
    writable = [(workspace, f"the workspace of row {ctx.row_id!r}")]
    sandbox = ctx.get(SANDBOX)
    if config.sandbox != "danger-full-access" and sandbox is not None:
        policy = SandboxPolicy(mode="workspace-write", workspace_root=workspace)
        for path in confined_writable_roots(sandbox, policy):
            if os.path.isdir(path):
                writable.append(
                    (canonical_workspace(path), "writable by bash in workspace-write here")
                )
    return writable


def refuse_writable_harness_state(ctx: Context, config: BuiltinToolsConfig, workspace: str) -> None:
    """Raise when this row's tools could write the session log or the user's dsh configuration
    (see :class:`BuiltinTools`)."""
    store = ctx.get(SESSION_PERSISTENCE)
    root = getattr(store, "root", None)
    problem = harness_state_conflict(
        root if isinstance(root, str) else None,
        tool_writable_paths(ctx, config, workspace),
        who="builtin-tools",
        actor="the agent's own tools",
        elsewhere="work in another directory (--workspace DIR)",
    )
    if problem is not None:
        raise BuiltinToolsConfigError(problem)
