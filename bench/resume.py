"""Benchmark: open and fully read a long stored session, against raw decompress + JSON parse.

The session is a real one: ``loop_step.run_loop`` runs the agent loop for
3,000 tool steps (``--small``: 300) with the checkpoint policy on, so the log
has the frame layout a real session has (three small zstd frames per step).
It is built with ``os.fsync`` replaced by a no-op *in this process* -- that
changes how long building takes, not one byte of the file.

Measured, each ``--repeats`` times on a fresh backend instance (the page cache
is warm for every contender alike; cold-cache reads are not measured):

* ``read``: ``open(id, "read")`` + ``read()`` -- find the session, scan and
  decompress every frame (checksums verified), split lines, decode each row,
  check the seq chain, typed-decode every event through the core registry;
* ``raw``: the floor for the same bytes: read the file, zstd-decompress all
  frames in one call, ``msgspec.json.decode`` each line into plain values (no
  validation, no typed structs). The target is ``read / raw <= 1.5``; a
  stdlib ``json.loads`` floor is shown too for scale;
* ``resume → first derive_messages()``: on a booted host, ``ctx.agent.resume``
  (write open: lock, read, crash repair check, barrier, ``Session.restore``,
  attach) and then the first ``session.derive_messages()`` -- the time from
  "open this session" to "the model's context is ready";
* ``restore + derive`` alone, from events already in memory.

Writes ``bench/results/resume.json``.
"""

from __future__ import annotations

import cProfile
import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import zstandard
from _common import (
    file_size,
    fsync_disabled,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    profile_table,
    ratio,
    scratch_dir,
    summary_us,
    threads_inline,
    verdict,
    write_result,
)
from loop_step import run_loop

from dsh_host import Row, open_host
from dsh_host._session import Session

TARGET = 1.5
STEPS = 3000
SMALL_STEPS = 300
REPEATS = 5
SMALL_REPEATS = 3


def raw_msgspec(path: Path) -> int:
    """Floor: decompress every frame and parse every line to plain values (msgspec)."""
    data = path.read_bytes()
    text = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True).decompress(data)
    decode = msgspec.json.decode
    return len([decode(line) for line in text.splitlines()])


def raw_stdlib(path: Path) -> int:
    """The same floor with the standard library's JSON parser, for scale."""
    data = path.read_bytes()
    text = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True).decompress(data)
    return len([json.loads(line) for line in text.splitlines()])


def store_rows(root: Path) -> list[Row]:
    """Just the store: a fresh ``sessionPersistence`` instance per host."""
    return [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
    ]


def host_rows(root: Path) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": [{"text": "unused"}]}),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


async def profile_read(root: Path, sid: str, events: int) -> list[dict[str, Any]]:
    """cProfile of one open + read, the backend's worker-thread part run inline."""
    profile = cProfile.Profile()
    with threads_inline():
        async with open_host(store_rows(root)) as store:
            backend = store.ctx.sessionPersistence
            profile.enable()
            handle = await backend.open(sid, "read")
            await handle.read()
            profile.disable()
            await handle.close()
    return profile_table(profile, events, top=15)


