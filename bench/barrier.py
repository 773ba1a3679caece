"""Benchmark: one durability barrier (``flush()``) against a raw ``write`` + ``fsync`` of its bytes.

The barrier is the real path: ``await ctx.sessions.flush(session)`` on a live
session of a host with ``session-persistence-jsonl`` (zstd) -- the
``session/flush`` dispatch, the write handle's drain lock, one zstd frame,
the worker-thread hop, ``open``/size check/``write``/``fsync``/``close``.
Before each barrier a batch of events is appended (not timed as the barrier;
the admission cost is reported separately): the event mix of
``bench/session_append.py`` (a turn = user message, request header, assistant
message with stream records and a tool call, tool call/result, a second
assistant message, step and turn markers), cut into batches of 1, 3, 12 and
120 events. 3 events is what one checkpoint of the agent loop typically
drains (e.g. ``assistant/message`` + ``tool/call``), 12 is a whole turn, 120
a burst.

The physical limit is measured in the same run on the same disk: the exact
bytes the barrier appended (read back from the log) are appended to another
file with one ``write`` + ``fsync`` on a descriptor kept open. Barrier and raw
samples alternate (ABBA) so the disk's weather hits both alike; the figure is
the ratio of the medians (target <= 1.5, issue 25; 1.15 in issue 10), plus the
median of per-pair ratios.

More baselines, same bytes, same run: the raw append with ``open``/``close``
around it; the raw ``write`` + ``fsync`` handed to a worker thread with
``dsh_host._persistence.offload.run_sync`` (the hop the JSONL barrier makes: the least
a barrier can cost without blocking the event loop); the same with
``anyio.to_thread.run_sync`` (the hop it made before issue 25). A breakdown says
where the rest goes: the barrier split at its own ``fsync`` (before / during /
after, from ``os.fsync`` wrapped in this process), an empty barrier (nothing
pending: dispatch + lock only), one no-op thread hop, and the zstd compression of
the batch.
Writes ``bench/results/barrier.json``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import zstandard
from _common import (
    FsyncCounter,
    RawFile,
    file_size,
    machine_info,
    median,
    now_ns,
    parser,
    print_table,
    ratio,
    read_range,
    real_fsync,
    scratch_dir,
    summary_us,
    verdict,
    write_result,
)
from session_append import turn_payloads

from dsh_host import Row, open_host
from dsh_host._persistence import offload

TARGET = 1.5
BATCHES = (1, 3, 12, 120)
PRIMARY = 3
SAMPLES = 150
SMALL_SAMPLES = 25
SESSION_ID = "bench-barrier"


def payload_stream() -> Iterator[tuple[str, Any, Any]]:
    """An endless, valid event stream (turn after turn); any cut of it is a valid batch."""
    turn = 0
    while True:
        turn += 1
        yield from turn_payloads(turn)


def raw_reopen(path: Path, data: bytes) -> int:
    """Raw append the way a write handle must do it: open, size check, write, fsync, close."""
    start = now_ns()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, size, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        real_fsync(fd)
    finally:
        os.close(fd)
    return now_ns() - start


async def measure(scratch: Path, samples: int) -> dict[str, Any]:
    counter = FsyncCounter(keep_spans=True)
    raw = RawFile(scratch / "raw-baseline.bin")
    try:
        with counter.installed():
            return await _measure(scratch, samples, counter, raw)
    finally:
        raw.close()


async def _measure(
    scratch: Path, samples: int, counter: FsyncCounter, raw: RawFile
) -> dict[str, Any]:
    workspace = scratch / "workspace"
    workspace.mkdir()
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(scratch / "sessions")}),
    ]
    stream = payload_stream()
    reopen_path = scratch / "raw-reopen.bin"
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    decompressor = zstandard.ZstdDecompressor()
    batches: dict[str, Any] = {}
    async with open_host(rows) as host:
        ctx = host.ctx
        session = ctx.sessions.create(SESSION_ID, meta={"cwd": str(workspace)})

        def append(count: int) -> int:
            start = now_ns()
            for _ in range(count):
                kind, data, op = next(stream)
                session.append(kind, data, surface_op=op)
            return now_ns() - start

        # Warm-up: publish the log (temp file, link, directory fsyncs) and a few frames.
        for _ in range(5):
            append(12)
            await ctx.sessions.flush(session)
        path = ctx.sessionPersistence.owner(SESSION_ID).lease.path
        parts: list[tuple[int, int, int]] = []

        async def barrier() -> tuple[int, bytes]:
            before = file_size(path)
            first = len(counter.spans)
            start = now_ns()
            await ctx.sessions.flush(session)
            end = now_ns()
            spans = counter.spans[first:]
            if len(spans) != 1:
                raise RuntimeError(f"expected one fsync per barrier, saw {len(spans)}")
            sync_start, sync_end = spans[0]
            parts.append((sync_start - start, sync_end - sync_start, end - sync_end))
            return end - start, read_range(path, before, file_size(path))

        empty: list[int] = []
        hops: list[int] = []
        for _ in range(samples):
            start = now_ns()
            await ctx.sessions.flush(session)
            empty.append(now_ns() - start)
            start = now_ns()
            await offload.run_sync(lambda: None)
            hops.append(now_ns() - start)

        for size in BATCHES:
            flush_ns: list[int] = []
            raw_ns: list[int] = []
            reopen_ns: list[int] = []
            threaded_ns: list[int] = []
            anyio_ns: list[int] = []
            admit_ns: list[int] = []
            compress_ns: list[int] = []
            frame_bytes: list[int] = []
            plain_bytes: list[int] = []
            parts.clear()
            last = b""
            for i in range(samples):
                admit_ns.append(append(size))
                if i % 2 == 0 or not last:
                    elapsed, last = await barrier()
                    flush_ns.append(elapsed)
                    raw_ns.append(raw.write_fsync(last))
                else:  # the other order, with the previous batch's bytes (same size class)
                    raw_ns.append(raw.write_fsync(last))
                    elapsed, last = await barrier()
                    flush_ns.append(elapsed)
                reopen_ns.append(raw_reopen(reopen_path, last))
                start = now_ns()
                await offload.run_sync(raw.write_fsync, last)
                threaded_ns.append(now_ns() - start)
                start = now_ns()
                await anyio.to_thread.run_sync(raw.write_fsync, last)
                anyio_ns.append(now_ns() - start)
                plain = decompressor.decompress(last)
                start = now_ns()
                compressor.compress(plain)
                compress_ns.append(now_ns() - start)
                frame_bytes.append(len(last))
                plain_bytes.append(len(plain))
            pair_ratios = [f / r for f, r in zip(flush_ns, raw_ns, strict=True)]
            batches[str(size)] = {
                "events_per_batch": size,
                "frame_bytes_median": round(median(frame_bytes)),
                "plaintext_bytes_median": round(median(plain_bytes)),
                "flush": summary_us(flush_ns),
                "raw_write_fsync": summary_us(raw_ns),
                "raw_open_write_fsync_close": summary_us(reopen_ns),
                "raw_write_fsync_on_worker_thread": summary_us(threaded_ns),
                "raw_write_fsync_on_anyio_thread": summary_us(anyio_ns),
                "ratio": ratio(median(flush_ns), median(raw_ns)),
                "ratio_median_of_pairs": round(median(pair_ratios), 3),
                "ratio_vs_raw_with_open_close": ratio(median(flush_ns), median(reopen_ns)),
                "ratio_vs_raw_on_worker_thread": ratio(median(flush_ns), median(threaded_ns)),
                "ratio_vs_raw_on_anyio_thread": ratio(median(flush_ns), median(anyio_ns)),
                "overhead_us": round((median(flush_ns) - median(raw_ns)) / 1e3, 1),
                # The barrier split at its own fsync: what runs before it (dispatch, lock,
                # frame, hand-off to the worker thread, open/write), the fsync itself, and
                # what runs after it (close, hand-back, waking the event loop).
                "flush_before_fsync": summary_us([p[0] for p in parts]),
                "flush_fsync": summary_us([p[1] for p in parts]),
                "flush_after_fsync": summary_us([p[2] for p in parts]),
                "compress": summary_us(compress_ns),
                "admit_us_per_event": round(median(admit_ns) / size / 1e3, 2),
            }
            print(f"  batch {size}: {len(flush_ns)} samples", flush=True)
    fixed = {"empty_flush": summary_us(empty), "thread_hop": summary_us(hops)}
    fixed.update(await lane_decision(samples))
    return {"batches": batches, "fixed_costs": fixed}


#: Sockets registered with the event loop while the lane's inline call is timed (a server
#: with that many clients), beside none.
REGISTERED_SOCKETS = 500


async def lane_decision(samples: int) -> dict[str, Any]:
    """What deciding inline costs (trio only: asyncio always hops): one inline
    ``BarrierLane.run`` of a no-op, with no socket and with ``REGISTERED_SOCKETS`` sockets
    registered (each awaited by a task), and trio's public runnable count
    (``current_statistics()``, which walks every registered descriptor) at both sizes: what
    a lane reading readiness through the public API would add to every barrier
    (docs/decisions.md D41)."""
    import sniffio

    if sniffio.current_async_library() != "trio":
        return {}
    import socket

    import trio

    lane = offload.BarrierLane(1.0)
    out: dict[str, Any] = {}
    for registered in (0, REGISTERED_SOCKETS):
        pairs = [socket.socketpair() for _ in range(registered)]
        try:
            async with trio.open_nursery() as nursery:
                for left, _ in pairs:
                    nursery.start_soon(trio.lowlevel.wait_readable, left)
                await trio.sleep(0.05)  # every waiter has registered its socket
                inline: list[int] = []
                public: list[int] = []
                for _ in range(samples * 20):
                    start = now_ns()
                    await lane.run(int)
                    inline.append(now_ns() - start)
                    start = now_ns()
                    trio.lowlevel.current_statistics()
                    public.append(now_ns() - start)
                nursery.cancel_scope.cancel()
        finally:
            for left, right in pairs:
                left.close()
                right.close()
        out[f"lane_inline_{registered}_sockets"] = summary_us(inline)
        out[f"public_runnable_count_{registered}_sockets"] = summary_us(public)
    return out


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    samples = SMALL_SAMPLES if args.small else SAMPLES
    with scratch_dir(args.scratch, "barrier") as scratch:
        info = machine_info(scratch)
        measured = anyio.run(measure, scratch, samples, backend=args.backend)
    batches = measured["batches"]
    print_table(
        "barrier: flush() of one batch vs raw write+fsync of the same bytes (medians, µs)",
        [
            "events",
            "frame B",
            "flush µs",
            "raw µs",
            "ratio",
            "pair ratio",
            "raw on thread µs",
            "vs thread",
            "raw on anyio thread µs",
            "overhead µs",
            "before fsync",
            "its fsync",
            "after fsync",
            "zstd µs",
            "append µs/ev",
        ],
        [
            [
                b["events_per_batch"],
                b["frame_bytes_median"],
                b["flush"]["median_us"],
                b["raw_write_fsync"]["median_us"],
                b["ratio"],
                b["ratio_median_of_pairs"],
                b["raw_write_fsync_on_worker_thread"]["median_us"],
                b["ratio_vs_raw_on_worker_thread"],
                b["raw_write_fsync_on_anyio_thread"]["median_us"],
                b["overhead_us"],
                b["flush_before_fsync"]["median_us"],
                b["flush_fsync"]["median_us"],
                b["flush_after_fsync"]["median_us"],
                b["compress"]["median_us"],
                b["admit_us_per_event"],
            ]
            for b in batches.values()
        ],
    )
    fixed = measured["fixed_costs"]
    print_table(
        "fixed costs inside every barrier (medians, µs)",
        ["part", "median µs", "p10 µs", "p90 µs"],
        [
            [name, s["median_us"], s["p10_us"], s["p90_us"]]
            for name, s in (
                ("flush with nothing pending (dispatch + lock)", fixed["empty_flush"]),
                ("one worker-thread hop", fixed["thread_hop"]),
            )
        ]
        + [
            [name.replace("_", " "), s["median_us"], s["p10_us"], s["p90_us"]]
            for name, s in fixed.items()
            if name.startswith(("lane_inline", "public_runnable"))
        ]
        + [
            [f"raw append with open/close, {b['events_per_batch']} events"]
            + [b["raw_open_write_fsync_close"][k] for k in ("median_us", "p10_us", "p90_us")]
            for b in batches.values()
        ],
    )
    primary = batches[str(PRIMARY)]
    targets = {
        "ratio_at_most": TARGET,
        "primary_batch_events": PRIMARY,
        "primary_ratio": primary["ratio"],
        "verdict": verdict(primary["ratio"], TARGET),
        "every_batch": {k: verdict(b["ratio"], TARGET) for k, b in batches.items()},
    }
    print(
        f"\nbarrier ratio at {PRIMARY} events: {primary['ratio']} ({targets['verdict']}, "
        f"target <= {TARGET}); per batch size: {targets['every_batch']}"
    )
    write_result(
        "barrier",
        {
            "small": args.small,
            "backend": args.backend,
            "samples_per_batch": samples,
            **measured,
            "targets": targets,
            "machine": info,
        },
        args.results_dir,
    )


if __name__ == "__main__":
    main()
