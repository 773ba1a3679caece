"""Benchmark: the request size per step of a long session, with and without compaction.

One turn of N tool steps (default 3000; ``--small``: 300). Each step's tool returns about
1 KB of text, so without compaction every request repeats the whole history and grows
linearly; with ``token-meter`` + ``compaction-basic`` (the scripted model declares a
``--window`` token context window, 32 000 by default) the surface is summarized whenever the
next request would pass 80 % of it, so the request size stays bounded. Composition: sessions,
llm, tools, llm-scripted (inline script, summaries from ``compaction_responses``), agent, an
in-process bulk tool, plus token-meter and compaction-basic for the compacting run. No
persistence: the figure is the request, not the disk.

Per loop request (``purpose`` None) the bench records the number of messages, the bytes of
the messages' JSON (each message encoded once: they are immutable and shared) and the token
meter's heuristic estimate. Reported at steps 10, 100, 1000, N: both sizes and their ratio,
the largest compacted request against the window, the number of compactions, the summary
requests' total size, and the wall time of each run (one run each; a ratio, not a target).
Writes ``bench/results/compaction.json``.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
from _common import machine_info, parser, print_table, ratio, write_result

from dsh_host import Row, open_host
from dsh_host._jsonsafe import json_enc_hook
from dsh_host._session.events import CompletedReason
from dsh_host._session.tokens import estimate_message
from dsh_host._tools import ToolDefinition, ToolExecution, text_output

SUMMARY = (
    "## Primary Request and Intent\n- process every item with one tool call each\n"
    "## Key Technical Concepts\n- (none)\n## Files and Code\n- (none)\n"
    "## Errors and Fixes\n- (none)\n## Pending Jobs\n- the remaining items\n"
    "## Current Work\n- item processing, in order\n## Next Step\n- the next item\n"
    "## Critical Context\n- each item's result is about 1 KB of text"
)
RESULT_CHARS = 1000


def script(steps: int) -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = [
        {
            "text": f"Item {i}.",
            "tool_calls": [{"name": "bulk", "arguments": {"i": i}}],
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
        for i in range(1, steps + 1)
    ]
    responses.append({"text": "All items processed."})
    return responses


def rows(steps: int, window: int, compact: bool) -> list[Row]:
    model = {
        "responses": script(steps),
        "context_window": window,
        "compaction_responses": [{"text": SUMMARY}] * (steps // 10 + 10),
    }
    out = [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config=model),
        Row(
            name="agent",
            config={"provider": "scripted", "model": "scripted", "maxStepsPerTurn": steps + 1},
        ),
    ]
    if compact:
        out += [Row(name="token-meter"), Row(name="compaction-basic")]
    return out


async def _bulk(args: Any, exec_: ToolExecution) -> str:
    i = int(args.get("i", 0))
    line = f"item {i}: " + "lorem ipsum dolor sit amet " * 3
    return (line * (RESULT_CHARS // len(line) + 1))[:RESULT_CHARS]


async def run(steps: int, window: int, compact: bool) -> dict[str, Any]:
    sizes: dict[int, tuple[int, int]] = {}  # id(message) -> (bytes, tokens)
    per_step: list[tuple[int, int, int]] = []  # (messages, bytes, tokens)
    summaries: list[int] = []

    def measure(messages: Any) -> tuple[int, int, int]:
        total_bytes = total_tokens = 0
        for message in messages:
            known = sizes.get(id(message))
            if known is None:
                encoded = msgspec.json.encode(message, enc_hook=json_enc_hook)
                known = (len(encoded), estimate_message(message))
                sizes[id(message)] = known
            total_bytes += known[0]
            total_tokens += known[1]
        return len(messages), total_bytes, total_tokens

    async with open_host(rows(steps, window, compact)) as host:
        host.ctx.tools.register(
            ToolDefinition(
                name="bulk",
                description="returns about 1 KB of text for item i",
                parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
                execute=_bulk,
                output=text_output(),
            )
        )
        [fiber] = [f for f in host.fibers if f.id == "model"]
        adapter = fiber.instance.adapter

        def on_stream(request: Any, next_: Any) -> Any:
            if request.purpose is None:
                per_step.append(measure(request.messages))
            else:
                summaries.append(measure(request.messages)[1])
            adapter.requests.clear()  # the scripted adapter keeps requests for tests
            return next_()

        host.ctx.on("llm/stream", on_stream)
        agent = host.ctx.agent.create(session_id=f"bench-compaction-{compact}")
        start = time.perf_counter()
        reason = await agent.run_turn("Process every item, one tool call per item.")
        wall = time.perf_counter() - start
        if reason != CompletedReason():
            raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
        events = agent.session.events
        compactions = sum(1 for e in events if e.type == "compaction/end")
        failed = sum(1 for e in events if e.type == "compaction/end" and "error" in e.data)
        await agent.aclose()
    return {
        "compact": compact,
        "wall_s": round(wall, 3),
        "events": len(events),
        "compactions": compactions,
        "failed_compactions": failed,
        "summary_requests": len(summaries),
        "summary_request_bytes_total": sum(summaries),
        "per_step": [list(s) for s in per_step],
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="tool steps (default 3000; small 300)")
    p.add_argument("--window", type=int, default=32_000, help="declared context window")
    args = p.parse_args()
    steps = args.steps or (300 if args.small else 3000)
    full = anyio.run(run, steps, args.window, False, backend=args.backend)
    compacted = anyio.run(run, steps, args.window, True, backend=args.backend)
    checkpoints = sorted({s for s in (10, 100, 1000, steps) if s <= steps})
    table = []
    for step in checkpoints:
        a, b = full["per_step"][step - 1], compacted["per_step"][step - 1]
        table.append([step, a[0], b[0], a[1], b[1], a[2], b[2], ratio(a[1], b[1])])
    print_table(
        f"request size per step, {steps} steps, window {args.window} tokens",
        ["step", "msgs", "msgs (c)", "bytes", "bytes (c)", "tokens~", "tokens~ (c)", "x"],
        table,
    )
    largest = max(s[2] for s in compacted["per_step"])
    print(
        f"\ncompacted: {compacted['compactions']} compactions ({compacted['failed_compactions']}"
        f" failed), largest request ~{largest} tokens = {largest / args.window:.0%} of the "
        f"window; without: largest ~{max(s[2] for s in full['per_step'])} tokens"
    )
    print(
        f"wall: {full['wall_s']} s without, {compacted['wall_s']} s with compaction "
        f"(ratio {ratio(compacted['wall_s'], full['wall_s'])})"
    )
    payload = {
        "small": args.small,
        "steps": steps,
        "window": args.window,
        "result_chars": RESULT_CHARS,
        "at": {
            str(step): {
                "without": dict(zip(("messages", "bytes", "tokens"), full["per_step"][step - 1],
                                    strict=True)),
                "with": dict(zip(("messages", "bytes", "tokens"),
                                 compacted["per_step"][step - 1], strict=True)),
            }
            for step in checkpoints
        },
        "largest_compacted_tokens": largest,
        "largest_uncompacted_tokens": max(s[2] for s in full["per_step"]),
        "runs": {
            name: {k: v for k, v in run_.items() if k != "per_step"}
            for name, run_ in (("without", full), ("with", compacted))
        },
        # every 50th step, (messages, bytes, tokens): enough to plot the two curves
        "curve": {
            "without": full["per_step"][::50],
            "with": compacted["per_step"][::50],
        },
        "machine": machine_info(),
    }
    write_result("compaction", payload, args.results_dir)


if __name__ == "__main__":
    main()
