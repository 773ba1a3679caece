"""Helpers shared by the agent loop tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from dsh_host import Row, open_host
from dsh_host._agent import Agent, AgentService
from dsh_host._llm.types import LlmRequest
from dsh_host._loader import PluginHost
from dsh_host._session.events import SessionEvent
from dsh_host._session.session import Session
from dsh_host._tools import ToolDefinition, ToolExecution, ToolRuntime, text_output
from dsh_host.testing import ScriptedHost, scripted_model

Body = Callable[[Any, ToolExecution], Awaitable[Any]]


def scripted_rows(responses: Sequence[object], **agent: Any) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        scripted_model(responses),
        Row(
            name="agent",
            config={"provider": "scripted", "model": "scripted", **agent},
        ),
    ]


@asynccontextmanager
async def scripted_host(
    responses: Sequence[Any], *extra: Row, **agent: Any
) -> AsyncIterator[PluginHost]:
    async with open_host([*scripted_rows(responses, **agent), *extra]) as host:
        yield host


def agent_service(host: PluginHost) -> AgentService:
    service: AgentService = host.ctx.agent
    return service


def tools_of(host: PluginHost) -> ToolRuntime:
    runtime: ToolRuntime = host.ctx.tools
    return runtime


def model_requests(host: PluginHost, row: str = "model") -> list[LlmRequest]:
    """The requests the scripted adapter of row ``row`` received."""
    return ScriptedHost(host, row).model_requests()


def register_tool(
    host: PluginHost,
    name: str,
    body: Body,
    *,
    parallel: bool = False,
    parameters: dict[str, Any] | None = None,
) -> None:
    tools_of(host).register(
        ToolDefinition(
            name=name,
            description=f"the {name} test tool",
            parameters=parameters or {"type": "object"},
            execute=body,
            output=text_output(),
            is_concurrency_safe=(lambda args: True) if parallel else None,
        )
    )


def types(events: Sequence[SessionEvent]) -> list[str]:
    return [event.type for event in events]


def live_types(session: Session, start: int = 0) -> list[str]:
    return [event.type for event in session.events[start:]]


class Trace:
    """Records session events and pipeline dispatches of one host in one ordered list."""

    def __init__(self, host: PluginHost) -> None:
        self.items: list[str] = []
        ctx = host.ctx
        ctx.on("session/event", lambda session, event: self.items.append(event.type))

        async def pre_step(payload: Any, next: Any) -> Any:
            self.items.append("<agent/pre-step>")
            return await next()

        def stream(request: Any, next: Any) -> Any:
            self.items.append("<llm/stream>")
            return next()

        async def pre(exec: Any, next: Any) -> Any:
            self.items.append("<tools/pre-execute>")
            return await next()

        async def around(exec: Any, next: Any) -> Any:
            self.items.append("<tools/execute>")
            return await next()

        async def post(post: Any, next: Any) -> Any:
            self.items.append("<tools/post-execute>")
            return await next()

        ctx.on("agent/pre-step", pre_step)
        ctx.on("llm/stream", stream)
        ctx.on("tools/pre-execute", pre)
        ctx.on("tools/execute", around)
        ctx.on("tools/post-execute", post)
        ctx.on("tools/result", lambda event: self.items.append("<tools/result>"))


async def run(agent: Agent, prompt: str, **options: Any) -> Any:
    return await agent.run_turn(prompt, **options)
