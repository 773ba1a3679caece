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
raw fsync of its bytes.

At the largest N the same loop also runs in three more ways, to say where a
durable step's CPU goes (issue 25's targets: <= 1.0 ms durable, <= 0.4 ms in
memory): in memory only (the harness), with ``os.fsync`` a no-op (+ the
persistence code), with ``os.fsync`` a sleep as long as a real one (+ blocking
at all: the same instructions, but the process wakes three times a step on
cold caches), beside the durable run itself (+ the kernel's work in ``write`` +
``fsync``). The four run in ``--rounds`` interleaved rounds (default 3) and
each figure is the median over them, with the rounds' range beside it.
``--words N`` lengthens every reply by N words, each streamed as its own chunk (a
real model streams hundreds): what a streamed chunk costs. Writes
``bench/results/loop_step.json``.
"""

from __future__ import annotations

import cProfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from _common import (
    NOOP_TOOL,
    FsyncCounter,
    GcTimer,
    RawFile,
    cpu_ns,
    file_size,
    fsync_as_sleep,
    fsync_disabled,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    profile_growth,
    profile_table,
    ratio,
    read_range,
    scratch_dir,
    threads_inline,
    verdict,
    write_result,
)

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._session.events import CompletedReason

GROWTH_TARGET = 1.15
DEFAULT_STEPS = (10, 100, 1000, 3000)
SMALL_STEPS = (10, 50, 150)


def script(steps: int, words: int = 0) -> list[dict[str, Any]]:
    """``steps`` responses with one no-op tool call each, then a closing text; ``words`` more
    words in each step's text (the scripted model streams a word a chunk)."""
    more = " word" * words
    responses: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: checking the next item.{more}",
            "tool_calls": [{"name": NOOP_TOOL, "arguments": {"i": i}}],
            "usage": {"input_tokens": 1000 + 40 * i, "output_tokens": 24},
        }
        for i in range(1, steps + 1)
    ]
    closing = {"text": "All items checked.", "usage": {"input_tokens": 9, "output_tokens": 3}}
    responses.append(closing)
    return responses


def rows(root: Path, steps: int, durable: bool = True, words: int = 0) -> list[Row]:
    """The composition; ``durable=False`` drops the JSONL backend and the checkpoint policy
    (the same loop in memory only: what the harness costs without durability)."""
    persistence = [
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        Row(name="session-checkpoint-policy"),
    ]
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": script(steps, words)}),
        *(persistence if durable else []),
        # one turn of `steps` tool steps: lift the loop guard's per-turn step limit (200)
        Row(
            name="agent",
            config={"provider": "scripted", "model": "scripted", "maxStepsPerTurn": steps + 1},
        ),
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
    #: extra words in each step's reply (each streamed as its own chunk)
    words: int = 0
    path: str = ""
    step_ns: list[int] = field(default_factory=list)
    step_cpu_ns: list[int] = field(default_factory=list)
    step_fsyncs: list[int] = field(default_factory=list)
    step_bytes: list[int] = field(default_factory=list)
    step_gc_ns: list[int] = field(default_factory=list)
    step_fsync_ns: list[int] = field(default_factory=list)
    #: (step number j, ns): one raw write+fsync of the bytes step j added
    raw_ns: list[tuple[int, int]] = field(default_factory=list)
    turn_ns: int = 0
    fsyncs: int = 0
    file_bytes: int = 0
    events: int = 0