async def measure(
    scratch: Path, steps: int, repeats: int, profile: bool = False
) -> dict[str, Any]:
    root = scratch / "sessions"
    workspace = scratch / "workspace"
    workspace.mkdir()
    start = now_ns()
    with fsync_disabled():
        built = await run_loop(steps, root, workspace, raw=None)
    build_s = (now_ns() - start) / 1e9
    path = Path(built.path)
    sid = built.session_id
    # The first resume appends the `session/end-seed` marker (and makes it durable); do it
    # once up front so every measured repeat reads the same file.
    async with open_host(host_rows(root)) as host:
        agent = await host.ctx.agent.resume(sid)
        await agent.aclose()
    print(f"  built {steps} steps ({built.events} events, {file_size(path):,} bytes) "
          f"in {build_s:.1f} s", flush=True)

    read_ns: list[int] = []
    raw_ns: list[int] = []
    stdlib_ns: list[int] = []
    resume_ns: list[int] = []
    derive_ns: list[int] = []
    restore_ns: list[int] = []
    events = messages = 0
    for _ in range(repeats):
        # Alternate contenders inside each repeat so load spikes hit all of them.
        async with open_host(store_rows(root)) as store:
            backend = store.ctx.sessionPersistence
            t0 = now_ns()
            handle = await backend.open(sid, "read")
            load = await handle.read()
            read_ns.append(now_ns() - t0)
            await handle.close()
        events = len(load.events)

        t0 = now_ns()
        parsed = raw_msgspec(path)
        raw_ns.append(now_ns() - t0)
        if parsed != events + 1:  # + the header line
            raise RuntimeError(f"raw parse saw {parsed} lines, the backend {events} events")

        t0 = now_ns()
        raw_stdlib(path)
        stdlib_ns.append(now_ns() - t0)

        t0 = now_ns()
        session = Session.restore(load.header, load.events, mark_seed_end=False)
        messages = len(session.derive_messages())
        restore_ns.append(now_ns() - t0)

        async with open_host(host_rows(root)) as host:
            t0 = now_ns()
            agent = await host.ctx.agent.resume(sid)
            t1 = now_ns()
            agent.session.derive_messages()
            t2 = now_ns()
            resume_ns.append(t1 - t0)
            derive_ns.append(t2 - t0)
            await agent.aclose()
    profiled = await profile_read(root, sid, events) if profile else None
    return {
        "steps": steps,
        "events": events,
        "messages": messages,
        "log_bytes": file_size(path),
        "build_seconds_without_fsync": round(build_s, 2),
        "repeats": repeats,
        "read": summary_us(read_ns),
        "raw_zstd_msgspec": summary_us(raw_ns),
        "raw_zstd_stdlib_json": summary_us(stdlib_ns),
        "ratio_read_over_raw": ratio(median(read_ns), median(raw_ns)),
        "ratio_read_over_stdlib_raw": ratio(median(read_ns), median(stdlib_ns)),
        "read_us_per_event": round(median(read_ns) / 1e3 / events, 3),
        "raw_us_per_event": round(median(raw_ns) / 1e3 / events, 3),
        "resume": summary_us(resume_ns),
        "resume_to_first_derive": summary_us(derive_ns),
        "restore_and_derive_in_memory": summary_us(restore_ns),
        "profile_read_per_event": profiled,
    }


def ms(summary: dict[str, float]) -> float:
    return round(summary["median_us"] / 1e3, 2)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help=f"steps in the stored session (default {STEPS})")
    p.add_argument("--repeats", type=int, help=f"measurements per contender (default {REPEATS})")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile one open + read (cProfile, worker-thread work inline)",
    )
    args = p.parse_args()
    steps = args.steps or (SMALL_STEPS if args.small else STEPS)
    repeats = args.repeats or (SMALL_REPEATS if args.small else REPEATS)
    with scratch_dir(args.scratch, "resume") as scratch:
        info = machine_info(scratch)
        r = anyio.run(measure, scratch, steps, repeats, args.profile, backend=args.backend)
    print_table(
        f"resume: a {r['steps']}-step session ({r['events']:,} events, {r['log_bytes']:,} bytes "
        f"zstd) -- medians of {r['repeats']}",
        ["what", "ms", "µs/event", "vs raw (msgspec)"],
        [
            ["open + read (typed, validated)", ms(r["read"]), r["read_us_per_event"],
             r["ratio_read_over_raw"]],
            ["raw: zstd + msgspec.json per line", ms(r["raw_zstd_msgspec"]),
             r["raw_us_per_event"], 1.0],
            ["raw: zstd + json.loads per line", ms(r["raw_zstd_stdlib_json"]),
             round(r["raw_zstd_stdlib_json"]["median_us"] / r["events"], 3),
             ratio(r["raw_zstd_stdlib_json"]["median_us"], r["raw_zstd_msgspec"]["median_us"])],
            ["agent.resume (write open, repair check)", ms(r["resume"]), "-", "-"],
            ["resume → first derive_messages()", ms(r["resume_to_first_derive"]), "-", "-"],
            ["Session.restore + derive (in memory)", ms(r["restore_and_derive_in_memory"]),
             "-", "-"],
        ],
    )
    if r["profile_read_per_event"] is not None:
        print_table(
            "profile of one open + read: own time per event (cProfile inflates absolute "
            "times: compare rows)",
            ["function", "calls/event", "own µs/event", "cumulative µs/event"],
            [
                [x["function"], x["calls_per"], x["own_us_per"], x["cumulative_us_per"]]
                for x in r["profile_read_per_event"]
            ],
        )
    targets = {
        "ratio_at_most": TARGET,
        "ratio": r["ratio_read_over_raw"],
        "verdict": verdict(r["ratio_read_over_raw"], TARGET),
    }
    print(
        f"\nread / raw = {r['ratio_read_over_raw']} ({targets['verdict']}, target <= {TARGET}); "
        f"time to first derive_messages(): {ms(r['resume_to_first_derive'])} ms"
    )
    write_result(
        "resume",
        {"small": args.small, "backend": args.backend, **r, "targets": targets, "machine": info},
        args.results_dir,
    )


if __name__ == "__main__":
    main()
