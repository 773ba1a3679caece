"""A small, real composition for the approval tests.

Rows ``sessions``, ``tools``, optionally ``tool-rules`` and ``user-approval``
are booted through the real loader; a real tool (``probe``) records whether
its body ran. The only stand-in is :class:`TurnAgent`, the few members of an
agent the approval seam uses (id, session, inject) — the agent loop is
another layer and is exercised separately.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from dsh_host import Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._loader import PluginHost
from dsh_host._session import Session, UserMessage, event_to_builtins
from dsh_host._tools import (
    TOOLS,
    ToolDefinition,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionResult,
    text_output,
)


@dataclass
class TurnAgent:
    """What an agent is to the approval seam: an id, a session, an inbox for notices."""

    session: Session
    injected: list[UserMessage] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.session.id

    def inject(self, message: UserMessage) -> None:
        self.injected.append(message)


class FaultySession(Session):
    """A session whose append of one event type fails before the commit point.

    Fault injection for "an audit append failure": the log is left unchanged,
    exactly like a pre-commit validator veto.
    """

    fail_on: str = ""

    def append(self, type: str, data: Any, **kwargs: Any) -> Any:
        if type == self.fail_on:
            raise OSError(f"injected append failure for {type}")
        return super().append(type, data, **kwargs)


@dataclass
class Probe:
    """The test tool: records every body invocation."""

    calls: list[Any] = field(default_factory=list)

    def definition(self, name: str = "probe") -> ToolDefinition:
        async def body(args: Any, exec_: ToolExecution) -> str:
            self.calls.append(args)
            return f"ran {name}"

        return ToolDefinition(
            name=name,
            description="records that it ran",
            parameters={"type": "object", "properties": {"x": {"type": "integer"}}},
            execute=body,
            output=text_output(),
        )


def rows(
    *,
    policy: str | None = "ask",
    rules: Sequence[dict[str, Any]] | None = ({"tool": "*", "decision": "ask"},),
) -> list[Row]:
    out = [Row(name="sessions"), Row(name="tools")]
    if rules is not None:
        out.append(Row(id="rules", name="tool-rules", config={"rules": list(rules)}))
    if policy is not None:
        out.append(Row(id="approval", name="user-approval", config={"policy": policy}))
    return out


@asynccontextmanager
async def booted(
    *,
    policy: str | None = "ask",
    rules: Sequence[dict[str, Any]] | None = ({"tool": "*", "decision": "ask"},),
    tools: Sequence[str] = ("probe",),
) -> AsyncIterator[tuple[PluginHost, Probe]]:
    async with open_host(rows(policy=policy, rules=rules)) as host:
        probe = Probe()
        for name in tools:
            host.ctx.tools.register(probe.definition(name))
        yield host, probe


def open_turn(session: Session, *, turn: int = 1, step: int = 1) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": step})


def new_agent(host: PluginHost, session_id: str = "s1", *, session_cls: type[Session] = Session,
              turn_open: bool = True) -> TurnAgent:
    session = session_cls.create(session_id)
    host.ctx.sessions.attach(session)
    if turn_open:
        open_turn(session)
    return TurnAgent(session)


async def call_tool(
    host: PluginHost,
    agent: TurnAgent | None,
    *,
    name: str = "probe",
    arguments: Any = None,
    call_id: str = "call-1",
    signal: CancelToken | None = None,
    raw: str | None = None,
) -> ToolExecutionResult:
    """Log ``tool/call`` (as the loop does) and run the call through the real pipeline."""
    args = {"x": 1} if arguments is None else arguments
    raw_args = raw if raw is not None else json.dumps(args)
    if agent is not None:
        agent.session.append(
            "tool/call",
            {"turn": 1, "step": 1, "callId": call_id, "name": name, "arguments": raw_args},
        )
    return await host.ctx.service(TOOLS).execute(
        ToolExecutionInput(
            call_id=call_id,
            name=name,
            arguments=args,
            signal=signal or CancelToken(),
            agent=agent,
        )
    )


def text_of(result: ToolExecutionResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    return str(block.text)  # type: ignore[union-attr]


def audit(session: Session) -> list[dict[str, Any]]:
    """The approval audit events of ``session`` as plain ``{type, data}`` dicts, in order."""
    return [
        {"type": e.type, "data": event_to_builtins(e)["data"]}
        for e in session.events
        if e.type.startswith("approval/")
    ]


def types_of(session: Session) -> list[str]:
    return [e.type for e in session.events]
