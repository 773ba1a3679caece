"""Benchmark: flush latency and resume time, PostgreSQL vs JSONL, on one realistic session.

What it measures (issue 11's done-criterion):

1. **Flush latency** — ``append(batch)`` then ``flush()`` on a write handle, timed
   from before the append to the flush's return (the durability barrier: fsync
   for JSONL, a ``synchronous_commit = on`` commit for PostgreSQL). Two batch
   shapes: one event per flush (a checkpoint right after a ``tool/call``) and
   one whole turn (12 events) per flush.
2. **Resume time** — ``open(id, "write")`` + ``read()`` + ``close()`` of the
   stored session (what a resumer pays before it can append closers), and a
   plain ``open(id, "read")`` + ``read()``.
3. **Event storage** — PostgreSQL ``text`` (the default) vs ``jsonb``: the same
   flushes and reads with the event column typed ``jsonb``.
4. **The thread hop** — the backend runs blocking psycopg on worker threads
   (psycopg's async API is asyncio-only and the host defaults to trio). Measured:
   an empty ``anyio.to_thread.run_sync`` round trip, and, on asyncio, the same
   one-row autocommit INSERT through ``psycopg.AsyncConnection`` vs through the
   sync API on a worker thread.

The session: ``--turns`` turns of ``turn/start, user/message, step/start,
request/header, assistant/message (text + tool call + stream records),
tool/call, tool/result (~4 KB of tool output), step/end, step/start,
assistant/message, step/end, turn/end``.

Backends: JSONL (zstd and raw) in a scratch directory on a real disk (``fsync``
on tmpfs is free), PostgreSQL at ``$DSH_BENCH_POSTGRES_DSN`` (default
``host=127.0.0.1 port=5432 user=postgres dbname=test``) in a throwaway schema.

Run: ``/work/venv/bin/python bench/postgres_vs_jsonl.py [--small] [--turns N] [--repeats N]``.
Prints tables and writes ``bench/results/postgres_vs_jsonl.json``. No assertion:
numbers are reported (medians; the machine is shared and noisy, so the backends
take turns and every figure in one run is measured under the same load).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg
from _common import (
    POSTGRES_DSN,
    machine_info,
    median,
    parser,
    percentile,
    print_table,
    scratch_dir,
    write_result,
)
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_postgres import PostgresSessionPersistence
from dsh_session_persistence_postgres._schema import ensure_schema
from psycopg import sql
from session_append import turn_payloads

from dsh_host._session import (
    Session,
    SessionEvent,
)
from dsh_host._session.events import encode_event

DSN = POSTGRES_DSN
TOOL_OUTPUT = "".join(
    f"-rw-r--r-- 1 dev dev {i * 37:>8} Nov 29 12:{i % 60:02} file_{i}.py\n" for i in range(80)
)  # ~4 KB, like an `ls -l`
TEXT = "Let me look at the directory first; then I will summarize what changed. " * 4


def realistic_events(turns: int) -> list[SessionEvent]:
    """A session of ``turns`` turns, 12 events each (session_append's mix at realistic sizes),
    built through the real Session."""
    session = Session.create("bench")
    for turn in range(1, turns + 1):
        for kind, data, op in turn_payloads(turn, text=TEXT, tool_output=TOOL_OUTPUT):
            session.append(kind, data, surface_op=op)
    return list(session.events)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in samples_s]
    return {
        "n": len(ms),
        "median_ms": round(median(ms), 3),
        "p10_ms": round(percentile(ms, 10), 3),
        "p90_ms": round(percentile(ms, 90), 3),
    }


# --------------------------------------------------------------------------- backends


Factory = Callable[[], Any]


@contextlib.asynccontextmanager
async def opened(factory: Factory) -> AsyncIterator[Any]:
    backend = factory()
    try:
        yield backend
    finally:
        await backend.aclose()


def drop_schema(schema: str) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def measure_flushes(
    factories: dict[str, Factory], events: list[SessionEvent], batch: int, session_id: str
) -> dict[str, list[float]]:
    """Write ``events`` as ``append(batch) + flush()`` rounds on every backend; time each round.

    The backends take turns round by round (in rotating order), so load from other
    processes on this shared machine falls on all of them alike.
    """
    samples: dict[str, list[float]] = {name: [] for name in factories}
    async with contextlib.AsyncExitStack() as stack:
        handles = {}
        for name, factory in factories.items():
            backend = await stack.enter_async_context(opened(factory))
            handle = await backend.create(
                {"version": 3, "id": session_id, "createdAt": 1, "cwd": "/bench"}
            )
            await handle.flush()  # publication is not what we measure
            handles[name] = handle
        names = list(factories)
        for round_no, start in enumerate(range(0, len(events), batch)):
            chunk = events[start : start + batch]
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                handles[name].append(chunk)
                await handles[name].flush()
                samples[name].append(time.perf_counter() - t0)
        for handle in handles.values():
            await handle.close()
    return samples


async def measure_resume(
    factories: dict[str, Factory], session_id: str, repeats: int, expected: int
) -> dict[str, dict[str, list[float]]]:
    """open(write)+read+close and open(read)+read of the stored session, backends interleaved."""
    out: dict[str, dict[str, list[float]]] = {
        name: {"open_write_read_close": [], "open_read_read": []} for name in factories
    }
    async with contextlib.AsyncExitStack() as stack:
        backends = {
            name: await stack.enter_async_context(opened(factory))
            for name, factory in factories.items()
        }
        for backend in backends.values():  # warm: schema, pool, page cache
            await (await backend.open(session_id, "read")).read()
        for _ in range(repeats):
            for name, backend in backends.items():
                t0 = time.perf_counter()
                handle = await backend.open(session_id, "write")
                load = await handle.read()
                await handle.close()
                out[name]["open_write_read_close"].append(time.perf_counter() - t0)
                assert len(load.events) == expected
                t0 = time.perf_counter()
                load = await (await backend.open(session_id, "read")).read()
                out[name]["open_read_read"].append(time.perf_counter() - t0)
                assert len(load.events) == expected
    return out


async def measure_thread_hop(repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await anyio.to_thread.run_sync(lambda: None)
        samples.append(time.perf_counter() - t0)
    return samples


async def measure_inserts(schema: str, repeats: int) -> dict[str, list[float]]:
    """asyncio only. One-event autocommit INSERTs (synchronous_commit = on), three ways:

    * ``async_connection``: psycopg's ``AsyncConnection`` into a plain table with the
      primary key only — the native-async baseline;
    * ``sync_on_thread``: the same statement through the blocking API on an anyio
      worker thread (what the backend does) — the difference is the thread hop;
    * ``sync_on_thread_our_schema``: the backend's own INSERT into the real schema
      (primary key + ``events_prev_fkey`` + ``events_session_fkey``) — the difference
      to ``sync_on_thread`` is what database-enforced contiguity costs per batch.
    """
    event = encode_event(realistic_events(1)[5]).decode()  # a tool/call, ~120 bytes
    ident = sql.Identifier(schema)
    opts = "-c synchronous_commit=on"
    with psycopg.connect(DSN, autocommit=True) as conn:
        ensure_schema(conn, schema)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.pk_only (session_id text, seq bigint, event text NOT NULL, "
                "PRIMARY KEY (session_id, seq))"
            ).format(ident)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.sessions (id, header, created_at) VALUES ('p', '{{}}', 0)"
            ).format(ident)
        )
    unnest = "SELECT %s, t.seq, t.event FROM unnest(%s::bigint[], %s::text[]) AS t(seq, event)"
    plain = sql.SQL("INSERT INTO {}.pk_only (session_id, seq, event) " + unnest).format(ident)
    ours = sql.SQL("INSERT INTO {}.events (session_id, seq, event) " + unnest).format(ident)
    out: dict[str, list[float]] = {
        "async_connection": [],
        "sync_on_thread": [],
        "sync_on_thread_our_schema": [],
    }
    aconn = await psycopg.AsyncConnection.connect(DSN, autocommit=True, options=opts)
    sconn = psycopg.connect(DSN, autocommit=True, options=opts)

    def insert(statement: sql.Composed, session_id: str, seq: int) -> None:
        sconn.execute(statement, (session_id, [seq], [event]), prepare=True)

    try:
        for i in range(repeats):
            t0 = time.perf_counter()
            await aconn.execute(plain, ("a", [i], [event]), prepare=True)
            out["async_connection"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(insert, plain, "s", i)
            out["sync_on_thread"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(insert, ours, "p", i)
            out["sync_on_thread_our_schema"].append(time.perf_counter() - t0)
    finally:
        await aconn.close()
        sconn.close()
    return out


async def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    events = realistic_events(args.turns)
    sizes = [len(encode_event(e)) for e in events]
    run_id = uuid.uuid4().hex[:8]
    schemas = {"text": f"dsh_bench_{run_id}_text", "jsonb": f"dsh_bench_{run_id}_jsonb"}
    factories: dict[str, Factory] = {
        "jsonl-zstd": lambda: JsonlSessionPersistence(str(scratch / "zstd"), "zstd"),
        "jsonl-raw": lambda: JsonlSessionPersistence(str(scratch / "raw"), "none"),
        "postgres-text": lambda: PostgresSessionPersistence(DSN, schema=schemas["text"]),
        "postgres-jsonb": lambda: PostgresSessionPersistence(
            DSN, schema=schemas["jsonb"], storage="jsonb"
        ),
    }
    results: dict[str, Any] = {
        "session": {
            "turns": args.turns,
            "events": len(events),
            "json_bytes": sum(sizes),
            "median_event_bytes": statistics.median(sizes),
            "max_event_bytes": max(sizes),
        },
        "flush": {},
        "resume": {},
    }
    try:
        one = await measure_flushes(factories, events[: args.single_flushes], 1, "single")
        turn = await measure_flushes(factories, events, 12, "whole")
        resume = await measure_resume(factories, "whole", args.repeats, len(events))
        for name in factories:
            results["flush"][name] = {
                "one_event": summary_ms(one[name]),
                "one_turn_12_events": summary_ms(turn[name]),
            }
            results["resume"][name] = {k: summary_ms(v) for k, v in resume[name].items()}
        results["thread_hop"] = summary_ms(await measure_thread_hop(2000))
    finally:
        for schema in schemas.values():
            drop_schema(schema)
    return results


async def run_native(repeats: int) -> dict[str, Any]:
    schema = f"dsh_bench_{uuid.uuid4().hex[:8]}_native"
    try:
        samples = await measure_inserts(schema, repeats)
    finally:
        drop_schema(schema)
    return {k: summary_ms(v) for k, v in samples.items()}


def print_flush_table(flush: dict[str, Any]) -> None:
    """The flush-latency table of :func:`measure_flushes`' results, one row per backend."""
    print_table(
        "flush latency (append + flush until durable), ms",
        ["backend", "1 event: median", "p90", "12 events: median", "p90"],
        [
            [
                name,
                r["one_event"]["median_ms"],
                r["one_event"]["p90_ms"],
                r["one_turn_12_events"]["median_ms"],
                r["one_turn_12_events"]["p90_ms"],
            ]
            for name, r in flush.items()
        ],
    )


def session_args(description: str) -> argparse.Namespace:
    """The flags of a backend-vs-JSONL bench (this one and ``sqlite_vs_jsonl.py``), sized."""
    p = parser(description)
    p.add_argument("--turns", type=int, help="turns in the session, 12 events each (default 60)")
    p.add_argument("--repeats", type=int, help="resume repetitions (default 15)")
    p.add_argument("--single-flushes", type=int, help="one-event flushes per backend (default 200)")
    args = p.parse_args()
    args.turns = args.turns or (10 if args.small else 60)
    args.repeats = args.repeats or (3 if args.small else 15)
    args.single_flushes = args.single_flushes or (30 if args.small else 200)
    return args


def main() -> None:
    args = session_args(__doc__.splitlines()[0])
    with scratch_dir(args.scratch, "postgres-vs-jsonl") as scratch:
        info = machine_info(scratch)
        results = anyio.run(run, args, scratch, backend=args.backend)
    results["one_event_insert_asyncio"] = anyio.run(run_native, 300, backend="asyncio")
    with psycopg.connect(DSN) as conn:
        server = conn.execute("SELECT version()").fetchone()
    info["postgres"] = server[0] if server else None
    session = results["session"]
    print(
        f"session: {session['events']} events, {session['json_bytes']:,} bytes of JSON "
        f"(median event {session['median_event_bytes']} B, largest {session['max_event_bytes']} B)"
    )
    print_flush_table(results["flush"])
    print_table(
        f"resume of the {session['events']}-event session, ms",
        ["backend", "open(write)+read+close: median", "p90", "open(read)+read: median", "p90"],
        [
            [
                name,
                r["open_write_read_close"]["median_ms"],
                r["open_write_read_close"]["p90_ms"],
                r["open_read_read"]["median_ms"],
                r["open_read_read"]["p90_ms"],
            ]
            for name, r in results["resume"].items()
        ],
    )
    native = results["one_event_insert_asyncio"]
    print_table(
        "one-event INSERT + commit (asyncio): the thread hop and the contiguity constraints, ms",
        ["what", "median", "p90"],
        [
            [
                f"empty anyio.to_thread.run_sync ({args.backend})",
                results["thread_hop"]["median_ms"],
                results["thread_hop"]["p90_ms"],
            ],
            *[
                [label, native[key]["median_ms"], native[key]["p90_ms"]]
                for key, label in (
                    ("async_connection", "AsyncConnection, primary key only"),
                    ("sync_on_thread", "sync API on a thread, primary key only"),
                    ("sync_on_thread_our_schema", "sync API on a thread, our schema (PK + FKs)"),
                )
            ],
        ],
    )
    write_result(
        "postgres_vs_jsonl",
        {"small": args.small, "backend": args.backend, **results, "machine": info},
        args.results_dir,
    )


if __name__ == "__main__":
    main()
