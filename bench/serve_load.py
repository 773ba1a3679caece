"""``dsh serve`` under load: concurrent sessions through the HTTP API, 1, 2 and 3 workers.

Each configuration starts real ``dsh serve`` processes and drives ``--sessions`` sessions at
once from this process (the timed window's POSTs and streams through ``_lean_http``'s minimal
HTTP/1.1 client, ``--client httpx`` for httpx; the rest through httpx): every session opens
its SSE stream on one worker, then runs ``--turns`` turns posted to another (round robin), each
turn waiting for its ``turn/end`` on the stream. The model is scripted (a short text answer,
one request per turn), so what is measured is the server: the API, the turn jobs, the store,
the streams.

Figures, per configuration:

- ``turns_per_s``: turns completed / wall time from the first POST to the last ``turn/end``.
- ``delivery_ms`` p50 / p99: event delivery latency, the client's receive time minus the
  event's ``time`` (stamped at append in the worker; same machine, same clock), over every
  event of every stream.
- ``turn_ms`` p50 / p99: POST of a turn to its ``turn/end`` on the stream; ``turn_phases_ms_p50``
  splits it (POST to its 202, to the ``turn/start`` append, the turn, ``turn/end`` to the
  client) and ``busy_retries`` counts the 409s a POST was retried after.
- the floor: ``/healthz`` round trip p50 on the same server (the HTTP stack alone), and the
  ratio ``delivery p50 / healthz p50``.

The battery around it (issue 42): ``--followers`` more streams per session (each from
``?after=-1``: history, then news), ``--dropped`` clients that go away mid-request (half
mid-body, half with a stream open), and unique prompts. After the run it checks the
invariants and reports them beside the figures:

- ``verified``: ``dsh sessions verify`` of every session exits 0;
- ``prompts``: every accepted prompt is in its session's log exactly once, and nothing else;
- ``followers``: every follower saw exactly the stored log;
- ``fds`` / ``rss_mb`` of every server process: after a warm-up (``baseline``) and after the
  run once every client is gone (``after``).

Where a turn's CPU goes (``cpu_ms_per_turn``, from the first POST to the last ``turn/end``):
this driver (``time.process_time``), each server process and PostgreSQL (``utime + stime`` from
``/proc/<pid>/stat``). PostgreSQL's share is its backends serving this run (the DSN carries an
``application_name`` of the run, found in ``pg_stat_activity``), and, apart, every
``postgres`` process of the machine (its background writers too, and other users' backends on
a shared machine). With 2 cores, ``2000 / (sum of the parts)`` is the turns/s a run can reach.
Beside it: PostgreSQL connections made per turn (a backend that came and went inside the window
is in no CPU figure), and each server's share of the window on a CPU and waiting for one
(``schedstat``: a large waiting share means the machine, not the server, set the pace).

``--pg-log FILE`` also counts the statements PostgreSQL ran per turn in that window: FILE is
the server's log, and the DSN's role must log its statements (``ALTER ROLE r SET
log_statement = 'all'``: only that role's statements are logged); every logged statement in
the window is counted, by kind (``BEGIN``, ``COMMIT``, the empty liveness check, the rest).

Configurations: ``jsonl-1`` (one process, JSONL store, turns in-process, streams woken at
once), ``queue-1``, ``queue-2`` and ``queue-3`` (``--queue``: PostgreSQL store and
procrastinate jobs, one, two or three worker processes; a stream on a worker that does not run
the turn is woken by that worker's NOTIFY, and behind it by its own worker's one idle poll of the
table every 0.5 s, D47). The queue configurations need PostgreSQL at
``$DSH_BENCH_POSTGRES_DSN`` (default ``host=127.0.0.1 port=5432 user=postgres dbname=test``); a
fresh schema per run is dropped afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import anyio
import httpx
from _lean_http import LeanClient

DSN = c.POSTGRES_DSN


def _script(path: Path, requests: int) -> Path:
    text = "Done: the request was handled and nothing else needs doing."
    path.write_text(json.dumps({"responses": [{"text": text}] * requests}))
    return path


@dataclass
class Served:
    """The server processes of one configuration and how to verify their sessions."""

    urls: list[str]
    pids: list[int]
    verify: list[str]
    env: dict[str, str]
    #: the ``application_name`` of this run's PostgreSQL connections ("" without PostgreSQL)
    application_name: str = ""
    #: the PostgreSQL connections each process may hold once idle (0 without PostgreSQL)
    postgres_bound: int = 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
               "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
               "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` (``/proc/net/tcp``) -> ``127.0.0.1:8080`` (IPv6 shown as hex)."""
    host, port = hex_address.split(":")
    if len(host) == 8:
        host = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return f"{host}:{int(port, 16)}"


