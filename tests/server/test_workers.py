"""Many ``dsh serve --queue`` workers on one PostgreSQL: a turn is a job exactly one takes.

Three real worker processes share the sessions (PostgreSQL persistence) and the job queue
(procrastinate). The worker running a turn is SIGKILLed while its side-effecting tool call is
in flight; the job completes on another worker, which resumes the session (repair as always:
the in-flight call gets ``TOOL_OUTCOME_UNKNOWN``, nothing is run again), and stops there
(``--after-repair stop``). The ledger the tool writes shows the call id once; every
``tool/call`` has exactly one result; reads and streams are served by any worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from .harness import CALL, REPO

pytest.importorskip("procrastinate")


def _worker(tmp: Path, config: Path, script: Path, env: dict[str, str], name: str,
            ) -> tuple[subprocess.Popen[str], str]:
    work = tmp / f"work-{name}"
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config", str(config),
         "--model", f"scripted:{script}", "--workspace", str(tmp / "ws"), "--port", "0",
         "--queue", "--queue-schema", env["QUEUE_SCHEMA"], "--stalled-after", "3",
         "--after-repair", "stop"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=open(work / "stderr", "w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("dsh serve: listening on "), line + (work / "stderr").read_text()
    return proc, line.split()[4].rstrip("/")


@pytest.fixture
def workers(tmp_path: Path, pg_dsn: str, pg_prefix: str) -> Iterator[tuple[list[Any], Path]]:
    (tmp_path / "ws").mkdir()
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / "postgres.yml").read_text())
    script = tmp_path / "script.json"
    command = 'printf "%s\\n" "$DSH_CALL_ID" >> ledger; sleep 120'
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"id": CALL, "name": "bash", "arguments": {
            "command": command, "description": "Append to ledger, then take long",
            "timeoutMs": 300000}}]},
        {"text": "never reached: the worker that ran the call is killed"},
    ]}))
    env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
           "DSH_POSTGRES_DSN": pg_dsn, "DSH_POSTGRES_SCHEMA": f"{pg_prefix}_main",
           "QUEUE_SCHEMA": f"{pg_prefix}_queue"}
    started: list[tuple[subprocess.Popen[str], str]] = []
    try:
        for name in ("a", "b", "c"):
            started.append(_worker(tmp_path, config, script, env, name))
        yield [(proc, url, env["QUEUE_SCHEMA"]) for proc, url in started], tmp_path / "ws"
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in started:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _running_on(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("dsh_serve_turns_running "):
            return float(line.split()[1])
    return 0.0


def _poll(what: str, check: Any) -> Any:
    """Poll until ``check()`` is truthy; the test's own timeout is the only deadline."""
    while True:
        found = check()
        if found:
            return found
        time.sleep(0.1)


@pytest.mark.slow
def test_a_job_survives_its_worker_being_killed_mid_turn(
    workers: tuple[list[Any], Path], pg_dsn: str,
) -> None:
    procs, workspace = workers
    urls = [url for _, url, _ in procs]
    session_id = httpx.post(f"{urls[0]}/sessions", json={}, timeout=30).json()["id"]
    started = httpx.post(f"{urls[1]}/sessions/{session_id}/turns", json={"prompt": "append"},
                         timeout=30)
    assert started.status_code == 202, started.text
    assert started.json()["turn"] == 1
    ledger = workspace / "ledger"
    _poll("the side effect", lambda: ledger.exists() and ledger.read_text().strip())
    # A second turn while this one runs is refused by whichever worker is asked.
    busy = httpx.post(f"{urls[2]}/sessions/{session_id}/turns", json={"prompt": "x"}, timeout=30)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "SESSION_BUSY"
    running = _poll("the running worker", lambda: [
        i for i, url in enumerate(urls) if _running_on(url) == 1.0])
    assert len(running) == 1
    victim = running[0]
    procs[victim][0].send_signal(signal.SIGKILL)
    procs[victim][0].wait()
    survivors = [url for i, url in enumerate(urls) if i != victim]

    def finished() -> dict[str, Any] | None:
        session = httpx.get(f"{survivors[0]}/sessions/{session_id}", timeout=30).json()
        end = session["lastTurnEnd"]
        return session if end and end["turn"] == 1 and session["status"] == "idle" else None

    session = _poll("the repair on another worker", finished)
    assert session["lastTurnEnd"]["kind"] in ("aborted", "interrupted"), session
    response = httpx.get(f"{survivors[1]}/sessions/{session_id}/events", timeout=30)
    events = [json.loads(line) for line in response.text.splitlines()]
    calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
    results = [e["data"]["message"]["source"]["callId"] for e in events
               if e["type"] == "tool/result"]
    assert calls == [CALL] and results == [CALL]  # exactly one result per call
    result = next(e for e in events if e["type"] == "tool/result")
    assert result["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert ledger.read_text().splitlines() == [CALL]  # the side effect happened once
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT status, attempts FROM {}.procrastinate_jobs").format(
                sql.Identifier(procs[0][2]))).fetchall()
    assert [row[0] for row in rows] == ["succeeded"], rows
    assert rows[0][1] >= 2, rows  # taken again after its first worker died
    # Reads and streams come from any surviving worker: the stream replays the stored log.
    with httpx.stream("GET", f"{survivors[1]}/sessions/{session_id}/stream",
                      headers={"Last-Event-ID": str(events[-2]["seq"])}, timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("id: "):
                assert int(line[4:]) == events[-1]["seq"]
                break
