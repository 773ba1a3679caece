"""``dsh serve`` under load: concurrent sessions through the HTTP API, 1 and 3 workers.

Each configuration starts real ``dsh serve`` processes and drives ``--sessions`` sessions at
once from this process (httpx): every session opens its SSE stream on one worker, then runs
``--turns`` turns posted to another (round robin), each turn waiting for its ``turn/end`` on the
stream. The model is scripted (a short text answer, one request per turn), so what is measured
is the server: the API, the turn jobs, the store, the streams.

Figures, per configuration:

- ``turns_per_s``: turns completed / wall time from the first POST to the last ``turn/end``.
- ``delivery_ms`` p50 / p99: event delivery latency, the client's receive time minus the
  event's ``time`` (stamped at append in the worker; same machine, same clock), over every
  event of every stream.
- ``turn_ms`` p50 / p99: POST of a turn to its ``turn/end`` on the stream.
- the floor: ``/healthz`` round trip p50 on the same server (the HTTP stack alone), and the
  ratio ``delivery p50 / healthz p50``.

Configurations: ``jsonl-1`` (one process, JSONL store, turns in-process, streams woken at
once), ``queue-1`` and ``queue-3`` (``--queue``: PostgreSQL store and procrastinate jobs, one or
three worker processes; a stream on a worker that does not run the turn follows the table by
polling every 0.5 s). The queue configurations need PostgreSQL at ``$DSH_BENCH_POSTGRES_DSN``
(default ``host=127.0.0.1 port=5432 user=postgres dbname=test``); a fresh schema per run is
dropped afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common as c
import anyio
import httpx

DSN = os.environ.get(
    "DSH_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


def _script(path: Path, requests: int) -> Path:
    text = "Done: the request was handled and nothing else needs doing."
    path.write_text(json.dumps({"responses": [{"text": text}] * requests}))
    return path


@contextmanager
def servers(scratch: Path, name: str, count: int, queue: bool, requests: int,
            ) -> Iterator[list[str]]:
    """``count`` ``dsh serve`` processes of one configuration; their URLs."""
    base = scratch / name
    (base / "ws").mkdir(parents=True)
    config = base / "dsh.yml"
    config.write_text((c.REPO_DIR / "configs" / ("postgres.yml" if queue else "default.yml"))
                      .read_text())
    prefix = f"dsh_bench{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"}
    if queue:
        env.update(DSH_POSTGRES_DSN=DSN, DSH_POSTGRES_SCHEMA=f"{prefix}_main")
    procs: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    try:
        for index in range(count):
            work = base / f"work-{index}"
            work.mkdir()
            command = [
                sys.executable, "-m", "dsh_host", "serve", "--config", str(config),
                "--model", f"scripted:{_script(base / f'script-{index}.json', requests)}",
                "--workspace", str(base / "ws"), "--port", "0",
            ]
            if queue:
                command += ["--queue", "--queue-schema", f"{prefix}_queue",
                            "--concurrency", "50"]
            else:
                command += ["--root", str(base / "sessions")]
            with open(work / "stderr", "w") as stderr:
                proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                                        stderr=stderr, text=True)
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("dsh serve: listening on "):
                problem = (work / "stderr").read_text()
                raise SystemExit(f"{name}: dsh serve did not start: {problem}")
            urls.append(line.split()[4].rstrip("/"))
        yield urls
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if queue:
            _drop_schemas(prefix)


def _drop_schemas(prefix: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(DSN, autocommit=True) as conn:
        names = [row[0] for row in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,))]
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def drive(urls: list[str], sessions: int, turns: int) -> dict[str, Any]:
    delivery_ms: list[float] = []
    turn_ms: list[float] = []
    limits = httpx.Limits(max_connections=4 * sessions, max_keepalive_connections=4 * sessions)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        # The floor: the HTTP stack alone, on the same server.
        healthz: list[float] = []
        for _ in range(50):
            started = time.perf_counter()
            (await client.get(f"{urls[0]}/healthz")).raise_for_status()
            healthz.append((time.perf_counter() - started) * 1000)
        ids = []
        for index in range(sessions):
            created = await client.post(f"{urls[index % len(urls)]}/sessions", json={})
            created.raise_for_status()
            ids.append(created.json()["id"])
        wall_start = time.perf_counter()

        async def one(index: int) -> None:
            session_id = ids[index]
            stream_url = urls[index % len(urls)]
            post_url = urls[(index + 1) % len(urls)]
            ended: dict[int, anyio.Event] = {n: anyio.Event() for n in range(1, turns + 1)}

            async def follow() -> None:
                async with client.stream("GET", f"{stream_url}/sessions/{session_id}/stream") as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        received = time.time() * 1000
                        event = json.loads(line[6:])
                        delivery_ms.append(received - event["time"])
                        if event["type"] == "turn/end":
                            ended[event["data"]["turn"]].set()
                            if event["data"]["turn"] == turns:
                                return

            async with anyio.create_task_group() as group:
                group.start_soon(follow)
                for turn in range(1, turns + 1):
                    started = time.perf_counter()
                    while True:  # the previous turn's job may still be releasing the session
                        response = await client.post(
                            f"{post_url}/sessions/{session_id}/turns", json={"prompt": "go"})
                        if response.status_code != 409:
                            break
                        await anyio.sleep(0.05)
                    response.raise_for_status()
                    await ended[turn].wait()
                    turn_ms.append((time.perf_counter() - started) * 1000)

        async with anyio.create_task_group() as group:
            for index in range(sessions):
                group.start_soon(one, index)
        wall = time.perf_counter() - wall_start
    floor = c.median(healthz)
    delivery_p50 = c.percentile(delivery_ms, 50)
    return {
        "sessions": sessions,
        "turns": sessions * turns,
        "wall_s": round(wall, 3),
        "turns_per_s": round(sessions * turns / wall, 2),
        "delivery_ms": {"p50": round(delivery_p50, 2),
                        "p99": round(c.percentile(delivery_ms, 99), 2),
                        "events": len(delivery_ms)},
        "turn_ms": {"p50": round(c.percentile(turn_ms, 50), 1),
                    "p99": round(c.percentile(turn_ms, 99), 1)},
        "healthz_ms_p50": round(floor, 3),
        "delivery_p50_over_healthz": round(c.ratio(delivery_p50, floor), 1),
    }


def main() -> int:
    parser = c.parser(__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--only", nargs="*", default=None, help="configurations to run")
    args = parser.parse_args()
    sessions, turns = (6, 1) if args.small else (args.sessions, args.turns)
    configurations = [("jsonl-1", 1, False), ("queue-1", 1, True), ("queue-3", 3, True)]
    if args.only:
        configurations = [conf for conf in configurations if conf[0] in args.only]
    results: dict[str, Any] = {}
    with c.scratch_dir(args.scratch, "serve_load") as scratch:
        for name, count, queue in configurations:
            print(f"{name}: {count} worker(s), {sessions} sessions x {turns} turns", flush=True)
            with servers(scratch, name, count, queue, requests=sessions * turns + 10) as urls:
                results[name] = anyio.run(drive, urls, sessions, turns, backend=args.backend)
        machine = c.machine_info(scratch)
    rows = [
        [name, r["turns"], r["turns_per_s"], r["delivery_ms"]["p50"], r["delivery_ms"]["p99"],
         r["turn_ms"]["p50"], r["turn_ms"]["p99"], r["healthz_ms_p50"],
         r["delivery_p50_over_healthz"]]
        for name, r in results.items()
    ]
    c.print_table(
        "dsh serve load (delivery = client receive time - event append time)",
        ["config", "turns", "turns/s", "deliv p50 ms", "deliv p99 ms", "turn p50 ms",
         "turn p99 ms", "healthz ms", "deliv/healthz"],
        rows,
    )
    c.write_result("serve_load", {"small": args.small, "sessions": sessions, "turns": turns,
                                  "results": results, "machine": machine}, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
