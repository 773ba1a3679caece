"""Benchmark: JSONL flush latency vs the physical limit, and bytes per event (issue 5).

What it measures:

1. **Flush vs raw write+fsync.** A realistic checkpoint batch — one agent step:
   ``step/start, request/context, assistant/message`` (reasoning + text + a
   tool call, with its embedded stream of ~4-character deltas), ``tool/call``,
   ``tool/result`` (a real source file as tool output), ``step/end`` — is
   appended to a write handle as the session core's typed events (what a live
   session routes) and ``flush()`` is timed. JSON encoding happens at
   ``append`` and is timed separately; the flush compresses one zstd frame,
   writes it and fsyncs, on a worker thread. Interleaved with it, the *same
   compressed bytes* the flush appended are written and fsync'd to a file kept
   open in the same directory (``RawFile``: no thread hop, no size check).
   Reported: medians and the ratio flush / raw.
2. **Bytes per event** of a realistic session (``--turns`` turns of a coding
   agent: prompt, request header with tool schemas on the first step, 2-4
   steps each with reasoning, text, tool calls and real file contents as tool
   results), written as it would be (one flush per step), for ``zstd`` and
   ``none``; also the logical JSONL size, so the compression ratio shows.

Run: ``/work/venv/bin/python bench/persistence_flush.py [--small] [--repeats N]``.
Writes ``bench/results/persistence_flush.json``. The scratch directory must be
on a real disk (``fsync`` on tmpfs is free). Numbers are reported, not asserted.
"""

from __future__ import annotations

import json
import os
import sysconfig
import time
from pathlib import Path
from typing import Any

import anyio
import zstandard
from _common import (
    FsyncCounter,
    RawFile,
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    read_range,
    scratch_dir,
    summary_us,
    write_result,
)
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host._session.events import decode_event

T0 = 1_789_200_000_000
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = sorted(p for p in STDLIB.glob("*.py") if 2_000 <= p.stat().st_size <= 12_000)[
    :64
]  # deterministic set of real files, used as tool output

TOOLS = [
    {
        "name": name,
        "description": f"{name}: " + "runs the named operation inside the sandbox. " * 6,
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "workspace-relative path"},
                "cmd": {"type": "string", "description": "shell command"},
                "timeout": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
        },
    }
    for name in ("bash", "read_file", "write_file", "search", "list_dir")
]

WORDS = (
    "the function reads configuration from the workspace and the test fails because the "
    "fixture path is relative so we resolve it against the project root then rerun pytest "
    "with the failing case only and check that the assertion now holds for both backends"
).split()


def _size(path: str) -> int:
    return os.stat(path).st_size


def _text(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(words))