def _tcp_sockets(pid: int) -> dict[str, tuple[str, str, str]]:
    """The TCP sockets of ``pid``'s network namespace: inode -> (local, remote, state)."""
    found: dict[str, tuple[str, str, str]] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                found[fields[9]] = (_address(fields[1]), _address(fields[2]),
                                    _TCP_STATES.get(fields[3], fields[3]))
    return found


def _pg_clients(ports: set[int]) -> dict[int, str]:
    """What PostgreSQL says of the backends whose client port is in ``ports``: its state and
    last statement (which tells a pool's connection from a LISTEN or a writer's)."""
    if not ports:
        return {}
    import psycopg

    with contextlib.suppress(psycopg.Error), psycopg.connect(DSN, autocommit=True) as conn:
        return {row[0]: f"{row[1]} {row[2]!r}" for row in conn.execute(
            "SELECT client_port, state, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) "
            "FROM pg_stat_activity WHERE client_port = ANY(%s)", (sorted(ports),))}
    return {}


def _postgres_port() -> str:
    """The port of :data:`DSN` (PostgreSQL's default when it names none)."""
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(DSN).get("port", "5432"))


def _links(pid: int) -> list[tuple[int, str]]:
    """``(fd, link target)`` of every open descriptor of ``pid``."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            links.append((int(fd), os.readlink(f"/proc/{pid}/fd/{fd}")))
    return sorted(links)


def _socket(target: str, sockets: dict[str, tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The TCP ends and state of a descriptor's link target (None: not a TCP socket)."""
    if not target.startswith("socket:["):
        return None
    return sockets.get(target.removeprefix("socket:[").rstrip("]"))


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def fd_census(pid: int, http_port: int) -> dict[str, int]:
    """``pid``'s descriptors by what holds them: ``http`` (a client's connection to the
    server's port), ``postgres`` (a connection to PostgreSQL), ``other`` (the rest: files,
    pipes, the listening socket, the event loop's)."""
    sockets = _tcp_sockets(pid)
    pg_port = int(_postgres_port())
    counts = {"http": 0, "postgres": 0, "other": 0}
    for _, target in _links(pid):
        kind = "other"
        found = _socket(target, sockets)
        if found is not None:
            local, remote, state = found
            if _port(remote) == pg_port:
                kind = "postgres"
            elif _port(local) == http_port and state != "LISTEN":
                kind = "http"
        counts[kind] += 1
    return counts


def fd_targets(pid: int) -> list[str]:
    """Every open descriptor of ``pid``, described: a file's path, a pipe, a TCP socket's
    ends and state (a PostgreSQL connection also with its backend's state and last
    statement, which tells a pool's connection from a LISTEN or a spare writer). What a
    failure of the descriptor invariant shows (issue 42)."""
    sockets = _tcp_sockets(pid)
    pg_port = int(_postgres_port())
    links = _links(pid)
    ports = set()
    for _, target in links:
        found = _socket(target, sockets)
        if found is not None and _port(found[1]) == pg_port:
            ports.add(_port(found[0]))
    backends = _pg_clients(ports)
    described = []
    for fd, target in links:
        found = _socket(target, sockets)
        if found is not None:
            local, remote, state = found
            target += f" tcp {local} -> {remote} {state}"
            if _port(remote) == pg_port:
                target += f" postgres: {backends.get(_port(local), '?')}"
        described.append(f"{fd}: {target}")
    return described


