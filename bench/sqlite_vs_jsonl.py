"""Benchmark: flush latency and resume time, SQLite vs JSONL, on one realistic session.

What it measures (issue 17: the SQLite backend, the storage seam's worked example):

1. **Flush latency** — ``append(batch)`` then ``flush()`` on a write handle, timed
   to the flush's return (the durability barrier: a zstd frame written and fsynced for
   JSONL; a ``BEGIN IMMEDIATE … COMMIT`` in WAL mode with ``synchronous=FULL`` for
   SQLite). Two batch shapes: one event per flush and one whole turn (12 events).
2. **Resume time** — ``open(id, "write")`` + ``read()`` + ``close()`` and
   ``open(id, "read")`` + ``read()`` of the stored session.

The backends take turns round by round (postgres_vs_jsonl's ``measure_flushes`` and
``measure_resume``), so the shared machine's load falls on both alike; the ratio
SQLite / JSONL is the figure. The scratch directory must be on a real disk (``fsync``
on tmpfs is free).

Run: ``python bench/sqlite_vs_jsonl.py [--small] [--turns N] [--repeats N]``. Prints tables
and writes ``bench/results/sqlite_vs_jsonl.json``. Numbers are reported, not asserted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio
from _common import machine_info, print_table, ratio, scratch_dir, write_result
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_sqlite import SqliteSessionPersistence
from postgres_vs_jsonl import (
    Factory,
    measure_flushes,
    measure_resume,
    print_flush_table,
    realistic_events,
    session_args,
    summary_ms,
)


async def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    events = realistic_events(args.turns)
    factories: dict[str, Factory] = {
        "jsonl (zstd)": lambda: JsonlSessionPersistence(str(scratch / "jsonl")),
        "sqlite (wal, synchronous=FULL)": lambda: SqliteSessionPersistence(
            str(scratch / "sqlite" / "sessions.sqlite3")
        ),
    }
    single = await measure_flushes(factories, events[: args.single_flushes], 1, "one")
    turns = await measure_flushes(factories, events, 12, "turns")
    resume = await measure_resume(factories, "turns", args.repeats, len(events))
    flush = {
        name: {
            "one_event": summary_ms(single[name]),
            "one_turn_12_events": summary_ms(turns[name]),
        }
        for name in factories
    }
    jsonl, sqlite = flush.values()
    return {
        "session": {"events": len(events)},
        "flush": flush,
        "resume": {
            name: {key: summary_ms(samples) for key, samples in figures.items()}
            for name, figures in resume.items()
        },
        "ratio_sqlite_over_jsonl": {
            shape: ratio(sqlite[shape]["median_ms"], jsonl[shape]["median_ms"])
            for shape in ("one_event", "one_turn_12_events")
        },
    }


def main() -> None:
    args = session_args(__doc__.splitlines()[0])
    with scratch_dir(args.scratch, "sqlite-vs-jsonl") as scratch:
        info = machine_info(scratch)
        results = anyio.run(run, args, scratch, backend=args.backend)
    print(f"session: {results['session']['events']} events")
    print_flush_table(results["flush"])
    print_table(
        "resume, ms",
        ["backend", "open(write)+read+close: median", "open(read)+read: median"],
        [
            [name, r["open_write_read_close"]["median_ms"], r["open_read_read"]["median_ms"]]
            for name, r in results["resume"].items()
        ],
    )
    print("sqlite / jsonl flush medians:", results["ratio_sqlite_over_jsonl"])
    write_result(
        "sqlite_vs_jsonl",
        {"small": args.small, "backend": args.backend, **results, "machine": info},
        args.results_dir,
    )


if __name__ == "__main__":
    main()
