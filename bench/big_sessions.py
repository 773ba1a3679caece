"""Benchmark: the read paths of a big session, 10,000 vs 100,000 events, per storage backend.

Issue 36 ("big sessions") and issue 42 ("reads that scale"): ``dsh sessions show`` (the
transcript, ``--view model`` and ``--view events``), ``dsh sessions verify``, ``dsh resume``
(repair check, no prompt), ``dsh sessions export --attest`` + ``dsh audit verify`` and the
server's session summary (what ``GET /sessions/{id}`` and the inspector's session page read
when the log changed) must take time and memory linear in the log, and the per-event figure
of the 100k log must not be above 2x the 10k one.

Each session is written through the store API (``sessionPersistence.create`` + ``append`` +
``flush`` in batches of 2,000 events; ``os.fsync`` a no-op while building), from the event
mix of ``session_append.py`` (12 events a turn: a tool step and an answer step; the tool
output ~1 KB). Backends: ``session-persistence-jsonl`` (zstd), ``-sqlite`` and ``-postgres``
(a private schema, dropped at the end; skipped when ``psycopg`` or the server is missing).

Every read runs in a fresh child process (``dsh ...``, output to ``/dev/null``); the bench
records its wall time, its CPU time (user + system, its own rusage from ``wait4``: the figure
least moved by other processes on a shared machine) and its own peak RSS (``VmHWM`` at its
exit: ``ru_maxrss`` would count the pages of the bench it was forked from). A floor child
(``dsh sessions verify`` of a 2-event session on the same backend) gives the fixed cost of an
interpreter with the store loaded; **bytes/event** is ``(peak RSS - floor RSS) / events``,
**µs/event** is ``(wall - floor wall) / events`` and **cpu µs/event** the same of CPU time;
**B/ev added** is what each of the events the big log has beyond the small one adds to the
peak, ``(RSS big - RSS small) / (big - small)``: about 0 for a read that holds a page, the
size of a decoded event for one that holds the log. The ratio columns divide the 100k
per-event figure by the 10k one: 1.0 is linear; above 1 grows faster than the log. (The floor
is a ``verify``'s: a command that imports more, ``show`` the renderer, has a fixed part above
it, which makes its small per-event figures the larger.)

Writes ``bench/results/big_sessions.json``. ``--small``: 1,000 vs 5,000 events, JSONL and
SQLite only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from _common import (
    POSTGRES_DSN,
    fsync_disabled,
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    scratch_dir,
    write_result,
)
from session_append import turn_payloads

from dsh_host import Row, open_host
from dsh_host._session import Session

DSN = POSTGRES_DSN
TOOL_OUTPUT = "".join(
    f"-rw-r--r-- 1 dev dev {i * 37:>8} Nov 29 12:{i:02} f_{i}.py\n" for i in range(20)
)
TEXT = "Let me look at the directory first; then I will summarize what changed. " * 2
BATCH = 2000
SIZES = (10_000, 100_000)
SMALL_SIZES = (1_000, 5_000)
SCHEMA = f"bench_big_{os.getpid()}"

#: The summary a server computes for ``GET /sessions/{id}`` and the inspector's session page:
#: ``ServerRuntime.stored_summary`` of a log it has not read yet, in a runtime of its own.
SUMMARY_CHILD = """
import sys, anyio
from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions, open_runtime
async def main():
    options = ServeOptions(compositions=build_compositions(sys.argv[1], [], None, None),
                           default_workspace=sys.argv[3])
    async with open_runtime(options) as runtime:
        print((await runtime.stored_summary(sys.argv[2])).fields["events"])
anyio.run(main, backend="trio")
"""


def config_text(kind: str, root: Path) -> str:
    """A composition for ``kind``'s store, with a scripted model so ``dsh resume`` boots."""
    store = {
        "jsonl": f"  name: session-persistence-jsonl\n  config:\n    root: {root}\n",
        "sqlite": f"  name: session-persistence-sqlite\n  config:\n    root: {root}\n",
        "postgres": (
            f"  name: session-persistence-postgres\n  config:\n    dsn: \"{DSN}\"\n"
            f"    schema: {SCHEMA}\n"
        ),
    }[kind]
    return (
        "- id: sessions\n  name: sessions\n"
        f"- id: session-persistence\n{store}"
        "- id: llm\n  name: llm\n"
        "- id: tools\n  name: tools\n"
        "- id: model\n  name: llm-scripted\n  config:\n    responses: [{text: unused}]\n"
        "- id: agent\n  name: agent\n  config:\n    provider: scripted\n    model: scripted\n"
    )


def store_row(kind: str, root: Path) -> Row:
    if kind == "postgres":
        return Row(name="session-persistence-postgres", config={"dsn": DSN, "schema": SCHEMA})
    return Row(name=f"session-persistence-{kind}", config={"root": str(root)})


