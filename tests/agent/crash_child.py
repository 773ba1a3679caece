"""A harness process that is SIGKILLed while a tool body runs (used by test_resume.py).

Usage: ``python crash_child.py <sessions root> <workspace> <marker file> <session id>``

It composes sessions + llm + tools + agent + llm-scripted + session-persistence-jsonl +
session-checkpoint-policy, registers a ``pay`` tool whose body writes the marker (with its call id) and then
blocks forever. The ``session-checkpoint-policy`` row flushes the session before the
top-level body runs, so ``tool/call`` is durable when the body starts. The parent
kills it while the body blocks.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from dsh_host import Row, open_host
from dsh_host.tools import (
    ToolDefinition,
    ToolExecution,
    text_output,
)


async def main(root: str, workspace: str, marker: str, session_id: str) -> None:
    rows = [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(
            name="llm-scripted",
            config={
                "responses": [
                    {
                        "text": "paying now",
                        "tool_calls": [
                            {"name": "pay", "arguments": {"invoice": 42}, "id": "call-pay"}
                        ],
                    }
                ]
            },
        ),
        Row(name="session-persistence-jsonl", config={"root": root}),
        Row(name="session-checkpoint-policy"),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx

        async def pay(args: Any, exec: ToolExecution) -> Any:
            await anyio.Path(marker).write_text(exec.call_id)
            await anyio.sleep_forever()

        ctx.tools.register(
            ToolDefinition(
                name="pay",
                description="pay an invoice",
                parameters={"type": "object", "properties": {"invoice": {"type": "integer"}}},
                execute=pay,
                output=text_output(),
            )
        )

        agent = ctx.agent.create(session_id=session_id, cwd=workspace)
        await agent.run_turn("pay invoice 42")


if __name__ == "__main__":
    root, workspace, marker, session_id = sys.argv[1:5]
    anyio.run(main, root, workspace, marker, session_id, backend="trio")
