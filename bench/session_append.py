"""Benchmark: in-memory append rate of a 100k-event session, and derive_messages() cost.

What it measures (issue 3's done-criterion):

1. ``Session.append`` throughput over a realistic mix: each turn is
   ``turn/start, user/message, step/start, request/header, assistant/message
   (text + tool call + embedded stream), tool/call, tool/result, step/end,
   step/start, assistant/message, step/end, turn/end`` (12 events). Payloads are
   built before the clock starts (building them is the loop's work, not the log's);
   each append still validates, copies and freezes its payload.
2. ``derive_messages()`` incremental cost: called after every turn; the cost per
   *new surface entry* is reported for the first and the last 50 turns. If the
   fold were not incremental, the late calls would cost ~N times the early ones.
   The result is an O(1) immutable snapshot (a view of the append-only derived
   list), so nothing O(total) is paid per call; a second call with nothing new
   measures the fixed per-call overhead, which is subtracted from the per-entry figure.

Run: ``/work/venv/bin/python bench/session_append.py [--events N]``. Writes
``bench/results/session_append.json``. No assertion: numbers are reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from dsh_host._session import (
    AssistantMessage,
    AssistantMessageData,
    ChunkRecord,
    CompletedReason,
    EpochHeader,
    FinishChunk,
    LlmCallConfig,
    ModelSource,
    RequestHeaderData,
    Session,
    StepEnd,
    StepStart,
    StopFinish,
    TextBlock,
    TextChunksRecord,
    TokenUsage,
    ToolCallBlock,
    ToolCallData,
    ToolCallsFinish,
    ToolResultBlock,
    ToolResultData,
    ToolResultMessage,
    ToolSchema,
    ToolSource,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserSource,
)

EVENTS_PER_TURN = 12
SOURCE = ModelSource(provider="bench", model="bench-1")
HEADER = EpochHeader(
    config=LlmCallConfig(provider="bench", model="bench-1", max_tokens=4096),
    tools=(
        ToolSchema(
            name="bash",
            description="run a command",
            parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
        ),
    ),
)


def turn_payloads(
    turn: int, *, text: str = "let me look.", tool_output: str = "a\nb\nc\n"
) -> list[tuple[str, Any, Literal["append"] | None]]:
    """(type, data, surface_op) for one turn: a tool step and an answer step.

    ``text`` is the first assistant message's text and ``tool_output`` what the tool
    returned, so other benches can use the same mix at realistic sizes.
    """
    call_id = f"call-{turn}"
    stream = (
        ChunkRecord(time=1, chunk=FinishChunk(reason=ToolCallsFinish())),
        TextChunksRecord(time0=1, index=0, dt=(0, 1, 0), texts=("let", " me", " look", ".")),
    )
    first = AssistantMessage(
        id=f"a-{turn}-1",
        content=(
            TextBlock(text=text),
            ToolCallBlock(id=call_id, name="bash", arguments='{"cmd":"ls -la"}'),
        ),
        source=SOURCE,
    )
    second = AssistantMessage(
        id=f"a-{turn}-2", content=(TextBlock(text="done: 3 files."),), source=SOURCE
    )
    result = ToolResultMessage(
        id=f"r-{turn}",
        content=(
            ToolResultBlock(
                tool_call_id=call_id, content=(TextBlock(text=tool_output),), is_error=False
            ),
        ),
        source=ToolSource(call_id=call_id),
    )
    usage = TokenUsage(input_tokens=1200, output_tokens=40)
    return [
        ("turn/start", TurnStart(turn=turn), None),
        (
            "user/message",
            UserMessage(
                id=f"u-{turn}", content=(TextBlock(text=f"question {turn}"),), source=UserSource()
            ),
            "append",
        ),
        ("step/start", StepStart(turn=turn, step=1), None),
        (
            "request/header",
            RequestHeaderData(header=HEADER, reason="initial" if turn == 1 else "change"),
            None,
        ),
        (
            "assistant/message",
            AssistantMessageData(turn=turn, step=1, message=first, stream=stream, usage=usage),
            "append",
        ),
        (
            "tool/call",
            ToolCallData(turn=turn, step=1, call_id=call_id, name="bash", arguments="{}"),
            None,
        ),
        ("tool/result", ToolResultData(turn=turn, step=1, message=result), "append"),
        ("step/end", StepEnd(turn=turn, step=1), None),
        ("step/start", StepStart(turn=turn, step=2), None),
        (
            "assistant/message",
            AssistantMessageData(
                turn=turn,
                step=2,
                message=second,
                stream=(ChunkRecord(time=2, chunk=FinishChunk(reason=StopFinish())),),
            ),
            "append",
        ),
        ("step/end", StepEnd(turn=turn, step=2), None),
        ("turn/end", TurnEnd(turn=turn, reason=CompletedReason()), None),
    ]


def bench_append(total: int, repeats: int) -> dict[str, Any]:
    """Append ``total`` events into a fresh session, ``repeats`` times (the machine is shared,
    so the best and the median run are both reported)."""
    turns = total // EVENTS_PER_TURN
    payloads = [p for t in range(1, turns + 1) for p in turn_payloads(t)]
    runs: list[float] = []
    cpu_runs: list[float] = []
    for _ in range(repeats):
        session = Session.create("bench-append")
        gc.collect()
        start, cpu_start = time.perf_counter(), time.process_time()
        for kind, data, op in payloads:
            session.append(kind, data, surface_op=op)
        runs.append(time.perf_counter() - start)
        cpu_runs.append(time.process_time() - cpu_start)
        assert session.seq == len(payloads)
        del session
    best, median = min(runs), statistics.median(runs)
    cpu_median = statistics.median(cpu_runs)
    return {
        "events": len(payloads),
        "repeats": repeats,
        "seconds_per_run": [round(r, 4) for r in runs],
        "cpu_seconds_per_run": [round(r, 4) for r in cpu_runs],
        "events_per_second_best": round(len(payloads) / best),
        "events_per_second_median": round(len(payloads) / median),
        # CPU time excludes waiting for a core on a shared machine.
        "events_per_cpu_second_median": round(len(payloads) / cpu_median),
        "us_per_event_median": round(median / len(payloads) * 1e6, 3),
    }


def bench_derive(total: int, window: int = 50) -> dict[str, Any]:
    turns = total // EVENTS_PER_TURN
    session = Session.create("bench-derive")
    per_turn: list[tuple[float, float, int, int]] = []  # (call s, idle call s, new nodes, total)
    seen = 0
    for t in range(1, turns + 1):
        for kind, data, op in turn_payloads(t):
            session.append(kind, data, surface_op=op)
        nodes = len(session.surface.nodes)
        gc.disable()  # keep collector pauses out of a sub-millisecond measurement
        try:
            start = time.perf_counter()
            messages = session.derive_messages()  # projects the new nodes
            call = time.perf_counter() - start
            start = time.perf_counter()
            session.derive_messages()  # nothing new: the fixed per-call overhead
            idle = time.perf_counter() - start
        finally:
            gc.enable()
        per_turn.append((call, idle, nodes - seen, len(messages)))
        seen = nodes

    def summary(rows: list[tuple[float, float, int, int]]) -> dict[str, Any]:
        per_entry_ms = [(c - idle) / n * 1e3 for c, idle, n, _ in rows]
        return {
            "turns": len(rows),
            "messages_at_end": rows[-1][3],
            "ms_per_new_entry_median": round(statistics.median(per_entry_ms), 5),
            "ms_per_call_median": round(statistics.median(c for c, *_ in rows) * 1e3, 5),
            "ms_call_nothing_new_median": round(statistics.median(i for _, i, *_ in rows) * 1e3, 5),
        }

    first, last = summary(per_turn[:window]), summary(per_turn[-window:])
    ratio = last["ms_per_new_entry_median"] / first["ms_per_new_entry_median"]
    # Cost of a full (non-incremental) re-derivation at the end, for comparison.
    from dsh_host._session import derive_messages_from_events

    start = time.perf_counter()
    derive_messages_from_events(session.events)
    full = time.perf_counter() - start
    return {
        "start": first,
        "end": last,
        "per_entry_ratio_end_over_start": round(ratio, 3),
        "full_refold_ms_at_end": round(full * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    append = bench_append(args.events, args.repeats)
    print(
        f"append: {append['events']} events x {append['repeats']} runs: median "
        f"{append['events_per_second_median']:,} events/s ({append['us_per_event_median']} "
        f"us/event), best {append['events_per_second_best']:,} events/s; per CPU-second "
        f"(median) {append['events_per_cpu_second_median']:,}"
    )
    derive = bench_derive(args.events)
    s, e = derive["start"], derive["end"]
    print(
        "derive_messages: ms per new entry "
        f"start {s['ms_per_new_entry_median']} / end "
        f"{e['ms_per_new_entry_median']} (ratio "
        f"{derive['per_entry_ratio_end_over_start']}); whole call median start "
        f"{s['ms_per_call_median']} ms / end {e['ms_per_call_median']} ms "
        f"(a call with nothing new: {e['ms_call_nothing_new_median']} ms; "
        f"{e['messages_at_end']} messages); "
        f"full refold at end {derive['full_refold_ms_at_end']} ms"
    )
    result = {
        "benchmark": "session_append",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "load_average_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "append": append,
        "derive_messages": derive,
    }
    out = Path(__file__).parent / "results" / "session_append.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