async def build(kind: str, root: Path, session_id: str, events: int) -> None:
    """Write a session of ``events`` events (whole turns, then cut) through the store API."""
    session = Session.create(session_id)
    turn = 0
    while len(session.events) < events:
        turn += 1
        for event_type, data, op in turn_payloads(turn, text=TEXT, tool_output=TOOL_OUTPUT):
            if len(session.events) < events:
                session.append(event_type, data, surface_op=op)
    stored = list(session.events)
    async with open_host([Row(name="sessions"), store_row(kind, root)]) as host:
        store = host.ctx.sessionPersistence
        handle = await store.create(session.header)
        for start in range(0, len(stored), BATCH):
            handle.append(stored[start : start + BATCH])
            await handle.flush()
        await handle.close()


#: The child's own peak resident set (``VmHWM``, the high-water mark since its exec; the
#: ``ru_maxrss`` of ``wait4`` would count the pages of this process it was forked from), written
#: to argv[1] at exit. argv[2] ``dsh``: run the CLI with the rest; ``-c``: run argv[3].
MEASURED = (
    "import atexit, sys\n"
    "def report(path=sys.argv.pop(1)):\n"
    "    with open('/proc/self/status') as status, open(path, 'w') as out:\n"
    "        out.write(next(l for l in status if l.startswith('VmHWM:')).split()[1])\n"
    "atexit.register(report)\n"
    "if sys.argv.pop(1) == 'dsh':\n"
    "    from dsh_host._cli import main\n"
    "    sys.exit(main())\n"
    "exec(compile(sys.argv.pop(1), '<child>', 'exec'), {'__name__': '__main__'})\n"
)