async def run_loop(
    steps: int,
    root: Path,
    workspace: Path,
    raw: RawFile | None,
    on_step: Callable[[int], None] | None = None,
    raw_every: int = 1,
    durable: bool = True,
    words: int = 0,
    composition: Callable[[Path, int], list[Row]] | None = None,
) -> LoopRun:
    """Run one turn of ``steps`` tool steps; sample every step (see the module docstring).

    ``raw`` None skips the interleaved physical baseline (used to build fixture logs);
    ``on_step(k)`` is called at the start of step k (1-based), outside the timed region;
    ``raw_every``: sample the physical baseline on every n-th step only (saves disk time);
    ``durable=False``: no persistence, no checkpoints (see :func:`rows`);
    ``words``: more words in each step's reply (see :func:`script`);
    ``composition(root, steps)``: other rows than :func:`rows` (they must name the scripted
    model row ``model``; ``durable`` and ``words`` are then the caller's business).
    """
    run = LoopRun(steps=steps, session_id=f"bench-loop-{steps}", words=words)
    counter = FsyncCounter()
    collector = GcTimer()
    # (wall at entry, wall at exit, cpu at entry, cpu at exit, fsyncs, log size, gc ns,
    #  fsync ns)
    marks: list[tuple[int, int, int, int, int, int, int, int]] = []
    with counter.installed(), collector.installed():
        composed = (
            rows(root, steps, durable, words) if composition is None else composition(root, steps)
        )
        async with open_host(composed) as host:
            ctx = host.ctx
            backend = ctx.get("sessionPersistence")
            requests = _scripted_requests(host)
            agent = ctx.agent.create(session_id=run.session_id, cwd=str(workspace))

            def on_step_start(_event: Any) -> None:
                enter, cpu_enter, calls = now_ns(), cpu_ns(), counter.calls
                # The scripted adapter keeps every request for tests; a real adapter does
                # not, so the bench drops them (they would only grow the GC's heap).
                requests.clear()
                handle = backend.owner(run.session_id) if backend is not None else None
                path: str | None = None
                if handle is not None and handle.materialized:
                    path = handle.lease.path
                size = file_size(path) if path is not None else 0
                step = len(marks) + 1  # the step starting now; the one that ended is step - 1
                previous = marks[-1][5] if marks else 0
                sample = raw is not None and step % raw_every == 0
                if sample and path is not None and 0 < previous < size:
                    data = read_range(path, previous, size)
                    assert raw is not None
                    run.raw_ns.append((step - 1, raw.write_fsync(data)))
                if on_step is not None:
                    on_step(step)
                marks.append(
                    (enter, now_ns(), cpu_enter, cpu_ns(), calls, size, collector.ns, counter.ns)
                )

            ctx.on("agent/step-start", on_step_start)
            start = now_ns()
            reason = await agent.run_turn("Check every item, one tool call per item.")
            run.turn_ns = now_ns() - start
            if reason != CompletedReason():
                raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
            run.events = len(agent.session.events)
            if backend is not None:
                await ctx.sessions.flush(agent.session)
                run.path = backend.owner(run.session_id).lease.path
            await agent.aclose()
    run.fsyncs = counter.calls
    run.file_bytes = file_size(run.path) if run.path else 0
    # marks[k] is the start of step k+1; step k+1 ends where step k+2 starts. The last
    # mark opens the closing text-only step, which is not a tool step.
    if len(marks) != steps + 1:
        raise RuntimeError(f"expected {steps + 1} step starts, saw {len(marks)}")
    for before, after in pairwise(marks):
        _, out0, _, cpu_out0, calls0, size0, gc0, sync0 = before
        in1, _, cpu_in1, _, calls1, size1, gc1, sync1 = after
        run.step_ns.append(in1 - out0)
        run.step_gc_ns.append(gc1 - gc0)
        run.step_fsync_ns.append(sync1 - sync0)
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
    # step_ns[i] is step i + 1; the start window is steps 2..w+1, the end window the last w.
    raw_start = [ns for j, ns in run.raw_ns if 2 <= j <= w + 1]
    raw_end = [ns for j, ns in run.raw_ns if j > run.steps - w]
    start_ms, end_ms = ms(run.step_ns[start]), ms(run.step_ns[end])
    # The step minus the time its own fsyncs took: the harness's share, free of disk weather
    # (fsync latency on a shared virtual disk swings 10x within a minute).
    rest = [t - f for t, f in zip(run.step_ns, run.step_fsync_ns, strict=True)]
    rest_start, rest_end = ms(rest[start]), ms(rest[end])
    cpu_start, cpu_end = ms(run.step_cpu_ns[start]), ms(run.step_cpu_ns[end])
    step_all = ms(run.step_ns[1:])
    summary: dict[str, Any] = {
        "steps": run.steps,
        "more_words_a_reply": run.words,
        "window_steps": w,
        "events": run.events,
        "first_step_ms": round(run.step_ns[0] / 1e6, 3),
        "ms_per_step_start": round(start_ms, 3),
        "ms_per_step_end": round(end_ms, 3),
        "ms_per_step_median": round(step_all, 3),
        "growth_ratio": ratio(end_ms, start_ms),
        "fsync_ms_per_step_start": round(ms(run.step_fsync_ns[start]), 3),
        "fsync_ms_per_step_end": round(ms(run.step_fsync_ns[end]), 3),
        "ms_per_step_without_fsync_start": round(rest_start, 3),
        "ms_per_step_without_fsync_end": round(rest_end, 3),
        "growth_ratio_without_fsync": ratio(rest_end, rest_start),
        "cpu_ms_per_step_start": round(cpu_start, 3),
        "cpu_ms_per_step_end": round(cpu_end, 3),
        "cpu_growth_ratio": ratio(cpu_end, cpu_start),
        # mean, not median: most steps run no collection, a few run a long one
        "gc_ms_per_step_start": round(sum(run.step_gc_ns[start]) / w / 1e6, 3),
        "gc_ms_per_step_end": round(sum(run.step_gc_ns[end]) / w / 1e6, 3),
        "fsyncs_per_step": round(median(run.step_fsyncs[1:]), 2),
        "fsyncs_per_step_mean": round(sum(run.step_fsyncs) / run.steps, 3),
        "fsyncs_total": run.fsyncs,
        "bytes_per_step": round(median(run.step_bytes[1:])),
        "log_bytes": run.file_bytes,
        "turn_seconds": round(run.turn_ns / 1e9, 3),
    }
    if run.raw_ns:
        raw_all = ms([ns for _j, ns in run.raw_ns])
        summary.update(
            {
                "raw_fsync_samples": len(run.raw_ns),
                "raw_fsync_ms_median": round(raw_all, 3),
                "raw_fsync_ms_start": round(ms(raw_start), 3) if raw_start else None,
                "raw_fsync_ms_end": round(ms(raw_end), 3) if raw_end else None,
                "ratio_to_one_raw_fsync": ratio(step_all, raw_all),
                "ratio_to_one_raw_fsync_start": (
                    ratio(start_ms, ms(raw_start)) if raw_start else None
                ),
                "ratio_to_one_raw_fsync_end": ratio(end_ms, ms(raw_end)) if raw_end else None,
            }
        )
    return summary