def _deltas(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class SessionBuilder:
    """Wire-form events of a coding-agent session, seq and time contiguous."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.clock = T0

    def add(self, kind: str, data: Any, **extra: Any) -> dict[str, Any]:
        self.clock += 37
        event = {"type": kind, "seq": len(self.events), "time": self.clock, "data": data, **extra}
        self.events.append(event)
        return event

    def step(self, turn: int, step: int, seed: int, *, header: bool) -> list[dict[str, Any]]:
        """One step; returns its events (the checkpoint batch)."""
        first = len(self.events)
        self.add("step/start", {"turn": turn, "step": step})
        if header:
            self.add(
                "request/header",
                {
                    "header": {
                        "config": {
                            "provider": "deepseek",
                            "model": "deepseek-chat",
                            "maxTokens": 8192,
                        },
                        "tools": TOOLS,
                    },
                    "reason": "initial",
                },
            )
        self.add(
            "request/context",
            {"provider": "deepseek", "model": "deepseek-chat", "contextWindow": 131072},
        )
        reasoning = _text(seed, 90)
        answer = _text(seed + 1, 45)
        call_id = f"call_{turn}_{step}"
        source = SOURCES[seed % len(SOURCES)]
        arguments = json.dumps({"path": f"lib/{source.name}"})
        stream: list[dict[str, Any]] = []
        t = self.clock
        for index, (kind, text) in enumerate(
            (("reasoning-chunks", reasoning), ("text-chunks", answer))
        ):
            stream.append(
                {
                    "type": "chunk",
                    "time": t,
                    "chunk": {
                        "type": "block-start",
                        "index": index,
                        "blockType": "reasoning" if index == 0 else "text",
                    },
                }
            )
            parts = _deltas(text)
            stream.append(
                {
                    "type": kind,
                    "time0": t,
                    "index": index,
                    "dt": [(k % 3) + 1 for k in range(len(parts) - 1)],
                    "texts": parts,
                }
            )
            t += 2 * len(parts)
            block_type = "reasoning" if index == 0 else "text"
            stream.append(
                {
                    "type": "chunk",
                    "time": t,
                    "chunk": {
                        "type": "block-end",
                        "index": index,
                        "block": {"type": block_type, "text": text},
                    },
                }
            )
        args = _deltas(arguments, 6)
        stream.append(
            {
                "type": "tool-call-chunks",
                "time0": t,
                "index": 2,
                "dt": [1] * (len(args) - 1),
                "id": call_id,
                "name": "read_file",
                "args": args,
            }
        )
        stream.append(
            {
                "type": "chunk",
                "time": t + len(args),
                "chunk": {
                    "type": "usage",
                    "usage": {"inputTokens": 9000 + seed, "outputTokens": 420},
                },
            }
        )
        stream.append(
            {
                "type": "chunk",
                "time": t + len(args),
                "chunk": {"type": "finish", "reason": {"kind": "tool-calls"}},
            }
        )
        self.add(
            "assistant/message",
            {
                "turn": turn,
                "step": step,
                "message": {
                    "id": f"msg-{turn}-{step}",
                    "role": "assistant",
                    "content": [
                        {"type": "reasoning", "text": reasoning},
                        {"type": "text", "text": answer},
                        {
                            "type": "tool-call",
                            "id": call_id,
                            "name": "read_file",
                            "arguments": arguments,
                        },
                    ],
                    "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
                },
                "stream": stream,
                "usage": {"inputTokens": 9000 + seed, "outputTokens": 420},
            },
            surfaceOp="append",
        )
        call = self.add(
            "tool/call",
            {
                "turn": turn,
                "step": step,
                "callId": call_id,
                "name": "read_file",
                "arguments": arguments,
            },
        )
        output = source.read_text(errors="replace")
        self.add(
            "tool/result",
            {
                "turn": turn,
                "step": step,
                "message": {
                    "id": f"result-{call_id}",
                    "role": "user",
                    "source": {"kind": "tool", "callId": call_id},
                    "content": [
                        {
                            "type": "tool-result",
                            "toolCallId": call_id,
                            "content": [{"type": "text", "text": output}],
                        }
                    ],
                },
            },
            surfaceOp="append",
            sourceEventSeqs=[call["seq"]],
        )
        self.add("step/end", {"turn": turn, "step": step})
        return self.events[first:]

    def turn(self, turn: int, seed: int) -> list[list[dict[str, Any]]]:
        """One turn as its checkpoint batches (a batch per step; the prompt joins step 1)."""
        first = len(self.events)
        self.add("turn/start", {"turn": turn})
        self.add(
            "user/message",
            {
                "id": f"user-{turn}",
                "role": "user",
                "content": [{"type": "text", "text": _text(seed, 40)}],
                "source": {"kind": "user"},
            },
            surfaceOp="append",
        )
        batches: list[list[dict[str, Any]]] = []
        for step in range(1, 2 + seed % 3 + 1):
            batch = self.step(turn, step, seed + step, header=(turn == 1 and step == 1))
            if step == 1:
                batch = self.events[first:]
            batches.append(batch)
        self.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        batches[-1] = [*batches[-1], self.events[-1]]
        return batches


async def bytes_per_event(scratch: Path, turns: int) -> dict[str, Any]:
    builder = SessionBuilder()
    batches = [batch for n in range(1, turns + 1) for batch in builder.turn(n, n * 5)]
    events = builder.events
    logical = sum(
        len(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()) + 1 for e in events
    )
    out: dict[str, Any] = {
        "events": len(events),
        "batches": len(batches),
        "turns": turns,
        "logical_jsonl_bytes": logical,
        "logical_bytes_per_event": round(logical / len(events), 1),
    }
    for compression in ("zstd", "none"):
        root = scratch / f"size-{compression}"
        backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
        handle = await backend.create(
            {"version": 3, "id": "size", "createdAt": T0, "cwd": "/home/dev/project"}
        )
        for batch in batches:
            handle.append(batch)
            await handle.flush()
        await handle.close()
        size = _size(backend.locate({"id": "size", "cwd": "/home/dev/project"}).path)
        out[compression] = {
            "file_bytes": size,
            "bytes_per_event": round(size / len(events), 1),
            "ratio_to_logical": round(size / logical, 3),
        }
    return out


async def flush_latency(scratch: Path, repeats: int) -> dict[str, Any]:
    builder = SessionBuilder()
    builder.turn(1, 3)  # a realistic prefix
    root = scratch / "latency"
    backend = JsonlSessionPersistence(str(root), "zstd")
    handle = await backend.create(
        {"version": 3, "id": "lat", "createdAt": T0, "cwd": "/home/dev/project"}
    )
    handle.append(builder.events)
    await handle.flush()
    path = backend.locate({"id": "lat", "cwd": "/home/dev/project"}).path
    raw = RawFile(Path(path).parent / "raw-baseline.bin")
    append_ns: list[int] = []
    flush_ns: list[int] = []
    raw_ns: list[int] = []
    compress_ns: list[int] = []
    fsync_in_flush_ns: list[int] = []
    frame_bytes: list[int] = []
    batch_events: list[int] = []
    plain_bytes: list[int] = []
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    turn = 2
    for i in range(repeats + 3):
        start = len(builder.events)
        builder.add("turn/start", {"turn": turn})
        batch = builder.step(turn, 1, i, header=False)
        builder.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        batch = builder.events[start:]
        turn += 1
        typed = [decode_event(e) for e in batch]  # the live path appends core events
        before = _size(path)
        counter = FsyncCounter()
        t0 = time.perf_counter_ns()
        handle.append(typed)
        t1 = time.perf_counter_ns()
        with counter.installed():
            await handle.flush()
        t2 = time.perf_counter_ns()
        after = _size(path)
        appended = read_range(path, before, after)
        raw_time = raw.write_fsync(appended)
        plaintext = b"".join(
            json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for e in batch
        )
        c0 = time.perf_counter_ns()
        cctx.compress(plaintext)
        c1 = time.perf_counter_ns()
        if i < 3:
            continue  # warm-up
        append_ns.append(t1 - t0)
        flush_ns.append(t2 - t1)
        raw_ns.append(raw_time)
        compress_ns.append(c1 - c0)
        fsync_in_flush_ns.append(counter.ns)
        frame_bytes.append(after - before)
        batch_events.append(len(batch))
        plain_bytes.append(len(plaintext))
    raw.close()
    await handle.close()
    per_pair = [f / r for f, r in zip(flush_ns, raw_ns, strict=True)]
    return {
        "batch_events_median": median(batch_events),
        "batch_plaintext_bytes_median": median(plain_bytes),
        "frame_bytes_median": median(frame_bytes),
        "append_encode": summary_us(append_ns),
        "flush": summary_us(flush_ns),
        "raw_write_fsync_same_bytes": summary_us(raw_ns),
        "zstd_compress_only": summary_us(compress_ns),
        "fsync_inside_flush": summary_us(fsync_in_flush_ns),
        "ratio_flush_to_raw_of_medians": ratio(median(flush_ns), median(raw_ns)),
        "ratio_flush_to_raw_median_of_pairs": round(median(per_pair), 3),
    }


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=40, help="turns of the sizing session")
    p.add_argument("--repeats", type=int, default=200, help="timed flushes")
    args = p.parse_args()
    turns, repeats = (8, 40) if args.small else (args.turns, args.repeats)
    with scratch_dir(args.scratch, "persistence-flush") as scratch:
        sizes = await bytes_per_event(scratch, turns)
        latency = await flush_latency(scratch, repeats)
        info = machine_info(scratch)
    print_table(
        f"bytes per event ({sizes['events']} events, {sizes['turns']} turns, "
        f"{sizes['batches']} flushes)",
        ["encoding", "file bytes", "bytes/event", "vs logical JSONL"],
        [
            ["logical JSONL", sizes["logical_jsonl_bytes"], sizes["logical_bytes_per_event"], 1.0],
            [
                "zstd (v3 frames)",
                sizes["zstd"]["file_bytes"],
                sizes["zstd"]["bytes_per_event"],
                sizes["zstd"]["ratio_to_logical"],
            ],
            [
                "none (raw JSONL)",
                sizes["none"]["file_bytes"],
                sizes["none"]["bytes_per_event"],
                sizes["none"]["ratio_to_logical"],
            ],
        ],
    )
    print_table(
        f"one checkpoint flush ({latency['batch_events_median']:.0f} events, "
        f"{latency['batch_plaintext_bytes_median']:.0f} B plaintext -> "
        f"{latency['frame_bytes_median']:.0f} B frame), {repeats} samples",
        ["what", "median µs", "p10 µs", "p90 µs"],
        [
            [name, latency[key]["median_us"], latency[key]["p10_us"], latency[key]["p90_us"]]
            for name, key in (
                ("append (encode core events)", "append_encode"),
                ("flush (zstd frame + write + fsync)", "flush"),
                ("  of which: the fsync call", "fsync_inside_flush"),
                ("raw write+fsync, same bytes", "raw_write_fsync_same_bytes"),
                ("zstd compress alone", "zstd_compress_only"),
            )
        ],
    )
    print(
        f"\nflush / raw write+fsync: {latency['ratio_flush_to_raw_of_medians']} (ratio of "
        f"medians), {latency['ratio_flush_to_raw_median_of_pairs']} (median of paired ratios)"
    )
    write_result(
        "persistence_flush",
        {"bytes_per_event": sizes, "flush_latency": latency, "machine": info},
        args.results_dir,
    )


if __name__ == "__main__":
    import sys

    backend = "trio"
    if "--backend" in sys.argv:
        backend = sys.argv[sys.argv.index("--backend") + 1]
    anyio.run(main, backend=backend)