#: The PostgreSQL connections a ``--queue`` process holds whatever its load: the NOTIFY relay
#: (``TurnQueue.relay_flushes``), the wake-up LISTEN (``TurnQueue.listen``) and procrastinate's
#: worker LISTEN.
QUEUE_FIXED_CONNECTIONS = 3


def postgres_bound(config: Path) -> int:
    """The PostgreSQL connections a ``--queue`` process may hold once idle, from the configured
    maxima (docs/decisions.md D40): the fixed ones, procrastinate's pool, the persistence
    row's read pool (``pool_size``) and the spare writers it keeps (``pool_size`` more)."""
    from dsh_host._server.queue import JOB_POOL_MAX_SIZE

    found = re.search(r"^\s*pool_size:\s*(\d+)\s*$", config.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{config}: no pool_size in the persistence row (the fd bound needs it)")
    return QUEUE_FIXED_CONNECTIONS + JOB_POOL_MAX_SIZE + 2 * int(found.group(1))


#: How long the descriptors may take to settle after the clients are gone (a server under
#: load closes its side of a connection, and a job releases its session, a while after the
#: client saw ``turn/end``); past it, what is open is recorded as is.
SETTLE_DEADLINE_S = 60.0


async def settle(served: Served, settled: Any) -> tuple[list[dict[str, int]], bool]:
    """Poll every server's :func:`fd_census` until ``settled(index, census)`` holds for each
    or :data:`SETTLE_DEADLINE_S` passed: the censuses, and whether they settled."""
    ports = [int(url.rsplit(":", 1)[1]) for url in served.urls]
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        censuses = [fd_census(pid, port) for pid, port in zip(served.pids, ports, strict=True)]
        done = all(settled(i, census) for i, census in enumerate(censuses))
        if done or time.monotonic() >= deadline:
            return censuses, done
        await anyio.sleep(0.2)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """``utime + stime`` of ``pid`` in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _sched_ms(pid: int) -> tuple[float, float]:
    """ms ``pid``'s threads have run on a CPU and waited for one while runnable
    (``/proc/<pid>/task/*/schedstat``; a thread that ended is not counted)."""
    ran = waited = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                fields = f.read().split()
                ran += int(fields[0])
                waited += int(fields[1])
    return ran / 1e6, waited / 1e6


def _postgres_pids() -> list[int]:
    """Every ``postgres`` process of the machine."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/comm") as f:
                if f.read().strip() in ("postgres", "postmaster"):
                    pids.append(int(entry))
    return pids


def _backends(application_name: str) -> tuple[list[int], int]:
    """The PostgreSQL backends connected with ``application_name``, and the connections
    made to the DSN's database so far (``pg_stat_database.sessions``, this one included)."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        pids = [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))]
        found = conn.execute("SELECT sessions FROM pg_stat_database "
                             "WHERE datname = current_database()").fetchone()
    return pids, int(found[0]) if found is not None else 0


@dataclass
class CpuMark:
    """CPU seconds of the parts of a run at one moment."""

    driver: float
    servers: list[float]
    backends: dict[int, float]
    postgres: dict[int, float]
    #: connections made to the database so far (0 without PostgreSQL)
    connections: int = 0
    #: per server: ms run on a CPU and ms waited for one while runnable
    sched: tuple[tuple[float, float], ...] = ()
    wall: float = 0.0

    @classmethod
    def take(cls, served: Served) -> CpuMark:
        backends, connections = (_backends(served.application_name)
                                 if served.application_name else ([], 0))
        return cls(time.process_time(), [_cpu_s(p) for p in served.pids],
                   {p: _cpu_s(p) for p in backends}, {p: _cpu_s(p) for p in _postgres_pids()},
                   connections, tuple(_sched_ms(p) for p in served.pids),
                   time.perf_counter())


def cpu_per_turn(start: CpuMark, end: CpuMark, turns: int) -> dict[str, Any]:
    """ms of CPU per turn of each part between two marks (a backend or a postgres process
    that started between them counts from 0; one that ended is not seen)."""
    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())

    per = 1000 / turns
    window = (end.wall - start.wall) * 1000 or 1.0
    servers = [round((b - a) * per, 2) for a, b in zip(start.servers, end.servers, strict=True)]
    backends = spent(start.backends, end.backends) * per
    driver = (end.driver - start.driver) * per
    total = driver + sum(servers) + backends
    return {
        "driver": round(driver, 2),
        "servers": servers,
        "postgres_backends": round(backends, 2),
        "postgres_backends_count": len(end.backends),
        "postgres_all": round(spent(start.postgres, end.postgres) * per, 2),
        "sum": round(total, 2),
        "turns_per_s_ceiling_2_cores": round(2000 / total, 1) if total else None,
        # a backend that started and ended between the marks is in no CPU figure above: the
        # connections made meanwhile (the end mark's own one left out; every client of the
        # database counts, so a shared database inflates it)
        "pg_connections_per_turn": round((end.connections - start.connections - 1) / turns, 2),
        # each server's share of the window: on a CPU, runnable but waiting for one (the
        # machine's other work, or its own other threads), and the rest (blocked: waiting
        # on PostgreSQL, its clients or a timer); threads, so the shares may pass 1
        "servers_share_running_waiting": [
            [round((b[0] - a[0]) / window, 2), round((b[1] - a[1]) / window, 2)]
            for a, b in zip(start.sched, end.sched, strict=True)],
    }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@contextmanager
def servers(scratch: Path, name: str, count: int, queue: bool, requests: int,
            profile: Path | None = None) -> Iterator[Served]:
    """``count`` ``dsh serve`` processes of one configuration (``profile``: each under cProfile,
    its stats written to ``<profile>/<name>-<index>.prof`` when it exits)."""
    base = scratch / name
    (base / "ws").mkdir(parents=True)
    config = base / "dsh.yml"
    config.write_text((c.REPO_DIR / "configs" / ("postgres.yml" if queue else "default.yml"))
                      .read_text())
    prefix = f"dsh_bench{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"}
    if queue:
        env.update(DSH_POSTGRES_DSN=f"{DSN} application_name={prefix}",
                   DSH_POSTGRES_SCHEMA=f"{prefix}_main")
    procs: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    try:
        for index in range(count):
            work = base / f"work-{index}"
            work.mkdir()
            wrap = ([] if profile is None else
                    ["-m", "cProfile", "-o", str(profile / f"{name}-{index}.prof")])
            command = [
                sys.executable, *wrap, "-m", "dsh_host", "serve", "--config", str(config),
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
        verify = ["--config", str(config)] + ([] if queue else ["--root", str(base / "sessions")])
        yield Served(urls, [p.pid for p in procs], verify, env, prefix if queue else "",
                     postgres_bound(config) if queue else 0)
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


async def _drop(url: str, index: int) -> None:
    """A client that goes away mid-request: half mid-body, half with a stream open."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        if index % 2:
            await stream.send(f"POST /sessions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                              "Content-Type: application/json\r\nContent-Length: 64\r\n\r\n"
                              "{".encode())
        else:
            await stream.send(f"GET /sessions/x/stream HTTP/1.1\r\nHost: {host}:{port}\r\n"
                              "\r\n".encode())
            await stream.receive()


async def _warm_up(client: httpx.AsyncClient, urls: list[str]) -> None:
    """One session, one turn on each server: hosts booted, pools warm (the baseline)."""
    for url in urls:
        created = (await client.post(f"{url}/sessions", json={"id": f"warm-{uuid.uuid4().hex}"}))
        created.raise_for_status()
        session_id = created.json()["id"]
        while True:
            posted = await client.post(f"{url}/sessions/{session_id}/turns",
                                       json={"prompt": "warm up"})
            if posted.status_code != 409:
                break
            await anyio.sleep(0.05)
        while True:
            session = (await client.get(f"{url}/sessions/{session_id}")).json()
            if session["lastTurnEnd"] is not None and session["status"] == "idle":
                break
            await anyio.sleep(0.05)


def job_phases(application_name: str, since: float) -> dict[str, Any]:
    """Where a queued turn's job waits, from procrastinate's own event rows (timestamps of
    PostgreSQL's clock) of the jobs deferred after ``since`` (epoch seconds): ``pickup``
    (deferred to taken by a worker), ``held`` (taken to marked finished: the turn, the
    session's release, the finish), ``next`` (a job marked finished to the next job of the
    same session deferred: the client seeing ``turn/end``, its POST, any 409 retry), p50 and
    p99 in ms."""
    import psycopg

    schema = f"{application_name}_queue"
    query = (
        "SELECT j.lock, j.id, "
        "extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'deferred')), "
        "extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'started')), "
        "extract(epoch FROM max(e.at) FILTER (WHERE e.type IN ('succeeded', 'failed', "
        "'cancelled', 'aborted'))) "
        f'FROM "{schema}".procrastinate_jobs j JOIN "{schema}".procrastinate_events e '
        "ON e.job_id = j.id GROUP BY j.lock, j.id ORDER BY j.lock, j.id")
    with psycopg.connect(DSN, autocommit=True) as conn:
        rows = [r for r in conn.execute(query).fetchall()
                if r[2] is not None and float(r[2]) >= since]
    pickup = [(float(r[3]) - float(r[2])) * 1000 for r in rows if r[3] is not None]
    held = [(float(r[4]) - float(r[3])) * 1000 for r in rows
            if r[3] is not None and r[4] is not None]
    following = [((float(b[2]) - float(a[4])) * 1000) for a, b in itertools.pairwise(rows)
                 if a[0] == b[0] and a[4] is not None]

    def spread(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        return {"p50": round(c.percentile(values, 50), 1),
                "p99": round(c.percentile(values, 99), 1)}

    return {"jobs": len(rows), "pickup_ms": spread(pickup), "held_ms": spread(held),
            "next_ms": spread(following)}


def _log_size(path: Path | None) -> int:
    return path.stat().st_size if path is not None else 0


#: What a logged statement is, by a marker in its text (the first that matches).
STATEMENT_KINDS = (
    ("insert", "INSERT INTO"), ("notify", "pg_notify"),
    ("fetch", "procrastinate_fetch_job"), ("defer", "procrastinate_defer_jobs"),
    ("finish", "procrastinate_finish_job"), ("retry", "procrastinate_retry_job"),
    ("heartbeat", "procrastinate_update_heartbeat"), ("lock", "pg_try_advisory_lock"),
    ("unlock", "pg_advisory_unlock"), ("read", "NULL::bigint AS seq"),
    ("read page", "SELECT seq, event"), ("revision", "COALESCE((SELECT e.seq"),
    ("jobs", "FROM procrastinate_jobs"),
)


def statements_per_turn(path: Path, start: int, end: int, turns: int) -> dict[str, float]:
    """The statements logged in ``path`` between byte offsets ``start`` and ``end``, per turn,
    by kind (:data:`STATEMENT_KINDS`; ``BEGIN``, ``COMMIT``, the empty liveness check, and
    ``other``)."""
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", "replace")
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith(("\t", " ")) and entries:
            entries[-1] += " " + line.strip()  # a statement's next lines
        else:
            entries.append(line)
    kinds: dict[str, int] = {}
    for entry in entries:
        for marker in ("LOG:  statement: ", "LOG:  execute "):
            at = entry.find(marker)
            if at < 0:
                continue
            query = entry[at + len(marker):]
            if marker.endswith("execute "):
                query = query.split(":", 1)[1] if ":" in query else ""
            words = query.strip().split()
            head = words[0].upper() if words else "(empty)"
            kind = head if head in ("BEGIN", "COMMIT", "(empty)") else next(
                (name for name, text in STATEMENT_KINDS if text in query), "other")
            kinds[kind] = kinds.get(kind, 0) + 1
    per = {kind: round(count / turns, 2) for kind, count in sorted(kinds.items())}
    per["all"] = round(sum(kinds.values()) / turns, 2)
    return per


async def drive(served: Served, sessions: int, turns: int, followers: int = 0,
                dropped: int = 0, pg_log: Path | None = None,
                client_kind: str = "lean") -> dict[str, Any]:
    urls = served.urls
    # the timed window's POSTs and streams: the lean client (keep-alive connections, a
    # minimal HTTP/1.1 and SSE reader) or httpx; everything outside it goes through httpx
    lean = {url: LeanClient(url) for url in urls} if client_kind == "lean" else None
    delivery_ms: list[float] = []
    turn_ms: list[float] = []
    busy_retries = [0]
    #: per turn, epoch ms: POST sent, 202 received, turn/start and turn/end appended (the
    #: events' ``time``), turn/end received: where a turn's latency goes
    phases: list[tuple[float, float, float, float, float]] = []
    accepted: dict[str, list[str]] = {}
    seen: dict[str, list[list[int]]] = {}
    conns = 4 * sessions * (1 + followers)
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(timeout=600) as warm:
        await _warm_up(warm, urls)
    # The warm-up's connections are closed: once the servers closed theirs too, the baseline.
    census, _ = await settle(served, lambda i, census: census["http"] == 0)
    baseline = {"fds": [_fds(p) for p in served.pids], "census": census,
                "targets": [fd_targets(p) for p in served.pids],
                "rss_mb": [_rss_mb(p) for p in served.pids]}
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
        cpu_start = CpuMark.take(served)
        epoch_start = time.time()
        log_start = _log_size(pg_log)
        wall_start = time.perf_counter()

        async def post_turn(url: str, session_id: str, prompt: str) -> tuple[int, bytes]:
            path = f"/sessions/{session_id}/turns"
            if lean is None:
                response = await client.post(url + path, json={"prompt": prompt})
                return response.status_code, response.content
            return await lean[url].post(path, json.dumps({"prompt": prompt}).encode())

        async def one(index: int) -> None:
            session_id = ids[index]
            post_url = urls[(index + 1) % len(urls)]
            ended: dict[int, anyio.Event] = {n: anyio.Event() for n in range(1, turns + 1)}
            stamps: dict[int, list[float]] = {n: [] for n in range(1, turns + 1)}
            accepted[session_id] = []
            seen[session_id] = []

            async def follow(k: int) -> None:
                url = urls[(index + k) % len(urls)]
                seqs: list[int] = []
                seen[session_id].append(seqs)
                path = f"/sessions/{session_id}/stream?after=-1"  # history, then news
                async with contextlib.AsyncExitStack() as stack:
                    if lean is None:
                        r = await stack.enter_async_context(client.stream("GET", url + path))
                        data: AsyncIterator[str | bytes] = (
                            line[6:] async for line in r.aiter_lines()
                            if line.startswith("data: "))
                    else:
                        data = await stack.enter_async_context(
                            contextlib.aclosing(lean[url].sse_data(path)))
                    async for payload in data:
                        received = time.time() * 1000
                        event = json.loads(payload)
                        seqs.append(event["seq"])
                        if k == 0:
                            delivery_ms.append(received - event["time"])
                            if event["type"] == "turn/start":
                                stamps[event["data"]["turn"]].append(event["time"])
                        if event["type"] == "turn/end":
                            if k == 0:
                                stamps[event["data"]["turn"]] += [event["time"], received]
                                ended[event["data"]["turn"]].set()
                            if event["data"]["turn"] == turns:
                                return

            async with anyio.create_task_group() as group:
                for k in range(1 + followers):
                    group.start_soon(follow, k)
                for turn in range(1, turns + 1):
                    started = time.perf_counter()
                    posted_ms = time.time() * 1000
                    prompt = f"session {index} turn {turn}"
                    while True:  # the previous turn's job may still be releasing the session
                        status, reply = await post_turn(post_url, session_id, prompt)
                        if status != 409:
                            break
                        busy_retries[0] += 1
                        await anyio.sleep(0.05)
                    if status != 202:
                        raise SystemExit(f"POST turns of {session_id}: {status} {reply[:300]!r}")
                    answered_ms = time.time() * 1000
                    accepted[session_id].append(prompt)
                    await ended[turn].wait()
                    start, end, received_end = stamps[turn][-3:]
                    phases.append((posted_ms, answered_ms, start, end, received_end))
                    turn_ms.append((time.perf_counter() - started) * 1000)

        async def drops() -> None:
            for index in range(dropped):
                with contextlib.suppress(OSError, anyio.EndOfStream, anyio.BrokenResourceError):
                    await _drop(urls[index % len(urls)], index)

        async with anyio.create_task_group() as group:
            group.start_soon(drops)
            for index in range(sessions):
                group.start_soon(one, index)
        wall = time.perf_counter() - wall_start
        for each in (lean or {}).values():
            await each.aclose()
        log_end = _log_size(pg_log)
        cpu = cpu_per_turn(cpu_start, CpuMark.take(served), sessions * turns)
        if pg_log is not None:
            cpu["statements_per_turn"] = statements_per_turn(
                pg_log, log_start, log_end, sessions * turns)
        jobs = job_phases(served.application_name, epoch_start) if served.application_name \
            else {}
        invariants = await _invariants(client, served, accepted, seen)
    # Every client connection is closed. The descriptors settle once each server closed its
    # side, and its jobs released their sessions: no client connection left, nothing else
    # above the baseline, PostgreSQL connections within what the pools may keep. A leak never
    # settles; what is open at the deadline is then recorded (tests/server/test_load.py).
    census, settled = await settle(served, lambda i, census: (
        census["http"] == 0 and census["other"] <= baseline["census"][i]["other"]
        and census["postgres"] <= served.postgres_bound))
    invariants["fds"] = {"baseline": baseline["fds"], "after": [_fds(p) for p in served.pids],
                         "census_baseline": baseline["census"], "census_after": census,
                         "postgres_bound": served.postgres_bound, "settled": settled,
                         "targets_baseline": baseline["targets"],
                         "targets_after": [fd_targets(p) for p in served.pids]}
    invariants["rss_mb"] = {"baseline": baseline["rss_mb"],
                            "after": [_rss_mb(p) for p in served.pids]}
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
        "client": client_kind,
        "busy_retries": busy_retries[0],
        "turn_phases_ms_p50": {
            name: round(c.percentile([p[i + 1] - p[i] for p in phases], 50), 1)
            for i, name in enumerate(("post", "to_start", "run", "to_client"))},
        "delivery_p50_over_healthz": round(c.ratio(delivery_p50, floor), 1),
        "job_phases": jobs,
        "cpu_ms_per_turn": cpu,
        "followers": followers,
        "dropped": dropped,
        "invariants": invariants,
    }


async def _invariants(client: httpx.AsyncClient, served: Served,
                      accepted: dict[str, list[str]],
                      seen: dict[str, list[list[int]]]) -> dict[str, Any]:
    """What must hold after the run (see the module docstring), as counts of violations."""
    unverified: list[str] = []
    wrong_prompts: list[str] = []
    wrong_streams: list[str] = []
    for session_id, prompts in accepted.items():
        response = await client.get(f"{served.urls[-1]}/sessions/{session_id}/events")
        events = [json.loads(line) for line in response.text.splitlines()]
        stored = [e["data"]["content"][0]["text"] for e in events
                  if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"]
        if sorted(stored) != sorted(prompts):
            wrong_prompts.append(session_id)
        seqs = [e["seq"] for e in events]
        if any(got != seqs for got in seen[session_id]):
            wrong_streams.append(session_id)
        done = await anyio.run_process(
            [sys.executable, "-m", "dsh_host", "sessions", "verify", *served.verify, session_id],
            check=False, env=served.env)
        if done.returncode != 0:
            unverified.append(session_id)
    return {"sessions": len(accepted), "unverified": unverified, "wrong_prompts": wrong_prompts,
            "wrong_streams": wrong_streams,
            "prompts": sum(len(p) for p in accepted.values())}


def main() -> int:
    parser = c.parser(__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--followers", type=int, default=3,
                        help="more streams per session, each from ?after=-1 (default 3)")
    parser.add_argument("--dropped", type=int, default=200,
                        help="clients that go away mid-request (default 200)")
    parser.add_argument("--only", nargs="*", default=None, help="configurations to run")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="run each server under cProfile, stats to DIR/<config>-<i>.prof "
                        "(its figures are then not comparable)")
    parser.add_argument("--pg-log", type=Path, default=None, metavar="FILE",
                        help="PostgreSQL's log: count the statements per turn (the DSN's role "
                        "must have log_statement = 'all')")
    parser.add_argument("--client", choices=("lean", "httpx"), default="lean",
                        help="the client of the timed window's POSTs and streams (default "
                        "lean: bench/_lean_http.py)")
    args = parser.parse_args()
    sessions, turns = (6, 1) if args.small else (args.sessions, args.turns)
    followers, dropped = (1, 20) if args.small else (args.followers, args.dropped)
    configurations = [("jsonl-1", 1, False), ("queue-1", 1, True), ("queue-2", 2, True),
                      ("queue-3", 3, True)]
    if args.only:
        configurations = [conf for conf in configurations if conf[0] in args.only]
    results: dict[str, Any] = {}
    with c.scratch_dir(args.scratch, "serve_load") as scratch:
        for name, count, queue in configurations:
            print(f"{name}: {count} worker(s), {sessions} sessions x {turns} turns", flush=True)
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
            with servers(scratch, name, count, queue, requests=sessions * turns + 10,
                         profile=args.profile) as served:
                results[name] = anyio.run(drive, served, sessions, turns, followers, dropped,
                                          args.pg_log, args.client, backend=args.backend)
                print(f"  turns/s {results[name]['turns_per_s']}, job phases "
                      f"{results[name]['job_phases']}, turn phases "
                      f"{results[name]['turn_phases_ms_p50']}, busy retries "
                      f"{results[name]['busy_retries']}, cpu "
                      f"{results[name]['cpu_ms_per_turn']}", flush=True)
                if args.pg_log is not None:
                    print(f"  statements per turn: "
                          f"{results[name]['cpu_ms_per_turn']['statements_per_turn']}")
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
    c.print_table(
        "CPU ms per turn: the driver, each server process, PostgreSQL (this run's backends; "
        "every postgres process), and the turns/s 2 cores allow at that sum",
        ["config", "driver", "servers", "PG backends", "PG all", "sum", "ceiling turns/s"],
        [[name, r["cpu_ms_per_turn"]["driver"], r["cpu_ms_per_turn"]["servers"],
          r["cpu_ms_per_turn"]["postgres_backends"], r["cpu_ms_per_turn"]["postgres_all"],
          r["cpu_ms_per_turn"]["sum"], r["cpu_ms_per_turn"]["turns_per_s_ceiling_2_cores"]]
         for name, r in results.items()],
    )
    c.print_table(
        "invariants (violations; fds and RSS per server process: baseline -> after)",
        ["config", "sessions", "prompts", "unverified", "wrong prompts", "wrong streams",
         "fds", "rss MB"],
        [[name, r["invariants"]["sessions"], r["invariants"]["prompts"],
          len(r["invariants"]["unverified"]), len(r["invariants"]["wrong_prompts"]),
          len(r["invariants"]["wrong_streams"]),
          f"{r['invariants']['fds']['baseline']} -> {r['invariants']['fds']['after']}",
          f"{r['invariants']['rss_mb']['baseline']} -> {r['invariants']['rss_mb']['after']}"]
         for name, r in results.items()],
    )
    c.write_result("serve_load", {"small": args.small, "sessions": sessions, "turns": turns,
                                  "followers": followers, "dropped": dropped,
                                  "results": results, "machine": machine}, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