async def profile_run(steps: int, scratch: Path, words: int) -> dict[str, Any]:
    """One extra run under cProfile, enabled for the first and the last window of steps
    (fsync off, worker-thread work inline: the profile is about the harness's CPU; the
    timed runs are not profiled)."""
    w = window(steps)
    # fsync off and the worker-thread work run inline: every row is CPU on one thread.
    start, end = cProfile.Profile(), cProfile.Profile()

    def toggle(step: int) -> None:
        if step == 2:
            start.enable()
        elif step == 2 + w:
            start.disable()
        if step == steps + 1 - w:
            end.enable()
        elif step == steps + 1:
            end.disable()

    workspace = scratch / "workspace"
    workspace.mkdir(exist_ok=True)
    with fsync_disabled(), threads_inline():
        await run_loop(
            steps, scratch / "sessions-profile", workspace, None, toggle, words=words
        )
    return {
        "steps": steps,
        "window_steps": w,
        "top_own_time_end": profile_table(end, w),
        "growth_start_to_end": profile_growth(start, end, w),
    }


async def main_async(
    sizes: tuple[int, ...], scratch: Path, profile: bool, rounds: int, words: int
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    out = []
    raw = RawFile(scratch / "raw-baseline.bin")
    runs: list[LoopRun] = []
    try:
        for steps in sizes:
            root = scratch / f"sessions-{steps}"
            workspace = scratch / "workspace"
            workspace.mkdir(exist_ok=True)
            # Every step up to N=100; every 3rd beyond (plenty of samples, a third of the disk
            # time: the default run stays near two minutes when fsync is slow).
            run = await run_loop(
                steps, root, workspace, raw, raw_every=1 if steps <= 100 else 3, words=words
            )
            runs.append(run)
            out.append(summarize(run))
            print(f"  N={steps}: {run.turn_ns / 1e9:.1f} s", flush=True)
    finally:
        raw.close()
    # The same loop with no persistence and no checkpoints: the harness without durability.
    largest = max(sizes)
    in_memory = await run_loop(
        largest, scratch / "unused", scratch / "workspace", None, durable=False, words=words
    )
    memory = summarize(in_memory)
    print(f"  N={largest} in memory only: {memory['turn_seconds']:.1f} s", flush=True)
    durable = runs[sizes.index(largest)]
    breakdown = await cpu_breakdown(durable, in_memory, scratch, rounds)
    profiled = await profile_run(largest, scratch, words) if profile else None
    return out, memory, breakdown, profiled


#: Issue 25's CPU targets for one step (ms): the durable step, the same loop in memory.
CPU_TARGET_MS = 1.0
IN_MEMORY_CPU_TARGET_MS = 0.4


def _cpu_ms(run: LoopRun) -> float:
    """Median CPU per step, the first (publishing) step left out."""
    return ms(run.step_cpu_ns[1:])


#: Interleaved rounds of the four breakdown runs (``--small``: one). A shared VM's speed moves
#: by a third within minutes; one run per mode let a share move more than any change did.
BREAKDOWN_ROUNDS = 3

#: The four runs of the breakdown, in the order each round runs them.
MODES = ("in_memory", "fsync_no_op", "fsync_as_sleep", "durable")


async def cpu_breakdown(
    durable: LoopRun, in_memory: LoopRun, scratch: Path, rounds: int
) -> dict[str, Any]:
    """Where a durable step's CPU goes: the same N-step loop with ``os.fsync`` a no-op and
    with ``os.fsync`` a sleep as long as the durable run's median fsync, beside the durable
    run and the in-memory one, in ``rounds`` interleaved rounds (the first reuses the
    sweep's durable and in-memory runs). The per-mode medians over the rounds split the step
    into the harness (in memory), the persistence code (no fsync minus in memory), blocking
    at all (sleep minus no fsync: the same code, the same instructions, but three waits a
    step, after which the process runs on cold caches) and the kernel's work in ``write`` +
    ``fsync`` (real minus sleep)."""
    steps, words = durable.steps, durable.words
    workspace = scratch / "workspace"
    fsyncs = median(durable.step_fsyncs[1:]) or 1
    one_fsync_s = median(durable.step_fsync_ns[1:]) / fsyncs / 1e9
    settings: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "in_memory": nullcontext,
        "fsync_no_op": fsync_disabled,
        "fsync_as_sleep": lambda: fsync_as_sleep(one_fsync_s),
        "durable": nullcontext,
    }
    reused = {"in_memory": in_memory, "durable": durable}  # the sweep's runs: round 1
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    for number in range(1, rounds + 1):
        for mode in MODES:
            run = reused.get(mode) if number == 1 else None
            if run is None:
                root = scratch / f"sessions-breakdown-{mode}-{number}"
                with settings[mode]():
                    run = await run_loop(
                        steps, root, workspace, None, durable=mode != "in_memory", words=words
                    )
            samples[mode].append(_cpu_ms(run))
        print(
            f"  N={steps} breakdown round {number}/{rounds} (fsync a no-op, then a "
            f"{one_fsync_s * 1e3:.3f} ms sleep): "
            + ", ".join(f"{mode} {samples[mode][-1]:.3f} ms" for mode in MODES),
            flush=True,
        )
    cpu = {mode: median(samples[mode]) for mode in MODES}
    memory_ms, no_fsync_ms = cpu["in_memory"], cpu["fsync_no_op"]
    slept_ms, durable_ms = cpu["fsync_as_sleep"], cpu["durable"]
    return {
        "steps": steps,
        "more_words_a_reply": words,
        "rounds": rounds,
        "sleep_per_fsync_ms": round(one_fsync_s * 1e3, 3),
        "cpu_ms_per_step": {mode: round(cpu[mode], 3) for mode in MODES},
        "cpu_ms_per_step_rounds": {mode: [round(x, 3) for x in samples[mode]] for mode in MODES},
        "share_ms": {
            "harness": round(memory_ms, 3),
            "persistence_code": round(no_fsync_ms - memory_ms, 3),
            "blocking": round(slept_ms - no_fsync_ms, 3),
            "kernel_write_fsync": round(durable_ms - slept_ms, 3),
        },
        "targets": {
            "durable_cpu_ms_at_most": CPU_TARGET_MS,
            "durable_verdict": verdict(durable_ms, CPU_TARGET_MS),
            "in_memory_cpu_ms_at_most": IN_MEMORY_CPU_TARGET_MS,
            "in_memory_verdict": verdict(memory_ms, IN_MEMORY_CPU_TARGET_MS),
        },
    }


