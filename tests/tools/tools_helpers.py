"""Helpers shared by the tools runtime tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from dsh_host import CancelToken
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolDefinition, ToolExecution, ToolExecutionInput, text_output

Body = Callable[[Any, ToolExecution], Awaitable[Any]]
#: ``boot(**config)`` (the ``boot`` fixture): a host with the ``tools`` row and a
#: ``builtin-tools`` row on the ``ws`` workspace.
Boot = Callable[..., AbstractAsyncContextManager[PluginHost]]


def echo_tool(
    name: str = "echo",
    body: Body | None = None,
    *,
    parameters: dict[str, Any] | None = None,
    **extra: Any,
) -> ToolDefinition:
    """A text tool; the default body echoes ``args["text"]``."""

    async def default(args: Any, exec: ToolExecution) -> Any:
        return str(args.get("text", ""))

    return ToolDefinition(
        name=name,
        description=f"{name} tool",
        parameters=parameters or {"type": "object", "properties": {"text": {"type": "string"}}},
        execute=body or default,
        output=text_output(),
        **extra,
    )


def call(
    name: str = "echo",
    arguments: Any = None,
    *,
    signal: CancelToken | None = None,
    call_id: str = "call-1",
    **extra: Any,
) -> ToolExecutionInput:
    return ToolExecutionInput(
        call_id=call_id,
        name=name,
        arguments={"text": "hi"} if arguments is None else arguments,
        signal=signal or CancelToken(),
        **extra,
    )


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content)
