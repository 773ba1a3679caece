"""Benchmark: the host's own costs -- around-chain dispatch per hook, and the append rate.

1. **Around-chain dispatch.** A WATERFALL event (the kind ``tools/execute``,
   ``agent/pre-step`` and ``approval/request`` are) with K = 0, 1, 2, 4, 8, 16
   pass-through listeners (``async def h(arg, next): return await next()``).
   The per-hook cost is the least-squares slope of "µs per dispatch" over K:
   what one more plugin wrapping a hook adds to every call (target <= 20 µs).
   K values are interleaved inside every repeat so drift hits all alike. The
   same for the STREAM WATERFALL (``llm/stream``): K relaying async
   generators around a 100-chunk stream, reported per hook *per chunk*.
   Both anyio backends are measured (trio is the default).
2. **Append rate.** ``Session.append`` of the realistic 12-event turn mix of
   ``bench/session_append.py`` (its ``bench_append`` is reused as is): a
   detached session, payloads built before the clock (target >= 100k
   events/s, median run). For scale, the same mix appended to a *live*
   session of a host with ``session-persistence-jsonl`` listening (each event
   is also encoded to its JSONL line; nothing is written until the flush
   after the clock stops).

Writes ``bench/results/host.json``.
"""

from __future__ import annotations

import cProfile
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _common import (
    cpu_ns,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    profile_table,
    scratch_dir,
    verdict,
    write_result,
)
from session_append import EVENTS_PER_TURN, bench_append, turn_payloads

from dsh_host import EventMode, Row, open_host
from dsh_host._context import Context
from dsh_host._session import Session

HOOK_TARGET_US = 20.0
APPEND_TARGET = 100_000
HOOK_COUNTS = (0, 1, 2, 4, 8, 16)
STREAM_CHUNKS = 100


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


async def _passthrough(arg: Any, next_: Callable[[], Awaitable[Any]]) -> Any:
    return await next_()


def _relay_hook(arg: Any, next_: Callable[[], AsyncIterator[int]]) -> AsyncIterator[int]:
    async def relay() -> AsyncIterator[int]:
        async for chunk in next_():
            yield chunk

    return relay()


async def _default() -> int:
    return 0


def _default_stream(arg: Any) -> AsyncIterator[int]:
    async def chunks() -> AsyncIterator[int]:
        for i in range(STREAM_CHUNKS):
            yield i

    return chunks()


async def dispatch_costs(dispatches: int, stream_calls: int, repeats: int) -> dict[str, Any]:
    """µs per dispatch for each K (median over repeats), and the per-hook slopes."""
    per_k: dict[int, list[float]] = {k: [] for k in HOOK_COUNTS}
    per_k_stream: dict[int, list[float]] = {k: [] for k in HOOK_COUNTS}
    async with open_host([]) as host:
        ctx: Context = host.ctx
        for k in HOOK_COUNTS:
            ctx.declare_event(f"bench/around-{k}", EventMode.WATERFALL, 1)
            ctx.declare_event(f"bench/stream-{k}", EventMode.STREAM_WATERFALL, 1)
            for _ in range(k):
                ctx.on(f"bench/around-{k}", _passthrough)
                ctx.on(f"bench/stream-{k}", _relay_hook)
        for k in HOOK_COUNTS:  # warm-up
            for _ in range(100):
                await ctx.waterfall(f"bench/around-{k}", None, _default)
        gc.collect()
        for _ in range(repeats):
            for k in HOOK_COUNTS:
                name = f"bench/around-{k}"
                start = now_ns()
                for _ in range(dispatches):
                    await ctx.waterfall(name, None, _default)
                per_k[k].append((now_ns() - start) / dispatches / 1e3)
            for k in HOOK_COUNTS:
                name = f"bench/stream-{k}"
                start = now_ns()
                for _ in range(stream_calls):
                    async for _chunk in ctx.waterfall_stream(name, None, _default_stream):
                        pass
                per_k_stream[k].append((now_ns() - start) / stream_calls / 1e3)
    ks = [float(k) for k in HOOK_COUNTS]
    med = [median(per_k[k]) for k in HOOK_COUNTS]
    med_stream = [median(per_k_stream[k]) for k in HOOK_COUNTS]
    return {
        "dispatches_per_batch": dispatches,
        "repeats": repeats,
        "us_per_dispatch_by_hooks": {
            str(k): round(v, 3) for k, v in zip(HOOK_COUNTS, med, strict=True)
        },
        "us_per_hook": round(slope(ks, med), 3),
        "stream_calls_per_batch": stream_calls,
        "stream_chunks": STREAM_CHUNKS,
        "stream_us_per_call_by_hooks": {
            str(k): round(v, 2) for k, v in zip(HOOK_COUNTS, med_stream, strict=True)
        },
        "stream_us_per_hook_per_chunk": round(slope(ks, med_stream) / STREAM_CHUNKS, 3),
    }