def print_breakdown(breakdown: dict[str, Any]) -> None:
    cpu, share = breakdown["cpu_ms_per_step"], breakdown["share_ms"]
    spread = {
        mode: f"{min(values):.3f}-{max(values):.3f}"
        for mode, values in breakdown["cpu_ms_per_step_rounds"].items()
    }
    targets = breakdown["targets"]
    print_table(
        f"where a durable step's CPU goes, N={breakdown['steps']} (CPU ms per step: the median "
        f"over {breakdown['rounds']} interleaved round(s) of each run's median; the sleep is "
        f"{breakdown['sleep_per_fsync_ms']} ms, the durable run's median fsync)",
        ["run", "CPU ms/step", "rounds' range", "share", "share ms", "target", "verdict"],
        [
            ["in memory", cpu["in_memory"], spread["in_memory"], "harness", share["harness"],
             targets["in_memory_cpu_ms_at_most"], targets["in_memory_verdict"]],
            ["durable, fsync a no-op", cpu["fsync_no_op"], spread["fsync_no_op"],
             "persistence code", share["persistence_code"], "-", "-"],
            ["durable, fsync a sleep", cpu["fsync_as_sleep"], spread["fsync_as_sleep"],
             "blocking (same code)", share["blocking"], "-", "-"],
            ["durable", cpu["durable"], spread["durable"], "kernel write + fsync",
             share["kernel_write_fsync"], targets["durable_cpu_ms_at_most"],
             targets["durable_verdict"]],
        ],
    )


