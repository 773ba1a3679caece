"""Benchmark: ``dsh sessions list`` over a root of long sessions, reading every log or not.

A row of the listing needs every event of its session (count, last turn, title, tokens), so a
listing that remembers nothing reads every byte of every log, and its time grows with the
root. ``dsh sessions list`` remembers each summary under the revision of the log it was read
from (``dsh_host/_cli/list_cache.py``) and reads again only the logs that changed.

The root holds ``--sessions`` sessions of ``--steps`` tool steps each (``--small``: 5 of 50),
each a real log: ``loop_step.run_loop`` runs the agent loop with the checkpoint policy and the
JSONL backend (``os.fsync`` a no-op while building: it changes how long building takes, not
one byte). Contenders, each a fresh ``python -m dsh_host`` process timed from spawn to exit,
in ``--rounds`` interleaved rounds (default 7):

* ``python -c pass`` -- the floor (as in ``startup.py``);
* ``list --fresh`` -- every log read again (and the cache rewritten): a listing without memory;
* ``list`` -- nothing changed since the last listing: no log is read;
* ``list, one log changed`` -- the newest log's mtime moved just before (as a session that ran
  since): that one log is read again.

Reported: median ms, ratio to the floor, the cost per log read (fresh minus remembered, over
the number of sessions) and ``fresh / list``. Writes ``bench/results/sessions_list.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from _common import (
    REPO_DIR,
    command_env,
    fsync_disabled,
    machine_info,
    median,
    parser,
    print_table,
    ratio,
    scratch_dir,
    time_command,
    write_result,
)
from loop_step import run_loop


async def _build(root: Path, workspace: Path, sessions: int, steps: int) -> None:
    with fsync_disabled():
        for n in range(sessions):
            await run_loop(steps + n, root, workspace, None)  # ids bench-loop-<steps + n>


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=20, help="sessions in the root (default 20)")
    p.add_argument("--steps", type=int, default=500, help="tool steps a session (default 500)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    args = p.parse_args()
    sessions, steps, rounds = (5, 50, 3) if args.small else (args.sessions, args.steps, args.rounds)
    with scratch_dir(args.scratch, "sessions-list") as scratch:
        root, work = scratch / "sessions", scratch / "work"
        work.mkdir()
        print(f"building {sessions} sessions of {steps}+ tool steps ...", flush=True)
        anyio.run(_build, root, work, sessions, steps)
        logs = sorted(root.rglob("session.v3.jsonl.zstd"), key=lambda log: log.stat().st_mtime_ns)
        env = command_env(root, scratch / "cache")
        listing = [sys.executable, "-m", "dsh_host", "sessions", "list", "--json"]
        contenders: dict[str, list[str]] = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "list --fresh": [*listing, "--fresh"],
            "list": listing,
            "list, one log changed": listing,
        }
        samples: dict[str, list[int]] = {name: [] for name in contenders}
        for argv in contenders.values():  # page cache, bytecode and the listing cache, untimed
            time_command(argv, env, work)
        for _ in range(rounds):
            for name, argv in contenders.items():
                if name == "list, one log changed":
                    os.utime(logs[-1])  # a new revision: that log is read again
                samples[name].append(time_command(argv, env, work))
        cache = scratch / "cache" / "dsh" / "sessions-list.json"
        cache_bytes = cache.stat().st_size
        log_bytes = sum(log.stat().st_size for log in logs)
    floor = median(samples["python -c pass"])
    results: dict[str, Any] = {}
    rows = []
    for name, values in samples.items():
        ms = median(values) / 1e6
        results[name] = {"median_ms": round(ms, 2), "x_floor": ratio(median(values), floor)}
        rows.append([name, round(ms, 1), ratio(median(values), floor)])
    fresh, remembered = median(samples["list --fresh"]), median(samples["list"])
    per_log_ms = round((fresh - remembered) / sessions / 1e6, 2)
    speedup = ratio(fresh, remembered)
    print_table(
        f"dsh sessions list over {sessions} sessions of {steps}+ tool steps "
        f"({log_bytes / 2**20:.1f} MiB of logs), median of {rounds} interleaved rounds",
        ["contender", "ms", "x floor"],
        rows,
    )
    print(f"a log read costs {per_log_ms} ms; remembering the summaries makes the listing "
          f"{speedup}x faster (cache file {cache_bytes} bytes)")
    write_result(
        "sessions_list",
        {"small": args.small, "sessions": sessions, "steps": steps, "rounds": rounds,
         "log_bytes": log_bytes, "cache_bytes": cache_bytes, "results": results,
         "per_log_read_ms": per_log_ms, "fresh_over_remembered": speedup,
         "repo": str(REPO_DIR), "machine": machine_info()},
        args.results_dir,
    )


if __name__ == "__main__":
    main()