async def live_append(scratch: Path, events: int) -> dict[str, Any]:
    """Append rate into a live session with the JSONL backend listening (no write timed)."""
    turns = events // EVENTS_PER_TURN
    payloads = [p for t in range(1, turns + 1) for p in turn_payloads(t)]
    workspace = scratch / "workspace"
    workspace.mkdir(exist_ok=True)
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(scratch / "sessions")}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx
        session = ctx.sessions.create("bench-live-append", meta={"cwd": str(workspace)})
        await ctx.sessions.flush(session)  # bound and published before the clock starts
        gc.collect()
        start, cpu_start = now_ns(), cpu_ns()
        for kind, data, op in payloads:
            session.append(kind, data, surface_op=op)
        elapsed, cpu = now_ns() - start, cpu_ns() - cpu_start
        await ctx.sessions.flush(session)
    return {
        "events": len(payloads),
        "events_per_second": round(len(payloads) / (elapsed / 1e9)),
        "events_per_cpu_second": round(len(payloads) / (cpu / 1e9)),
        "us_per_event": round(elapsed / len(payloads) / 1e3, 3),
    }


def profile_append(events: int) -> list[dict[str, Any]]:
    """cProfile of detached ``Session.append`` of the same mix (payloads built first)."""
    turns = events // EVENTS_PER_TURN
    payloads = [p for t in range(1, turns + 1) for p in turn_payloads(t)]
    session = Session.create("bench-append-profile")
    profile = cProfile.Profile()
    profile.enable()
    for kind, data, op in payloads:
        session.append(kind, data, surface_op=op)
    profile.disable()
    return profile_table(profile, len(payloads), top=15)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--profile", action="store_true", help="also profile the detached append (cProfile)"
    )
    args = p.parse_args()
    if args.small:
        dispatches, stream_calls, repeats = 2_000, 100, 3
        append_events, append_repeats, live_events = 24_000, 2, 6_000
    else:
        dispatches, stream_calls, repeats = 20_000, 1_000, 5
        append_events, append_repeats, live_events = 100_000, 5, 24_000
    backends = [args.backend] + [b for b in ("trio", "asyncio") if b != args.backend]
    dispatch: dict[str, Any] = {}
    for backend in backends:
        dispatch[backend] = anyio.run(
            dispatch_costs, dispatches, stream_calls, repeats, backend=backend
        )
        print(f"  dispatch on {backend}: done", flush=True)
    append = bench_append(append_events, append_repeats)
    print("  detached append: done", flush=True)
    with scratch_dir(args.scratch, "host") as scratch:
        info = machine_info(scratch)
        live = anyio.run(live_append, scratch, live_events, backend=args.backend)

    print_table(
        "around-chain dispatch (WATERFALL), µs per dispatch by number of pass-through hooks",
        ["backend", *[f"K={k}" for k in HOOK_COUNTS], "µs per hook"],
        [
            [b, *[d["us_per_dispatch_by_hooks"][str(k)] for k in HOOK_COUNTS], d["us_per_hook"]]
            for b, d in dispatch.items()
        ],
    )
    print_table(
        f"stream waterfall (llm/stream shape), µs per {STREAM_CHUNKS}-chunk stream",
        ["backend", *[f"K={k}" for k in HOOK_COUNTS], "µs per hook per chunk"],
        [
            [
                b,
                *[d["stream_us_per_call_by_hooks"][str(k)] for k in HOOK_COUNTS],
                d["stream_us_per_hook_per_chunk"],
            ]
            for b, d in dispatch.items()
        ],
    )
    print_table(
        "append rate (12-event turn mix of session_append.py)",
        ["what", "events", "events/s", "µs/event", "events/CPU-s"],
        [
            [
                f"detached Session.append (median of {append['repeats']})",
                append["events"],
                append["events_per_second_median"],
                append["us_per_event_median"],
                append["events_per_cpu_second_median"],
            ],
            [
                "live session + JSONL listener (encode, no write)",
                live["events"],
                live["events_per_second"],
                live["us_per_event"],
                live["events_per_cpu_second"],
            ],
        ],
    )
    profiled = profile_append(append_events // 4) if args.profile else None
    if profiled is not None:
        print_table(
            "profile of detached Session.append: own time per event (cProfile inflates "
            "absolute times: compare rows)",
            ["function", "calls/event", "own µs/event", "cumulative µs/event"],
            [
                [x["function"], x["calls_per"], x["own_us_per"], x["cumulative_us_per"]]
                for x in profiled
            ],
        )
    worst_hook = max(d["us_per_hook"] for d in dispatch.values())
    rate = append["events_per_second_median"]
    targets = {
        "us_per_hook_at_most": HOOK_TARGET_US,
        "us_per_hook_worst_backend": worst_hook,
        "hook_verdict": verdict(worst_hook, HOOK_TARGET_US),
        "append_events_per_second_at_least": APPEND_TARGET,
        "append_events_per_second_median": rate,
        "append_verdict": verdict(rate, APPEND_TARGET, at_most=False),
        "append_events_per_cpu_second_median": append["events_per_cpu_second_median"],
        "append_cpu_verdict": verdict(
            append["events_per_cpu_second_median"], APPEND_TARGET, at_most=False
        ),
    }
    print(
        f"\nper hook: {worst_hook} µs (worst backend; {targets['hook_verdict']}, target <= "
        f"{HOOK_TARGET_US}); append: {rate:,} events/s ({targets['append_verdict']}, target >= "
        f"{APPEND_TARGET:,}; per CPU-second {append['events_per_cpu_second_median']:,}: "
        f"{targets['append_cpu_verdict']})"
    )
    write_result(
        "host",
        {
            "small": args.small,
            "backend": args.backend,
            "dispatch": dispatch,
            "append_detached": append,
            "append_live_jsonl": live,
            "profile_append_per_event": profiled,
            "targets": targets,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