def print_profile(profiled: dict[str, Any]) -> None:
    w = profiled["window_steps"]
    print_table(
        f"profile, N={profiled['steps']}: own time per step in the last {w} steps (fsync off, "
        "worker-thread work inline; cProfile inflates absolute times: compare rows)",
        ["function", "calls/step", "own µs/step", "cumulative µs/step"],
        [
            [r["function"], r["calls_per"], r["own_us_per"], r["cumulative_us_per"]]
            for r in profiled["top_own_time_end"]
        ],
    )
    print_table(
        f"profile, N={profiled['steps']}: what grew from the first {w} steps to the last {w}",
        ["function", "own µs/step start", "own µs/step end", "growth µs/step", "calls/step"],
        [
            [
                r["function"],
                r["own_us_per_start"],
                r["own_us_per_end"],
                r["growth_us_per"],
                r["calls_per_end"],
            ]
            for r in profiled["growth_start_to_end"]
        ],
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", help="step counts (default: 10 100 1000 3000)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the largest N (cProfile; fsync off, worker-thread work inline): where "
        "a step's CPU goes at the end, and which functions grew from the first to the last window",
    )
    p.add_argument(
        "--words",
        type=int,
        default=0,
        help="more words in each step's reply, each streamed as its own chunk (default 0: "
        "a six-word reply); e.g. 300 for a step the way a real model streams it",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help=f"interleaved rounds of the CPU breakdown's four runs (default {BREAKDOWN_ROUNDS}; "
        "--small: 1)",
    )
    args = p.parse_args()
    sizes = tuple(args.steps or (SMALL_STEPS if args.small else DEFAULT_STEPS))
    rounds = args.rounds if args.rounds is not None else (1 if args.small else BREAKDOWN_ROUNDS)
    if args.words < 0:
        p.error(f"--words must be at least 0, got {args.words}")
    if rounds < 1:
        p.error(f"--rounds must be at least 1, got {rounds}")
    with scratch_dir(args.scratch, "loop") as scratch:
        info = machine_info(scratch)
        results, memory, breakdown, profiled = anyio.run(
            main_async, sizes, scratch, args.profile, rounds, args.words, backend=args.backend
        )
    print_table(
        "loop-step: one tool call per step, checkpoint policy on, JSONL (zstd)"
        + (f", {args.words} more words a reply" if args.words else "")
        + "; medians of the first and last window (N/10 steps, 3..100)",
        [
            "N",
            "ms/step start",
            "ms/step end",
            "growth",
            "fsync ms start",
            "fsync ms end",
            "rest ms start",
            "rest ms end",
            "rest growth",
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
                r["fsync_ms_per_step_start"],
                r["fsync_ms_per_step_end"],
                r["ms_per_step_without_fsync_start"],
                r["ms_per_step_without_fsync_end"],
                r["growth_ratio_without_fsync"],
                r["cpu_growth_ratio"],
                r["fsyncs_per_step"],
                r["bytes_per_step"],
                r.get("raw_fsync_ms_median"),
                r.get("ratio_to_one_raw_fsync"),
            ]
            for r in [*results, {**memory, "steps": f"{memory['steps']:,} in memory"}]
        ],
    )
    largest = results[-1]
    targets = {
        "growth_ratio_at_most": GROWTH_TARGET,
        "growth_ratio_largest_n": largest["growth_ratio"],
        "growth_verdict": verdict(largest["growth_ratio"], GROWTH_TARGET),
        "growth_ratio_without_fsync_largest_n": largest["growth_ratio_without_fsync"],
        "growth_without_fsync_verdict": verdict(
            largest["growth_ratio_without_fsync"], GROWTH_TARGET
        ),
        "cpu_growth_ratio_largest_n": largest["cpu_growth_ratio"],
        "cpu_growth_verdict": verdict(largest["cpu_growth_ratio"], GROWTH_TARGET),
        "in_memory_growth_ratio": memory["growth_ratio"],
        "in_memory_cpu_growth_ratio": memory["cpu_growth_ratio"],
    }
    print(
        f"\ngrowth at N={largest['steps']}: wall {largest['growth_ratio']} "
        f"({targets['growth_verdict']}, target <= {GROWTH_TARGET}); without fsync "
        f"{largest['growth_ratio_without_fsync']} ({targets['growth_without_fsync_verdict']}); CPU "
        f"{largest['cpu_growth_ratio']} ({targets['cpu_growth_verdict']}); the same loop in "
        f"memory only: wall {memory['growth_ratio']}, CPU {memory['cpu_growth_ratio']}"
    )
    print_breakdown(breakdown)
    if profiled is not None:
        print_profile(profiled)
    write_result(
        "loop_step",
        {
            "small": args.small,
            "backend": args.backend,
            "tool": f"in-process no-op ({NOOP_TOOL}, bench-local plugin)",
            "runs": results,
            "in_memory": memory,
            "cpu_breakdown": breakdown,
            "targets": targets,
            "profile": profiled,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
