"""Benchmark: what the three checkpoint barriers add to one agent step.

The same scripted loop twice, both persisted by ``session-persistence-jsonl``
(zstd): once with ``session-checkpoint-policy`` and once without it. Without
the policy the backend still writes everything, but only when its 200 ms
window fires, in the background; with it every step waits for three
barriers -- ``agent/pre-step``, ``llm/stream`` (before the request) and
``tools/execute`` (before the body) -- each a ``session/flush`` that ends in
an ``fsync``. The difference per step is the price of "no side effect
without a durable record first".

A step is one model response with one tool call; the tool is the bench-local
in-process no-op (``_common:NoopToolPlugin``), so the figure is the harness,
not a subprocess. Per step (``agent/step-start`` to the next) the bench
records wall time and ``os.fsync`` calls (wrapped in this process). With the
policy it also times each barrier: ``ctx.sessions.flush`` is wrapped in this
process and each call is attributed to the barrier whose listener awaited it.
The first step of each turn (it publishes the log) is left out. Variants
alternate (ABBA over the repeats) so the disk's weather hits both alike.
One raw ``write`` + ``fsync`` of a small frame on a kept-open file is
sampled in the same run for scale.

Reported: median ms per step with and without the policy, the overhead per
step (difference of medians) and its ratio, fsyncs per step, each barrier's
median time and fsyncs per call, and the part of a policy step spent outside
its barriers (what remains is the loop itself plus the write-behind window
being armed and cancelled around every barrier). Writes
``bench/results/checkpoint_overhead.json``. No assertion: numbers are reported.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from _common import (
    NOOP_TOOL,
    FsyncCounter,
    RawFile,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    ratio,
    scratch_dir,
    summary_us,
    write_result,
)

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._session.events import CompletedReason

BARRIERS = ("pre-step", "llm", "tool")
#: the policy's listener functions, by barrier (used to attribute each flush)
_LISTENERS = {"before_step": "pre-step", "_flush_then_relay": "llm", "around_execute": "tool"}


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
    responses.append({"text": "All items checked."})
    return responses


def rows(root: Path, steps: int, policy: bool) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        *([Row(name="session-checkpoint-policy")] if policy else []),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": script(steps)}),
        # one turn of `steps` tool steps: lift the loop guard's per-turn step limit (200)
        Row(
            name="agent",
            config={"provider": "scripted", "model": "scripted", "maxStepsPerTurn": steps + 1},
        ),
        Row(id="bench-tool", name="_common:NoopToolPlugin"),
    ]


def _barrier_of(frame: Any) -> str:
    while frame is not None:
        name = _LISTENERS.get(frame.f_code.co_name)
        if name is not None and "checkpoint_policy" in frame.f_code.co_filename:
            return name
        frame = frame.f_back
    return "other"


def _scripted_requests(host: PluginHost) -> list[Any]:
    for fiber in host.fibers:
        if fiber.id == "model":
            requests: list[Any] = fiber.instance.adapter.requests
            return requests
    raise KeyError("model")


@dataclass
class Variant:
    """Samples of one composition over every repeat."""

    policy: bool
    step_ns: list[int] = field(default_factory=list)
    step_fsyncs: list[int] = field(default_factory=list)
    barrier_ns: dict[str, list[int]] = field(default_factory=lambda: {b: [] for b in BARRIERS})
    barrier_fsyncs: dict[str, list[int]] = field(default_factory=lambda: {b: [] for b in BARRIERS})
    #: per step: its wall time minus the time spent inside its barriers
    outside_barriers_ns: list[int] = field(default_factory=list)
    turns: int = 0


async def run_turn(variant: Variant, steps: int, root: Path, workspace: Path, n: int) -> None:
    counter = FsyncCounter()
    marks: list[tuple[int, int, int]] = []  # (wall, fsyncs, ns inside barriers so far)
    inside = [0]
    with counter.installed():
        async with open_host(rows(root, steps, variant.policy)) as host:
            ctx = host.ctx
            requests = _scripted_requests(host)
            store = ctx.sessions
            real_flush: Callable[[Any], Awaitable[bool]] = store.flush

            async def timed_flush(session: Any) -> bool:
                barrier = _barrier_of(sys._getframe(1))
                calls, start = counter.calls, now_ns()
                try:
                    return await real_flush(session)
                finally:
                    elapsed = now_ns() - start
                    inside[0] += elapsed
                    # the step this checkpoint serves (pre-step runs before its step opens);
                    # tool steps 2..steps count, step 1 publishes the log
                    step = len(marks) + (1 if barrier == "pre-step" else 0)
                    if barrier in variant.barrier_ns and 2 <= step <= steps:
                        variant.barrier_ns[barrier].append(elapsed)
                        variant.barrier_fsyncs[barrier].append(counter.calls - calls)

            store.flush = timed_flush

            def on_step_start(_event: Any) -> None:
                requests.clear()  # the scripted adapter keeps requests; a real one does not
                marks.append((now_ns(), counter.calls, inside[0]))

            ctx.on("agent/step-start", on_step_start)
            agent = ctx.agent.create(session_id=f"bench-checkpoint-{n}", cwd=str(workspace))
            reason = await agent.run_turn("Check every item, one tool call per item.")
            if reason != CompletedReason():
                raise RuntimeError(f"the benchmark turn did not complete: {reason!r}")
            await agent.aclose()
    if len(marks) != steps + 1:
        raise RuntimeError(f"expected {steps + 1} step starts, saw {len(marks)}")
    # marks[k] opens step k+1; tool step k+1 ends where step k+2 opens. Step 1 publishes
    # the log (and, with the policy, waits for it), so it is left out of the figures.
    for (t0, f0, b0), (t1, f1, b1) in list(pairwise(marks))[1:]:
        variant.step_ns.append(t1 - t0)
        variant.step_fsyncs.append(f1 - f0)
        variant.outside_barriers_ns.append(t1 - t0 - (b1 - b0))
    variant.turns += 1


def raw_fsync_samples(path: Path, count: int) -> list[int]:
    raw = RawFile(path)
    try:
        return [raw.write_fsync(b"x" * 512) for _ in range(count)]
    finally:
        raw.close()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="tool steps per turn (default 200)")
    p.add_argument("--repeats", type=int, default=None, help="turns per variant (default 4)")
    args = p.parse_args()
    steps = args.steps or (30 if args.small else 200)
    repeats = args.repeats or (2 if args.small else 4)
    with_policy, without = Variant(policy=True), Variant(policy=False)
    raw_ns: list[int] = []

    with scratch_dir(args.scratch, "checkpoint") as scratch:
        workspace = scratch / "ws"
        workspace.mkdir()

        async def run_all() -> None:
            n = 0
            for repeat in range(repeats):
                order = (with_policy, without) if repeat % 2 == 0 else (without, with_policy)
                for variant in order:
                    n += 1
                    await run_turn(variant, steps, scratch / f"root-{n}", workspace, n)
                raw_ns.extend(raw_fsync_samples(scratch / f"raw-{repeat}", 20))

        anyio.run(run_all, backend=args.backend)
        info = machine_info(scratch)

    on_ms = median(with_policy.step_ns) / 1e6
    off_ms = median(without.step_ns) / 1e6
    overhead_ms = on_ms - off_ms
    barrier_ms = {b: median(with_policy.barrier_ns[b]) / 1e6 for b in BARRIERS}
    raw_ms = median(raw_ns) / 1e6
    outside_ms = median(with_policy.outside_barriers_ns) / 1e6
    print_table(
        f"checkpoint overhead per agent step ({steps} tool steps x {repeats} turns per "
        f"variant, JSONL zstd, {args.backend})",
        ["variant", "ms/step (median)", "p90 ms", "fsyncs/step"],
        [
            [
                "with session-checkpoint-policy",
                round(on_ms, 3),
                round(summary_us(with_policy.step_ns)["p90_us"] / 1e3, 3),
                median(with_policy.step_fsyncs),
            ],
            [
                "without (200 ms window only)",
                round(off_ms, 3),
                round(summary_us(without.step_ns)["p90_us"] / 1e3, 3),
                median(without.step_fsyncs),
            ],
            [
                "with the policy, outside its barriers",
                round(outside_ms, 3),
                round(summary_us(with_policy.outside_barriers_ns)["p90_us"] / 1e3, 3),
                "-",
            ],
            ["overhead of the three barriers", round(overhead_ms, 3), "-", "-"],
        ],
    )
    print_table(
        "time inside each barrier (with the policy; median per call)",
        ["barrier", "ms/call", "p90 ms", "fsyncs/call", "x raw write+fsync"],
        [
            [
                b,
                round(barrier_ms[b], 3),
                round(summary_us(with_policy.barrier_ns[b])["p90_us"] / 1e3, 3),
                median(with_policy.barrier_fsyncs[b]),
                ratio(barrier_ms[b], raw_ms),
            ]
            for b in BARRIERS
        ]
        + [["raw write+fsync (512 B, fd kept open)", round(raw_ms, 3), "-", 1, 1.0]],
    )
    write_result(
        "checkpoint_overhead",
        {
            "small": args.small,
            "backend": args.backend,
            "steps_per_turn": steps,
            "turns_per_variant": repeats,
            "with_policy": {
                "step": summary_us(with_policy.step_ns),
                "fsyncs_per_step_median": median(with_policy.step_fsyncs),
            },
            "without_policy": {
                "step": summary_us(without.step_ns),
                "fsyncs_per_step_median": median(without.step_fsyncs),
            },
            "with_policy_outside_barriers": summary_us(with_policy.outside_barriers_ns),
            "overhead_per_step_ms": round(overhead_ms, 3),
            "overhead_ratio": ratio(on_ms, off_ms),
            "barriers": {
                b: {
                    "flush": summary_us(with_policy.barrier_ns[b]),
                    "fsyncs_per_call_median": median(with_policy.barrier_fsyncs[b]),
                }
                for b in BARRIERS
            },
            "sum_of_barrier_medians_ms": round(sum(barrier_ms.values()), 3),
            "raw_write_fsync": summary_us(raw_ns),
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
