"""Helpers of the token-meter / pruner / compaction tests: a real host, a scripted model, tools."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from dsh_host import Row, open_host
from dsh_host._agent import Agent
from dsh_host._llm.types import LlmRequest
from dsh_host._loader import PluginHost
from dsh_host._session.session import Session
from dsh_host._tools import ToolDefinition, ToolExecution, text_output
from dsh_host.testing import ScriptedHost, scripted_model


def rows(
    responses: Sequence[Any],
    *,
    context_window: int | None = None,
    summaries: Sequence[Any] | None = None,
    agent: dict[str, Any] | None = None,
) -> list[Row]:
    model = scripted_model(
        responses, context_window=context_window, compaction_responses=summaries
    )
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        model,
        Row(name="agent", config={"provider": "scripted", "model": "scripted", **(agent or {})}),
    ]


@asynccontextmanager
async def host_with(base: list[Row], *extra: Row) -> AsyncIterator[PluginHost]:
    async with open_host([*base, *extra]) as host:
        yield host


def model_requests(host: PluginHost, row: str = "model") -> list[LlmRequest]:
    return ScriptedHost(host, row).model_requests()


def register_echo(host: PluginHost, name: str = "emit") -> None:
    """A tool returning ``args['text']`` (``times`` times): a script decides a result's size."""

    async def body(args: Any, exec: ToolExecution) -> Any:
        return str(args.get("text", "")) * int(args.get("times", 1))

    host.ctx.tools.register(
        ToolDefinition(
            name=name,
            description="returns its text argument",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
            },
            execute=body,
            output=text_output(),
        )
    )


def call(text: str, name: str = "emit", times: int = 1) -> dict[str, Any]:
    """A scripted response making one tool call whose result is ``text * times``."""
    arguments: dict[str, Any] = {"text": text}
    if times != 1:
        arguments["times"] = times
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def new_agent(host: PluginHost) -> Agent:
    agent: Agent = host.ctx.agent.create()
    return agent


def surface_types(session: Session) -> list[str]:
    events = session.events
    return [events[seq].type for seq in session.surface.nodes]
