"""The process the compaction crash tests kill: one long turn that crosses the threshold.

Run as ``python compaction_child.py ROOT KILL`` with ``ROOT`` the JSONL session root and
``KILL`` one of :data:`KILL_POINTS` (or ``none`` for a clean run). The host is the real
composition: JSONL persistence, the checkpoint policy, token-meter, the tool-result pruner,
compaction-basic, a scripted
model with a small declared window and an in-process tool. Kill points are observers installed
in this process only (a ``session/event`` listener, an innermost ``llm/stream`` listener): no
production code is touched. Prints ``kill <point>`` before dying and ``done`` after a clean run.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import anyio

from dsh_host import Row, open_host
from dsh_host._session.events import ReplaceOp
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

SESSION_ID = "compaction-crash"
WINDOW = 4000
SUMMARY = "## Primary Request and Intent\n- emit chunks\n## Current Work\n- chunk emission"
STEPS = 10

#: where to die: after an event is appended (in memory, maybe not durable), or inside a request
KILL_POINTS = (
    "after-prune",  # compaction/prune appended, its replacing tool/result not yet
    "after-start",  # compaction/start appended, before the summary request's flush
    "in-summary",  # inside the summary request, after the policy flushed before it
    "after-summary",  # compaction/summary appended
    "after-replacement",  # the replacing user/message appended
    "after-end",  # compaction/end appended, not yet flushed
    "next-request",  # the first loop request after the compaction, after its flush
)


def call(i: int) -> dict[str, Any]:
    return {"tool_calls": [{"name": "emit", "arguments": {"text": f"chunk {i} " + "z" * 2400}}]}


#: one result of 12 000 characters (a short call), which the pruner rewrites
BIG = {"tool_calls": [{"name": "emit", "arguments": {"text": "big ", "times": 3000}}]}


def rows(root: str) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": root}),
        Row(name="session-checkpoint-policy"),
        Row(name="llm"),
        Row(name="tools"),
        Row(
            id="model",
            name="llm-scripted",
            config={
                "responses": [BIG] + [call(i) for i in range(STEPS)] + [{"text": "done"}] * 3,
                "context_window": WINDOW,
                "compaction_responses": [{"text": SUMMARY}] * 8,
            },
        ),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
        Row(name="token-meter"),
        Row(
            name="compaction-tool-result-pruner",
            config={"thresholdChars": 4000, "headChars": 1000, "tailChars": 500},
        ),
        Row(name="compaction-basic"),
    ]


def register_tool(host: Any) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        return str(args.get("text", "")) * int(args.get("times", 1))

    host.ctx.tools.register(
        ToolDefinition(
            name="emit",
            description="returns its text argument",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
            },
            execute=body,
            output=text_output(),
        )
    )


def die(point: str) -> None:
    sys.stdout.write(f"kill {point}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


async def main(root: str, point: str) -> None:
    async with open_host(rows(root)) as host:
        register_tool(host)
        compacted = False

        def on_event(session: Any, event: Any) -> None:
            nonlocal compacted
            kind = event.type
            if kind == "compaction/prune" and point == "after-prune":
                die(point)
            if kind == "compaction/start" and point == "after-start":
                die(point)
            if kind == "compaction/summary" and point == "after-summary":
                die(point)
            if kind == "user/message" and isinstance(event.surface_op, ReplaceOp):
                if point == "after-replacement":
                    die(point)
            if kind == "compaction/end":
                compacted = True
                if point == "after-end":
                    die(point)

        def on_stream(request: Any, next_: Any) -> Any:
            # Registered after the checkpoint policy: it runs once the policy's flush is done.
            if request.purpose == "compaction" and point == "in-summary":
                die(point)
            if request.purpose is None and compacted and point == "next-request":
                die(point)
            return next_()

        host.ctx.on("session/event", on_event)
        host.ctx.on("llm/stream", on_stream)
        agent = host.ctx.agent.create(session_id=SESSION_ID)
        await agent.run_turn("emit the chunks")
        await agent.aclose()
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], backend="trio")
