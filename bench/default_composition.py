"""Benchmark: a long turn of the shipped default composition (``configs/default.yml``).

The other loop benches mount a minimal composition; users run the shipped one, whose rows
(approval, sandbox, compaction, token meter, tool-result pruner, repeat-tool reminder, agent
instructions, the built-in tools) each do a little work every step. Issue 36 found a step of
it growing with the session (3.1 ms a step over 1,000 steps, 5.7 over 3,000: the approval
plugin rescanned the whole log every step). This bench runs that composition, row for row,
with only what a run needs patched in: the session root and the workspace (on the scratch
disk), a scripted model row (``llm-scripted``, inline script, declaring a ``--window``
context window so the compaction rows work as they would with a real model, and a summary
for each compaction), and the per-turn step limit lifted. Each step reads one small file of
the workspace with the built-in ``read_file`` (the model's arguments are the same every step:
the repeat-tool reminder fires at 3, 5 and 8 as it would).

One turn of N = 1,000, 3,000 and 10,000 steps (``--small``: 100, 300), each step measured by
``loop_step.run_loop`` (``agent/step-start`` to the next: wall, process CPU, fsyncs and their
time, bytes added to the log; every third step the bytes it added are appended to another
file with one ``write`` + ``fsync``, outside the step's time: the disk's own cost of them).
Reported per N, side by side: ms per step (median), the **last tenth / first tenth** ratio of
the step's wall time (target <= 1.15; the first step, which publishes the log, left out), the
same without the step's own fsync time and for CPU, the **durable step against the 3-fsync
floor** (the policy's floor is three barriers a step: the median step over three raw
``write`` + ``fsync`` of a step's bytes; target <= 4), **CPU per step** (target <= 1.0 ms),
and **memory per step**: the growth of the process's resident set over the first and the
last tenth, per step (the log is kept in memory, so a step adds its events; bounded means
the last tenth adds no more a step than the first). Writes
``bench/results/default_composition.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from _common import (
    RawFile,
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    scratch_dir,
    verdict,
    write_result,
)
from loop_step import LoopRun, run_loop

from dsh_host import Row
from dsh_host._compositions import shipped_config_dir
from dsh_host._loader import load_rows

DEFAULT_STEPS = (1000, 3000, 10000)
SMALL_STEPS = (100, 300)
#: Issue 36's targets.
FLAT_TARGET = 1.15
FLOOR_TARGET = 4.0
CPU_TARGET_MS = 1.0
#: The declared context window (tokens): large enough that a compaction is an event of the
#: run, not of every step (~150 tokens a step: one every ~500 steps).
DEFAULT_WINDOW = 100_000
NOTES = "a line of the workspace's notes, read once a step\n" * 12
PAGE = os.sysconf("SC_PAGE_SIZE")


def script(steps: int) -> list[dict[str, Any]]:
    """``steps`` replies that each read ``notes.txt``, then a closing text. No provider usage
    is reported: the token meter estimates every request (a scripted usage figure would
    steer the compaction check instead of the surface)."""
    responses: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: reading the notes again.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        }
        for i in range(1, steps + 1)
    ]
    responses.append({"text": "All notes read."})
    return responses


def default_rows(root: Path, workspace: Path, steps: int, window: int) -> list[Row]:
    """``configs/default.yml`` as shipped, with the session root, the workspace, the model
    row and the step limit patched in (nothing else changed, nothing dropped)."""
    model = Row(
        id="model",
        name="llm-scripted",
        config={
            "responses": script(steps),
            "context_window": window,
            "compaction_responses": [{"text": "Summary: the notes were read, once a step."}]
            * (steps // 50 + 10),
        },
    )
    out = [model]
    for located in load_rows(shipped_config_dir() / "default.yml"):
        row = located.row
        config = dict(row.config or {})
        if row.name == "session-persistence-jsonl":
            config["root"] = str(root)
        elif row.name == "builtin-tools":
            config["workspace"] = str(workspace)
        elif row.name == "agent":
            config.update(provider="scripted", model="scripted", maxStepsPerTurn=steps + 1)
        out.append(Row(id=row.id, name=row.name, config=config or None, disabled=row.disabled))
    return out


def rss_bytes() -> int:
    """The process's resident set (``/proc/self/statm``), in bytes."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def tenth(steps: int) -> int:
    return max(3, steps // 10)


def ms(samples_ns: list[int]) -> float:
    return median(samples_ns) / 1e6


async def run_one(
    steps: int, scratch: Path, workspace: Path, raw: RawFile, window: int
) -> dict[str, Any]:
    rss: list[int] = []  # resident set at the start of each step
    blocks: list[int] = []  # live Python memory blocks at the start of each step

    def on_step(_step: int) -> None:
        rss.append(rss_bytes())
        blocks.append(sys.getallocatedblocks())

    run: LoopRun = await run_loop(
        steps,
        scratch / f"sessions-{steps}",
        workspace,
        raw,
        on_step=on_step,
        raw_every=3,
        composition=lambda root, n: default_rows(root, workspace, n, window),
    )
    w = tenth(steps)
    # step_ns[i] is step i + 1; step 1 publishes the log: the first tenth is steps 2..w+1.
    first, last = slice(1, 1 + w), slice(-w, None)
    rest = [t - f for t, f in zip(run.step_ns, run.step_fsync_ns, strict=True)]
    wall_first, wall_last = ms(run.step_ns[first]), ms(run.step_ns[last])
    raw_all = ms([ns for _j, ns in run.raw_ns])
    step_ms = ms(run.step_ns[1:])
    cpu_ms = ms(run.step_cpu_ns[1:])
    # rss[k] is taken as step k + 1 starts; the last mark opens the closing text step.
    rss_first = (rss[1 + w] - rss[1]) / w
    rss_last = (rss[steps] - rss[steps - w]) / w
    blocks_first = (blocks[1 + w] - blocks[1]) / w
    blocks_last = (blocks[steps] - blocks[steps - w]) / w
    return {
        "steps": steps,
        "tenth_steps": w,
        "events": run.events,
        "turn_seconds": round(run.turn_ns / 1e9, 3),
        "first_step_ms": round(run.step_ns[0] / 1e6, 3),
        "ms_per_step_median": round(step_ms, 3),
        "ms_per_step_first_tenth": round(wall_first, 3),
        "ms_per_step_last_tenth": round(wall_last, 3),
        "last_over_first": ratio(wall_last, wall_first),
        "last_over_first_without_fsync": ratio(ms(rest[last]), ms(rest[first])),
        "cpu_ms_per_step_median": round(cpu_ms, 3),
        "cpu_last_over_first": ratio(ms(run.step_cpu_ns[last]), ms(run.step_cpu_ns[first])),
        "fsyncs_per_step": round(median(run.step_fsyncs[1:]), 2),
        "fsync_ms_per_step": round(ms(run.step_fsync_ns[1:]), 3),
        "bytes_per_step": round(median(run.step_bytes[1:])),
        "log_bytes": run.file_bytes,
        "raw_fsync_samples": len(run.raw_ns),
        "raw_fsync_ms_median": round(raw_all, 3),
        "three_fsync_floor_ms": round(3 * raw_all, 3),
        "step_over_floor": ratio(step_ms, 3 * raw_all),
        "rss_kib_per_step_first_tenth": round(rss_first / 1024, 2),
        "rss_kib_per_step_last_tenth": round(rss_last / 1024, 2),
        "rss_mib_end": round(rss[-1] / 2**20, 1),
        "live_blocks_per_step_first_tenth": round(blocks_first, 1),
        "live_blocks_per_step_last_tenth": round(blocks_last, 1),
        "live_blocks_growth": ratio(blocks_last, blocks_first),
        "gc_ms_per_step_last_tenth": round(sum(run.step_gc_ns[last]) / w / 1e6, 3),
    }


async def main_async(sizes: tuple[int, ...], scratch: Path, window: int) -> list[dict[str, Any]]:
    workspace = scratch / "workspace"
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text(NOTES)
    raw = RawFile(scratch / "raw-baseline.bin")
    out = []
    try:
        for steps in sizes:
            result = await run_one(steps, scratch, workspace, raw, window)
            out.append(result)
            print(
                f"  N={steps}: {result['turn_seconds']:.1f} s, last/first "
                f"{result['last_over_first']}, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    finally:
        raw.close()
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", help="step counts (default: 1000 3000 10000)")
    p.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        help=f"the scripted model's declared context window in tokens (default {DEFAULT_WINDOW})",
    )
    args = p.parse_args()
    sizes = tuple(args.steps or (SMALL_STEPS if args.small else DEFAULT_STEPS))
    if min(sizes) < 30:
        p.error(f"--steps must each be at least 30 (a tenth of the turn is compared), got {sizes}")
    if args.window < 1000:
        p.error(f"--window must be at least 1000 tokens, got {args.window}")
    with scratch_dir(args.scratch, "default") as scratch:
        info = machine_info(scratch)
        results = anyio.run(main_async, sizes, scratch, args.window, backend=args.backend)
        info["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    print_table(
        "default composition (configs/default.yml): one turn of N read_file steps, JSONL "
        "(zstd), checkpoint policy, approval, compaction; medians; tenth = N/10 steps",
        [
            "N",
            "ms/step",
            "first tenth",
            "last tenth",
            "last/first",
            "w/o fsync",
            "cpu ms/step",
            "cpu last/first",
            "fsyncs/step",
            "3-fsync floor ms",
            "step/floor",
            "blocks/step first",
            "blocks/step last",
            "RSS KiB/step last",
            "RSS MiB end",
        ],
        [
            [
                r["steps"],
                r["ms_per_step_median"],
                r["ms_per_step_first_tenth"],
                r["ms_per_step_last_tenth"],
                r["last_over_first"],
                r["last_over_first_without_fsync"],
                r["cpu_ms_per_step_median"],
                r["cpu_last_over_first"],
                r["fsyncs_per_step"],
                r["three_fsync_floor_ms"],
                r["step_over_floor"],
                r["live_blocks_per_step_first_tenth"],
                r["live_blocks_per_step_last_tenth"],
                r["rss_kib_per_step_last_tenth"],
                r["rss_mib_end"],
            ]
            for r in results
        ],
    )
    largest = results[-1]
    targets = {
        "last_over_first_at_most": FLAT_TARGET,
        "flat_verdict": verdict(largest["last_over_first"], FLAT_TARGET),
        "step_over_floor_at_most": FLOOR_TARGET,
        "floor_verdict": verdict(largest["step_over_floor"], FLOOR_TARGET),
        "cpu_ms_per_step_at_most": CPU_TARGET_MS,
        "cpu_verdict": verdict(largest["cpu_ms_per_step_median"], CPU_TARGET_MS),
    }
    print(
        f"\nN={largest['steps']}: last/first {largest['last_over_first']} "
        f"({targets['flat_verdict']}, target <= {FLAT_TARGET}); step/floor "
        f"{largest['step_over_floor']} ({targets['floor_verdict']}, target <= {FLOOR_TARGET}); "
        f"CPU {largest['cpu_ms_per_step_median']} ms/step ({targets['cpu_verdict']}, target <= "
        f"{CPU_TARGET_MS}); load average {info['load_average_1_5_15']} -> "
        f"{info['load_average_1_5_15_end']}"
    )
    write_result(
        "default_composition",
        {
            "small": args.small,
            "backend": args.backend,
            "window_tokens": args.window,
            "runs": results,
            "targets": targets,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
