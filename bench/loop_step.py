"""Benchmark: one agent step with the checkpoint policy on, against the disk's own fsync.

A scripted model asks for one tool call per step; the tool is a bench-local
in-process no-op (``_common:NoopToolPlugin``) so the figure is the harness --
session log, JSONL write-behind, the three checkpoint barriers, bus dispatch,
request building -- not a subprocess. Composition: ``sessions``, ``llm``,
``tools``, ``llm-scripted`` (inline script), ``session-persistence-jsonl``
(zstd), ``session-checkpoint-policy``, ``agent``, the bench tool.

Per step (``agent/step-start`` to the next one) the bench records wall time,
process CPU time, ``os.fsync`` calls (``os.fsync`` is wrapped in this process)
and the bytes the step added to the log. Inside the same listener -- excluded
from the step's time -- it appends exactly those bytes to a second file with
one ``write`` + ``fsync``: the physical limit of making that step durable,
sampled interleaved with the loop so disk weather hits both alike.

Reported for N = 10, 100, 1000, 3000 steps (``--small``: 10, 50, 150):
ms per step at the start and at the end (growth ratio, target <= 1.15), the
same for CPU time, fsyncs and bytes per step, and the ratio of a step to one
raw fsync of its bytes. Writes ``bench/results/loop_step.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from _common import (
    NOOP_TOOL,
    FsyncCounter,
    RawFile,
    cpu_ns,
    file_size,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    ratio,
    read_range,
    scratch_dir,
    verdict,
    write_result,
)

from dsh_host import Row, open_host
from dsh_host.loader import PluginHost
from dsh_host.session.events import CompletedReason

GROWTH_TARGET = 1.15
DEFAULT_STEPS = (10, 100, 1000, 3000)
SMALL_STEPS = (10, 50, 150)


def script(steps: int) -> list[dict[str, Any]]:
    """``steps`` responses with one no-op tool call each, then a closing text."""
    responses: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: checking the next item.",
            "tool_calls": [{"name": NOOP_TOOL, "arguments": {"i": i}}],
            "usage": {"input_tokens": 1000 + 40 * i, "output_tokens": 24},
        }
        for i in range(1, steps + 1)
    ]
    closing = {"text": "All items checked.", "usage": {"input_tokens": 9, "output_tokens": 3}}
    responses.append(closing)
    return responses


def rows(root: Path, steps: int) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": script(steps)}),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        Row(name="session-checkpoint-policy"),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
        Row(id="bench-tool", name="_common:NoopToolPlugin"),
    ]


def _scripted_requests(host: PluginHost) -> list[Any]:
    for fiber in host.fibers:
        if fiber.id == "model":
            requests: list[Any] = fiber.instance.adapter.requests
            return requests
    raise KeyError("model")


@dataclass
class LoopRun:
    """Per-step samples of one turn of ``steps`` tool steps."""

    steps: int
    session_id: str
    path: str = ""
    step_ns: list[int] = field(default_factory=list)
    step_cpu_ns: list[int] = field(default_factory=list)
    step_fsyncs: list[int] = field(default_factory=list)
    step_bytes: list[int] = field(default_factory=list)
    raw_ns: list[int] = field(default_factory=list)
    turn_ns: int = 0
    fsyncs: int = 0
    file_bytes: int = 0
    events: int = 0


async def run_loop(steps: int, root: Path, workspace: Path, raw: RawFile | None) -> LoopRun:
    """Run one turn of ``steps`` tool steps; sample every step (see the module docstring).

    ``raw`` None skips the interleaved physical baseline (used to build fixture logs).
    """
    run = LoopRun(steps=steps, session_id=f"bench-loop-{steps}")
    counter = FsyncCounter()
    # (wall at entry, wall at exit, cpu at entry, cpu at exit, fsyncs, log size)
    marks: list[tuple[int, int, int, int, int, int]] = []
    with counter.installed():
        async with open_host(rows(root, steps)) as host:
            ctx = host.ctx
            backend = ctx.sessionPersistence
            requests = _scripted_requests(host)
            agent = ctx.agent.create(session_id=run.session_id, cwd=str(workspace))

            def on_step_start(_event: Any) -> None:
                enter, cpu_enter, calls = now_ns(), cpu_ns(), counter.calls
                # The scripted adapter keeps every request for tests; a real adapter does
                # not, so the bench drops them (they would only grow the GC's heap).
                requests.clear()
                handle = backend.owner(run.session_id)
                materialized = handle is not None and handle.materialized
                size = file_size(handle.path) if materialized else 0
                if raw is not None and marks and marks[-1][5] and size > marks[-1][5]:
                    data = read_range(handle.path, marks[-1][5], size)
                    run.raw_ns.append(raw.write_fsync(data))
                marks.append((enter, now_ns(), cpu_enter, cpu_ns(), calls, size))

            ctx.on("agent/step-start", on_step_start)
            start = now_ns()
            reason = await agent.run_turn("Check every item, one tool call per item.")
            run.turn_ns = now_ns() - start
            if reason != CompletedReason():
                raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
            await ctx.sessions.flush(agent.session)
            handle = backend.owner(run.session_id)
            run.path = handle.path
            run.events = len(agent.session.events)
            await agent.aclose()
    run.fsyncs = counter.calls
    run.file_bytes = file_size(run.path)
    # marks[k] is the start of step k+1; step k+1 ends where step k+2 starts. The last
    # mark opens the closing text-only step, which is not a tool step.
    if len(marks) != steps + 1:
        raise RuntimeError(f"expected {steps + 1} step starts, saw {len(marks)}")
    for (_, out0, _, cpu_out0, calls0, size0), (in1, _, cpu_in1, _, calls1, size1) in pairwise(
        marks
    ):
        run.step_ns.append(in1 - out0)
        run.step_cpu_ns.append(cpu_in1 - cpu_out0)
        run.step_fsyncs.append(calls1 - calls0)
        run.step_bytes.append(size1 - size0)
    return run


def window(steps: int) -> int:
    """Steps per start/end window: a tenth of the run, at least 3, at most 100."""
    return max(3, min(100, steps // 10))


def ms(samples_ns: list[int]) -> float:
    """Median of nanosecond samples, in milliseconds."""
    return median(samples_ns) / 1e6


def summarize(run: LoopRun) -> dict[str, Any]:
    w = window(run.steps)
    # Step 1 publishes the log (temp file, link, directory fsyncs): reported on its own.
    start, end = slice(1, 1 + w), slice(-w, None)
    raw_start = run.raw_ns[: w + 1][1:] if len(run.raw_ns) > w else run.raw_ns
    raw_end = run.raw_ns[-w:]
    start_ms, end_ms = ms(run.step_ns[start]), ms(run.step_ns[end])
    cpu_start, cpu_end = ms(run.step_cpu_ns[start]), ms(run.step_cpu_ns[end])
    raw_all = ms(run.raw_ns) if run.raw_ns else float("nan")
    step_all = ms(run.step_ns[1:])
    return {
        "steps": run.steps,
        "window_steps": w,
        "events": run.events,
        "first_step_ms": round(run.step_ns[0] / 1e6, 3),
        "ms_per_step_start": round(start_ms, 3),
        "ms_per_step_end": round(end_ms, 3),
        "ms_per_step_median": round(step_all, 3),
        "growth_ratio": ratio(end_ms, start_ms),
        "cpu_ms_per_step_start": round(cpu_start, 3),
        "cpu_ms_per_step_end": round(cpu_end, 3),
        "cpu_growth_ratio": ratio(cpu_end, cpu_start),
        "fsyncs_per_step": round(median(run.step_fsyncs[1:]), 2),
        "fsyncs_per_step_mean": round(sum(run.step_fsyncs) / run.steps, 3),
        "fsyncs_total": run.fsyncs,
        "bytes_per_step": round(median(run.step_bytes[1:])),
        "log_bytes": run.file_bytes,
        "raw_fsync_ms_median": round(raw_all, 3),
        "raw_fsync_ms_start": round(ms(raw_start), 3) if raw_start else None,
        "raw_fsync_ms_end": round(ms(raw_end), 3) if raw_end else None,
        "ratio_to_one_raw_fsync": ratio(step_all, raw_all),
        "ratio_to_one_raw_fsync_start": ratio(start_ms, ms(raw_start)) if raw_start else None,
        "ratio_to_one_raw_fsync_end": ratio(end_ms, ms(raw_end)) if raw_end else None,
        "turn_seconds": round(run.turn_ns / 1e9, 3),
    }


async def main_async(sizes: tuple[int, ...], scratch: Path) -> list[dict[str, Any]]:
    out = []
    raw = RawFile(scratch / "raw-baseline.bin")
    try:
        for steps in sizes:
            root = scratch / f"sessions-{steps}"
            workspace = scratch / "workspace"
            workspace.mkdir(exist_ok=True)
            run = await run_loop(steps, root, workspace, raw)
            out.append(summarize(run))
            print(f"  N={steps}: {run.turn_ns / 1e9:.1f} s", flush=True)
    finally:
        raw.close()
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", help="step counts (default: 10 100 1000 3000)")
    args = p.parse_args()
    sizes = tuple(args.steps or (SMALL_STEPS if args.small else DEFAULT_STEPS))
    with scratch_dir(args.scratch, "loop") as scratch:
        info = machine_info(scratch)
        results = anyio.run(main_async, sizes, scratch, backend=args.backend)
    print_table(
        "loop-step: one tool call per step, checkpoint policy on, JSONL (zstd)",
        [
            "N",
            "ms/step start",
            "ms/step end",
            "growth",
            "cpu ms start",
            "cpu ms end",
            "cpu growth",
            "fsyncs/step",
            "bytes/step",
            "raw fsync ms",
            "step/raw",
        ],
        [
            [
                r["steps"],
                r["ms_per_step_start"],
                r["ms_per_step_end"],
                r["growth_ratio"],
                r["cpu_ms_per_step_start"],
                r["cpu_ms_per_step_end"],
                r["cpu_growth_ratio"],
                r["fsyncs_per_step"],
                r["bytes_per_step"],
                r["raw_fsync_ms_median"],
                r["ratio_to_one_raw_fsync"],
            ]
            for r in results
        ],
    )
    largest = results[-1]
    targets = {
        "growth_ratio_at_most": GROWTH_TARGET,
        "growth_ratio_largest_n": largest["growth_ratio"],
        "growth_verdict": verdict(largest["growth_ratio"], GROWTH_TARGET),
        "cpu_growth_ratio_largest_n": largest["cpu_growth_ratio"],
        "cpu_growth_verdict": verdict(largest["cpu_growth_ratio"], GROWTH_TARGET),
    }
    print(
        f"\ngrowth at N={largest['steps']}: wall {largest['growth_ratio']} "
        f"({targets['growth_verdict']}, target <= {GROWTH_TARGET}); CPU "
        f"{largest['cpu_growth_ratio']} ({targets['cpu_growth_verdict']})"
    )
    write_result(
        "loop_step",
        {
            "small": args.small,
            "backend": args.backend,
            "tool": f"in-process no-op ({NOOP_TOOL}, bench-local plugin)",
            "runs": results,
            "targets": targets,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