def run_child(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system, from its own rusage) and peak RSS (bytes) of
    one child: ``argv`` is ``["dsh", ARGS...]`` or ``["-c", CODE, ARGS...]``."""
    hwm = cwd / "hwm"
    hwm.unlink(missing_ok=True)
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", MEASURED, str(hwm), *argv], env=env,
                             cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    assert child.stderr is not None
    errors = child.stderr.read()
    child.stderr.close()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):  # verify says 1 for "recoverable"
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {errors.decode()}")
    return wall, usage.ru_utime + usage.ru_stime, int(hwm.read_text()) * 1024


def reads(config: Path, session_id: str, scratch: Path) -> dict[str, list[str]]:
    dsh = ["dsh"]
    c = ["--config", str(config)]
    export = scratch / f"{session_id}.attested.jsonl"
    return {
        "show (transcript)": [*dsh, "sessions", "show", session_id, *c],
        "show --view model": [*dsh, "sessions", "show", session_id, "--view", "model", *c],
        "show --view events": [*dsh, "sessions", "show", session_id, "--view", "events", *c],
        "verify": [*dsh, "sessions", "verify", session_id, *c],
        "resume (no prompt)": [*dsh, "resume", session_id, *c],
        "server summary": ["-c", SUMMARY_CHILD, str(config), session_id, str(scratch)],
        "export --attest": [*dsh, "sessions", "export", session_id, "--attest", "--output",
                            str(export), *c],
        "audit verify": [*dsh, "audit", "verify", str(export)],
    }


@contextlib.asynccontextmanager
async def postgres_schema() -> AsyncIterator[None]:
    import psycopg
    from psycopg import sql

    try:
        yield
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def postgres_available() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        psycopg.connect(DSN, connect_timeout=3).close()
    except Exception as exc:
        return f"no PostgreSQL at {DSN}: {exc}"
    return None


def per_event_ratio(big: float, small: float) -> float | None:
    """``big / small``, None where the small figure is within the floor (0)."""
    return ratio(big, small) if small else None


def measure_kind(kind: str, scratch: Path, sizes: tuple[int, ...], rounds: int,
                 only: list[str] | None = None) -> dict[str, Any]:
    root = scratch / kind
    root.mkdir()
    config = scratch / f"{kind}.yml"
    config.write_text(config_text(kind, root))
    env = dict(os.environ)
    env["DSH_SESSION_ROOT"] = str(root)
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    env["XDG_CONFIG_HOME"] = str(scratch / "config")
    env.pop("DSH_CONFIG", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    ids = {n: f"big-{kind}-{n}" for n in (2, *sizes)}
    for n, session_id in ids.items():
        t0 = time.perf_counter()
        with fsync_disabled():
            anyio.run(build, kind, root, session_id, n)
        print(f"  {kind}: built {n:,} events in {time.perf_counter() - t0:.1f} s", flush=True)
    floor_argv = ["dsh", "sessions", "verify", ids[2], "--config", str(config)]
    run_child(floor_argv, env, scratch)  # bytecode and page cache, untimed
    samples: dict[str, dict[int, list[tuple[float, float, int]]]] = {}
    floor: list[tuple[float, float, int]] = []
    for _ in range(rounds):
        floor.append(run_child(floor_argv, env, scratch))
        for n in sizes:
            for name, argv in reads(config, ids[n], scratch).items():
                if only and not any(name.startswith(prefix) for prefix in only):
                    continue
                samples.setdefault(name, {}).setdefault(n, []).append(run_child(argv, env, scratch))
    floor_wall = median([w for w, _, _ in floor])
    floor_cpu = median([c for _, c, _ in floor])
    floor_rss = median([r for _, _, r in floor])
    out: dict[str, Any] = {"floor": {"wall_ms": round(floor_wall * 1e3, 1),
                                     "cpu_ms": round(floor_cpu * 1e3, 1),
                                     "peak_rss_mib": round(floor_rss / 2**20, 1)}}
    rows = []
    small, big = sizes[0], sizes[-1]
    for name, by_size in samples.items():
        entry: dict[str, Any] = {}
        for n, values in by_size.items():
            wall = median([w for w, _, _ in values])
            cpu = median([c for _, c, _ in values])
            rss = median([r for _, _, r in values])
            entry[str(n)] = {
                "wall_ms": round(wall * 1e3, 1),
                "cpu_ms": round(cpu * 1e3, 1),
                "cpu_us_per_event": round(max(cpu - floor_cpu, 0) * 1e6 / n, 2),
                "peak_rss_mib": round(rss / 2**20, 1),
                "us_per_event": round(max(wall - floor_wall, 0) * 1e6 / n, 2),
                "bytes_per_event": round(max(rss - floor_rss, 0) / n, 1),
            }
        entry["marginal_bytes_per_event"] = round(
            max(entry[str(big)]["peak_rss_mib"] - entry[str(small)]["peak_rss_mib"], 0)
            * 2**20 / (big - small), 1)
        entry["cpu_ratio_per_event"] = per_event_ratio(
            entry[str(big)]["cpu_us_per_event"], entry[str(small)]["cpu_us_per_event"])
        entry["time_ratio_per_event"] = per_event_ratio(entry[str(big)]["us_per_event"],
                                              entry[str(small)]["us_per_event"])
        entry["memory_ratio_per_event"] = per_event_ratio(entry[str(big)]["bytes_per_event"],
                                                entry[str(small)]["bytes_per_event"])
        out[name] = entry
        rows.append([
            name,
            entry[str(small)]["wall_ms"], entry[str(big)]["wall_ms"],
            entry[str(small)]["cpu_us_per_event"], entry[str(big)]["cpu_us_per_event"],
            entry["cpu_ratio_per_event"],
            entry[str(small)]["peak_rss_mib"], entry[str(big)]["peak_rss_mib"],
            entry[str(small)]["bytes_per_event"], entry[str(big)]["bytes_per_event"],
            entry["memory_ratio_per_event"], entry["marginal_bytes_per_event"],
        ])
    print_table(
        f"{kind}: {small:,} vs {big:,} events, median of {rounds}; floor "
        f"{out['floor']['wall_ms']} ms ({out['floor']['cpu_ms']} ms CPU), "
        f"{out['floor']['peak_rss_mib']} MiB",
        ["read", f"ms {small}", f"ms {big}", f"cpu µs/ev {small}", f"cpu µs/ev {big}", "cpu ratio",
         f"MiB {small}", f"MiB {big}", f"B/ev {small}", f"B/ev {big}", "mem ratio",
         "B/ev added"],
        rows,
    )
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--reads", nargs="+", default=None, metavar="READ",
                   help="only the reads whose name starts with one of these (e.g. resume show)")
    p.add_argument("--kinds", nargs="+", default=None,
                   choices=("jsonl", "sqlite", "postgres"), help="backends (default: all)")
    args = p.parse_args()
    sizes = SMALL_SIZES if args.small else SIZES
    rounds = 1 if args.small else args.rounds
    kinds: list[str] = args.kinds or (["jsonl", "sqlite"] if args.small else
                                      ["jsonl", "sqlite", "postgres"])
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    load_start = os.getloadavg()
    with scratch_dir(args.scratch, "big-sessions") as scratch:
        for kind in kinds:
            if kind == "postgres":
                why = postgres_available()
                if why is not None:
                    skipped[kind] = why
                    print(f"postgres skipped: {why}", flush=True)
                    continue
                with contextlib.ExitStack() as stack:
                    stack.callback(lambda: anyio.run(_drop_schema))
                    results[kind] = measure_kind(kind, scratch, sizes, rounds, args.reads)
                continue
            results[kind] = measure_kind(kind, scratch, sizes, rounds, args.reads)
    write_result(
        "big_sessions",
        {"small": args.small, "sizes": list(sizes), "rounds": rounds, "batch": BATCH,
         "results": results, "skipped": skipped,
         "load_average_at_start": [round(x, 2) for x in load_start],
              "machine": machine_info()},
        args.results_dir,
    )


async def _drop_schema() -> None:
    async with postgres_schema():
        pass


if __name__ == "__main__":
    main()
