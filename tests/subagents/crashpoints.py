"""Test instrumentation loaded as a ``module:Attr`` row by the crash processes (never shipped).

``crashpoints:CrashPoints`` with ``config: {kill: POINT}`` registers a ``crash`` tool (its body
SIGKILLs the process: "inside a child's tool body") and, for the other points, wraps a function
of the running process so that it SIGKILLs itself at that moment:

``before-child``
    the first child session is about to be created: nothing of it exists, the parent's
    ``tool/call`` was flushed by the checkpoint policy;
``child-stored``
    the first child session and the parent's catalog fact are durable, the child agent is
    about to run its turn (no child turn is stored);
``child-finished``
    the child ``alpha`` finished and was flushed, the parent has not logged its result;
``handoff-started``
    a ``handoff`` body started, nothing of the handoff is recorded;
``handoff-recorded``
    a ``handoff`` record is durable, its call has no result yet;
``reattach``
    a delegating call waiting on its child's approvals (D36) is dispatched again, after the
    decision: the parent's continued turn is open, the child still awaits with its decision;
``ledger-written``
    the ``ledger`` tool appended its line (and nothing else happened after).

With ``ledger: PATH`` a ``ledger`` tool is registered too: its body appends the call id to
PATH (the side effect a test counts).

Each kill prints ``kill <point>`` on stdout first. Nothing here changes production code on disk.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from dsh_subagents.plugin import Subagents

from dsh_host._agent.service import AgentService
from dsh_host._context import Context
from dsh_host._plugin import Plugin
from dsh_host._session.store import SessionStore
from dsh_host._tools import ToolDefinition, ToolExecution, text_output
from dsh_host._tools.keys import TOOLS


def die(point: str) -> None:
    sys.stdout.write(f"kill {point}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class CrashPointsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    kill: str | None = None
    ledger: str | None = None


def _register(
    ctx: Context,
    name: str,
    description: str,
    execute: Callable[[Any, ToolExecution], Awaitable[str]],
) -> None:
    """A test tool without parameters whose body returns text."""
    ctx.service(TOOLS).register(
        ToolDefinition(
            name=name,
            description=description,
            parameters={"type": "object", "properties": {}},
            execute=execute,
            output=text_output(),
        ),
        owner=ctx,
    )


class CrashPoints(Plugin):
    name = "crash-points"
    inject = ("tools",)
    Config = CrashPointsConfig

    def apply(self, ctx: Context, config: CrashPointsConfig) -> None:
        async def crash(_args: Any, _exec: ToolExecution) -> str:
            die("child-tool")
            return "unreachable"

        _register(ctx, "crash", "Test tool: kills the process.", crash)
        ledger_path = config.ledger
        if ledger_path is not None:
            kill_after = config.kill == "ledger-written"

            def append(line: str) -> None:
                with open(ledger_path, "a", encoding="utf-8") as out:
                    out.write(line + "\n")
                    out.flush()
                    os.fsync(out.fileno())

            async def ledger(_args: Any, exec: ToolExecution) -> str:
                append(exec.call_id)  # a few bytes to a test file: not worth a thread
                if kill_after:
                    die("ledger-written")
                return "ledger written"

            _register(ctx, "ledger", "Test tool: appends the call id to the ledger file.", ledger)
        if config.kill == "reattach":
            reattach = Subagents._reattach

            async def die_on_reattach(
                self: Subagents, declared: Any, parent: Any, exec: ToolExecution, child_id: str
            ) -> str:
                die("reattach")
                return await reattach(self, declared, parent, exec, child_id)

            Subagents._reattach = die_on_reattach  # type: ignore[method-assign]
        if config.kill == "before-child":
            store_create = SessionStore.create

            def die_before_child(self: SessionStore, *args: Any, **kwargs: Any) -> Any:
                if (kwargs.get("meta") or {}).get("origin") == "subagent":
                    die("before-child")
                return store_create(self, *args, **kwargs)

            SessionStore.create = die_before_child  # type: ignore[method-assign]
        elif config.kill == "child-stored":
            create = AgentService.create

            def create_then_die(self: AgentService, **kwargs: Any) -> Any:
                session = kwargs.get("session")
                if session is not None and session.header.parent_session:
                    die("child-stored")
                return create(self, **kwargs)

            AgentService.create = create_then_die  # type: ignore[method-assign]
        elif config.kill == "child-finished":
            execute = Subagents._execute

            async def execute_then_die(self: Subagents, args: Any, exec: ToolExecution) -> str:
                answer = await execute(self, args, exec)
                if args["agent"] == "alpha":
                    die("child-finished")
                return answer

            Subagents._execute = execute_then_die  # type: ignore[method-assign]
        elif config.kill in ("handoff-started", "handoff-recorded"):
            handoff = Subagents._handoff
            point = config.kill

            async def handoff_then_die(self: Subagents, args: Any, exec: ToolExecution) -> str:
                if point == "handoff-started":
                    die(point)
                answer = await handoff(self, args, exec)
                die(point)
                return answer

            Subagents._handoff = handoff_then_die  # type: ignore[method-assign]
