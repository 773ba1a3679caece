"""Many ``dsh serve --queue`` workers on one PostgreSQL: a turn is a job exactly one takes.

Three real worker processes share the sessions (PostgreSQL persistence) and the job queue
(procrastinate). The worker running a turn is SIGKILLed while its side-effecting tool call is
in flight; the job completes on another worker, which resumes the session (repair as always:
the in-flight call gets ``TOOL_OUTCOME_UNKNOWN``, nothing is run again), and either stops there
(``--after-repair stop``) or continues with a new turn whose prompt points the model at the
repair (``continue``). The ledger the tool writes shows the call id once; every
``tool/call`` has exactly one result; reads and streams are served by any worker.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from dsh_host._server.runtime import AFTER_REPAIR_PROMPT

from .harness import CALL, REPO

pytest.importorskip("procrastinate")


LEDGER_AND_WAIT = [
    {"tool_calls": [{"id": CALL, "name": "bash", "arguments": {
        "command": 'printf "%s\\n" "$DSH_CALL_ID" >> ledger; sleep 120',
        "description": "Append to ledger, then take long", "timeoutMs": 300000}}]},
    {"text": "never reached: the worker that ran the call is killed"},
]
#: What the workers started after the call began answer (continued after the repair).
AFTER_REPAIR_ANSWER = "The ledger call's outcome is unknown; I checked the ledger instead."


@dataclass
class Workers:
    tmp: Path
    config: Path
    env: dict[str, str]
    after_repair: str
    started: list[tuple[subprocess.Popen[str], str]] = field(default_factory=list)

    @property
    def workspace(self) -> Path:
        return self.tmp / "ws"

    @property
    def queue_schema(self) -> str:
        return self.env["QUEUE_SCHEMA"]

    def start(self, responses: list[Any], *flags: str, model: str | None = None) -> str:
        """Start one more worker process whose model answers ``responses`` (or serves
        ``model``); its URL."""
        name = str(len(self.started))
        script = self.tmp / f"script-{name}.json"
        script.write_text(json.dumps({"responses": responses}))
        work = self.tmp / f"work-{name}"
        work.mkdir()
        with open(work / "stderr", "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dsh_host", "serve", "--config", str(self.config),
                 "--model", model or f"scripted:{script}", "--workspace", str(self.workspace),
                 "--port", "0", "--queue", "--queue-schema", self.queue_schema,
                 "--stalled-after", "3", "--after-repair", self.after_repair, *flags],
                cwd=work, env=self.env, stdout=subprocess.PIPE, stderr=stderr, text=True,
            )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), line + (work / "stderr").read_text()
        url = line.split()[4].rstrip("/")
        self.started.append((proc, url))
        return url

    def stop(self) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.started:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(params=["stop", "continue"])
def workers(request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str,
            pg_prefix: str) -> Iterator[Workers]:
    (tmp_path / "ws").mkdir()
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / "postgres.yml").read_text())
    env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
           "DSH_POSTGRES_DSN": pg_dsn, "DSH_POSTGRES_SCHEMA": f"{pg_prefix}_main",
           "QUEUE_SCHEMA": f"{pg_prefix}_queue"}
    pool = Workers(tmp_path, config, env, request.param)
    try:
        yield pool
    finally:
        pool.stop()


def _running_on(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("dsh_serve_turns_running "):
            return float(line.split()[1])
    return 0.0


def _poll(check: Any) -> Any:
    """Poll until ``check()`` is truthy; the test's own timeout is the only deadline."""
    while True:
        found = check()
        if found:
            return found
        time.sleep(0.1)


@pytest.mark.slow
def test_a_job_survives_its_worker_being_killed_mid_turn(workers: Workers, pg_dsn: str) -> None:
    first = workers.start(LEDGER_AND_WAIT)
    session_id = httpx.post(f"{first}/sessions", json={}, timeout=30).json()["id"]
    started = httpx.post(f"{first}/sessions/{session_id}/turns", json={"prompt": "append"},
                         timeout=30)
    assert started.status_code == 202, started.text
    assert started.json()["turn"] == 1
    ledger = workers.workspace / "ledger"
    _poll(lambda: ledger.exists() and ledger.read_text().strip())  # the call is in flight
    # Two more workers join; their model has not answered anything yet.
    others = [workers.start([{"text": AFTER_REPAIR_ANSWER}]) for _ in range(2)]
    # A second turn while this one runs is refused by whichever worker is asked.
    busy = httpx.post(f"{others[0]}/sessions/{session_id}/turns", json={"prompt": "x"},
                      timeout=30)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "SESSION_BUSY"
    assert _running_on(first) == 1.0
    victim = workers.started[0][0]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    expected_turn = 1 if workers.after_repair == "stop" else 2

    def finished() -> dict[str, Any] | None:
        session = httpx.get(f"{others[0]}/sessions/{session_id}", timeout=30).json()
        end = session["lastTurnEnd"]
        done = end and end["turn"] == expected_turn and session["status"] == "idle"
        return session if done else None

    session = _poll(finished)
    response = httpx.get(f"{others[1]}/sessions/{session_id}/events", timeout=30)
    events = [json.loads(line) for line in response.text.splitlines()]
    calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
    results = [e["data"]["message"]["source"]["callId"] for e in events
               if e["type"] == "tool/result"]
    assert calls == [CALL] and results == [CALL]  # exactly one result per call
    result = next(e for e in events if e["type"] == "tool/result")
    assert result["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert ledger.read_text().splitlines() == [CALL]  # the side effect happened once
    turn_ends = [e["data"] for e in events if e["type"] == "turn/end"]
    assert [t["turn"] for t in turn_ends] == list(range(1, expected_turn + 1))
    if workers.after_repair == "continue":
        assert session["lastTurnEnd"]["kind"] == "completed", session
        prompts = [e["data"]["content"][0]["text"] for e in events
                   if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"]
        assert prompts == ["append", AFTER_REPAIR_PROMPT]
        answers = [b["text"] for e in events if e["type"] == "assistant/message"
                   for b in e["data"]["message"]["content"] if b["type"] == "text"]
        assert answers == [AFTER_REPAIR_ANSWER]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT status, attempts FROM {}.procrastinate_jobs").format(
            sql.Identifier(workers.queue_schema))).fetchall()
    assert [row[0] for row in rows] == ["succeeded"], rows
    assert rows[0][1] >= 2, rows  # taken again after its first worker died
    # Reads and streams come from any surviving worker: the stream replays the stored log.
    with httpx.stream("GET", f"{others[1]}/sessions/{session_id}/stream",
                      headers={"Last-Event-ID": str(events[-2]["seq"])}, timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("id: "):
                assert int(line[4:]) == events[-1]["seq"]
                break


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_cancel_reaches_the_worker_running_the_turn(workers: Workers) -> None:
    first = workers.start([{"text": "thinking", "hang": True}])
    second = workers.start([{"text": "thinking", "hang": True}])
    session_id = httpx.post(f"{second}/sessions", json={}, timeout=30).json()["id"]
    turn = httpx.post(f"{second}/sessions/{session_id}/turns", json={"prompt": "wait"},
                      timeout=30)
    assert turn.status_code == 202, turn.text
    _poll(lambda: httpx.get(f"{second}/sessions/{session_id}", timeout=30).json()["status"]
          == "running")
    runner, other = (first, second) if _running_on(first) == 1.0 else (second, first)
    cancelled = httpx.post(f"{other}/sessions/{session_id}/cancel", timeout=30)
    assert cancelled.status_code == 202, cancelled.text

    def ended() -> dict[str, Any] | None:
        session = httpx.get(f"{other}/sessions/{session_id}", timeout=30).json()
        end = session["lastTurnEnd"]
        return session if end and session["status"] == "idle" else None

    assert _poll(ended)["lastTurnEnd"]["kind"] == "aborted"
    assert runner != other


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_cancel_of_a_queued_turn_keeps_every_worker_from_taking_it(
    workers: Workers, pg_dsn: str
) -> None:
    """The only worker (concurrency 1) is busy with one session's turn, so another session's
    turn waits in the queue; cancelling it there means no worker ever takes it: nothing of it
    is written, the job is ``cancelled``, and the session takes a new turn, which gets the
    model's next answer (the cancelled turn never consumed it)."""
    url = workers.start(
        [{"text": "thinking", "hang": True}, {"text": "answered"}], "--concurrency", "1"
    )

    def status(session_id: str) -> str:
        return str(httpx.get(f"{url}/sessions/{session_id}", timeout=30).json()["status"])

    def events(session_id: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{url}/sessions/{session_id}/events", timeout=30)
        return [json.loads(line) for line in response.text.splitlines()]

    busy = httpx.post(f"{url}/sessions", json={}, timeout=30).json()["id"]
    assert httpx.post(f"{url}/sessions/{busy}/turns", json={"prompt": "wait"},
                      timeout=30).status_code == 202
    _poll(lambda: status(busy) == "running")
    waiting = httpx.post(f"{url}/sessions", json={}, timeout=30).json()["id"]
    queued = httpx.post(f"{url}/sessions/{waiting}/turns", json={"prompt": "never"}, timeout=30)
    assert queued.status_code == 202, queued.text
    assert status(waiting) == "queued"
    cancelled = httpx.post(f"{url}/sessions/{waiting}/cancel", timeout=30)
    assert cancelled.status_code == 202, cancelled.text
    assert status(waiting) == "idle"
    # Free the worker; it must not pick the cancelled job up.
    assert httpx.post(f"{url}/sessions/{busy}/cancel", timeout=30).status_code == 202
    _poll(lambda: status(busy) == "idle" and _running_on(url) == 0.0)
    time.sleep(2.5)  # more than the worker's 1 s fetch interval, twice
    assert not [e for e in events(waiting) if e["type"] in ("user/message", "turn/start")]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT lock, status FROM {}.procrastinate_jobs ORDER BY id"
        ).format(sql.Identifier(workers.queue_schema))).fetchall()
    assert dict(rows)[waiting] == "cancelled", rows
    # The session is free again; its next turn gets the answer nobody consumed.
    again = httpx.post(f"{url}/sessions/{waiting}/turns", json={"prompt": "now"}, timeout=30)
    assert again.status_code == 202, again.text
    _poll(lambda: status(waiting) == "idle" and any(
        e["type"] == "turn/end" for e in events(waiting)))
    stored = events(waiting)
    prompts = [e["data"]["content"][0]["text"] for e in stored
               if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"]
    answers = [b["text"] for e in stored if e["type"] == "assistant/message"
               for b in e["data"]["message"]["content"] if b["type"] == "text"]
    assert (prompts, answers) == (["now"], ["answered"])


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_concurrent_turns_on_one_session_are_decided_by_postgresql(
    workers: Workers, pg_dsn: str, count: int
) -> None:
    """``count`` workers, 50 waves: each wave, two ``POST /turns`` on one session go out at
    once, to two different workers. PostgreSQL decides (the job insert hits a unique index):
    exactly one is accepted (202), the other is 409 SESSION_BUSY. The accepted turn waits on
    the model (so the two requests really compete for one turn) until its prompt is stored,
    then it is cancelled. Every accepted prompt is in the log exactly once, under the turn
    number its 202 gave; no job and no session is left running."""
    urls = [workers.start([{"text": "thinking", "hang": True}] * 60) for _ in range(count)]
    session_id = httpx.post(f"{urls[0]}/sessions", json={}, timeout=30).json()["id"]
    accepted: dict[str, int] = {}
    waves = 50

    def stored_prompts() -> list[str]:
        response = httpx.get(f"{urls[-1]}/sessions/{session_id}/events", timeout=60)
        events = [json.loads(line) for line in response.text.splitlines()]
        return [e["data"]["content"][0]["text"] for e in events
                if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"]

    with ThreadPoolExecutor(max_workers=2) as pool:
        for wave in range(waves):
            barrier = threading.Barrier(2)

            def post(url: str, prompt: str, barrier: threading.Barrier = barrier) -> Any:
                barrier.wait()
                return httpx.post(f"{url}/sessions/{session_id}/turns",
                                  json={"prompt": prompt}, timeout=60)

            targets = [(urls[(wave + k) % count], f"wave {wave} via {k}") for k in range(2)]
            answers = list(pool.map(lambda target: post(*target), targets))
            won = [(prompt, r) for (_, prompt), r in zip(targets, answers, strict=True)
                   if r.status_code == 202]
            lost = [r for r in answers if r.status_code != 202]
            assert len(won) == 1, [(r.status_code, r.text) for r in answers]
            assert [(r.status_code, r.json()["error"]["code"]) for r in lost] == [
                (409, "SESSION_BUSY")], [r.text for r in lost]
            prompt, response = won[0]
            turn = response.json()["turn"]
            accepted[prompt] = turn
            _poll(lambda prompt=prompt: prompt in stored_prompts())
            cancel = httpx.post(f"{urls[wave % count]}/sessions/{session_id}/cancel", timeout=30)
            assert cancel.status_code == 202, cancel.text

            def ended(turn: int = turn) -> bool:
                session = httpx.get(f"{urls[0]}/sessions/{session_id}", timeout=30).json()
                end = session["lastTurnEnd"]
                return bool(end and end["turn"] == turn and session["status"] == "idle")

            _poll(ended)
    response = httpx.get(f"{urls[-1]}/sessions/{session_id}/events", timeout=60)
    events = [json.loads(line) for line in response.text.splitlines()]
    assert sorted(stored_prompts()) == sorted(accepted)  # each accepted prompt once, no other
    turns = [e["data"]["turn"] for e in events if e["type"] == "turn/start"]
    assert turns == list(range(1, waves + 1)) == sorted(accepted.values())
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert ends == ["aborted"] * waves
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT status FROM {}.procrastinate_jobs"
        ).format(sql.Identifier(workers.queue_schema))).fetchall()
    assert not [row for row in rows if row[0] in ("todo", "doing")], rows
    assert len(rows) == waves, rows
    for url in urls:
        session = httpx.get(f"{url}/sessions/{session_id}", timeout=30).json()
        assert session["status"] == "idle" and session["lastTurn"] == waves


#: a real 1x1 PNG
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_a_queued_turn_carries_its_attachments(workers: Workers, llmock: Any) -> None:
    """Two workers on one queue: a prompt with an image posted to one is a job whichever
    worker takes it runs with the image (the job carries the blocks, bytes inside): the log
    holds DSH's image block and the model (LLMock's Anthropic endpoint) receives it."""
    llmock.reply("A red dot.")
    workers.env.update(llmock.env())
    urls = [workers.start([], model="anthropic:claude-haiku-4-5") for _ in range(2)]
    session_id = httpx.post(f"{urls[0]}/sessions", json={}, timeout=30).json()["id"]
    data = base64.b64encode(PNG).decode()
    response = httpx.post(f"{urls[1]}/sessions/{session_id}/turns", timeout=60, json={
        "prompt": "what is this?", "attachments": [{"name": "dot.png", "data": data}]})
    assert response.status_code == 202, response.text
    turn = response.json()["turn"]

    def ended() -> Any:
        session = httpx.get(f"{urls[0]}/sessions/{session_id}", timeout=30).json()
        end = session["lastTurnEnd"]
        return session if end and end["turn"] == turn and session["status"] == "idle" else None

    session = _poll(ended)
    assert session["lastTurnEnd"]["kind"] == "completed", session
    events = [json.loads(line) for line in httpx.get(
        f"{urls[1]}/sessions/{session_id}/events", timeout=60).text.splitlines()]
    [prompt] = [e["data"] for e in events if e["type"] == "user/message"
                and e["data"]["source"]["kind"] == "user"]
    assert prompt["content"][0] == {"type": "text", "text": "what is this?"}
    assert (prompt["content"][1]["type"], prompt["content"][1]["attachment"]["data"]) == (
        "image", data)
    sent = llmock.last_request.body["messages"]
    parts = [part for message in sent if isinstance(message["content"], list)
             for part in message["content"]]
    assert {"type": "base64", "media_type": "image/png", "data": data} in [
        part.get("source") for part in parts
    ]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_a_queued_turn_for_a_model_without_vision_is_refused_before_queueing(
    workers: Workers, llmock: Any
) -> None:
    """Claude 2 reads no images (D31): the front asks the session's model before it queues the
    job, so the answer is a 400 naming the model, and no job and no prompt are left behind."""
    workers.env.update(llmock.env())
    url = workers.start([], model="anthropic:claude-2.1")
    session_id = httpx.post(f"{url}/sessions", json={}, timeout=30).json()["id"]
    response = httpx.post(f"{url}/sessions/{session_id}/turns", timeout=60, json={
        "prompt": "what is this?",
        "attachments": [{"name": "dot.png", "data": base64.b64encode(PNG).decode()}]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "IMAGES_UNSUPPORTED"
    assert 'model "claude-2.1"' in response.json()["error"]["message"]
    plain = httpx.post(f"{url}/sessions/{session_id}/turns", timeout=60,
                       json={"prompt": "hello"})
    assert (plain.status_code, plain.json()["turn"]) == (202, 1)  # the session was let go

    def prompts() -> list[Any]:
        events = [json.loads(line) for line in httpx.get(
            f"{url}/sessions/{session_id}/events", timeout=60).text.splitlines()]
        return [e["data"]["content"] for e in events if e["type"] == "user/message"
                and e["data"]["source"]["kind"] == "user"]

    assert _poll(prompts) == [[{"type": "text", "text": "hello"}]]  # only the queued one


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["stop"], indirect=True)
def test_a_worker_paused_past_its_stall_limit_finishes_its_turn_and_nothing_runs_twice(
    workers: Workers, pg_dsn: str
) -> None:
    """A worker that stops answering (SIGSTOP: a VM frozen, a debugger, a long pause) while its
    turn's tool call is in flight looks stalled: another worker's rescue retries its job. But
    the paused worker still holds the session (its PostgreSQL connection, and with it the
    session's lock, is alive), so the retried job cannot start the turn again: it waits. When
    the worker resumes, it ends its turn itself and marks the job ``succeeded`` (procrastinate
    lets a job waiting for its retry be finished); had another worker taken the retry first, it
    would find the turn ended and run nothing. The call ran once and has one known outcome;
    the other worker's model is never asked. (procrastinate's event rows show the job
    ``started`` twice: a benchmark counting jobs by their starts counts it twice.)"""
    first = workers.start([
        {"tool_calls": [{"id": CALL, "name": "bash", "arguments": {
            "command": 'printf "%s\\n" "$DSH_CALL_ID" >> ledger; sleep 4',
            "description": "Append to ledger, then take a while", "timeoutMs": 60000}}]},
        {"text": "ledger appended"},
    ])
    session_id = httpx.post(f"{first}/sessions", json={}, timeout=30).json()["id"]
    started = httpx.post(f"{first}/sessions/{session_id}/turns", json={"prompt": "append"},
                         timeout=30)
    assert started.status_code == 202, started.text
    ledger = workers.workspace / "ledger"
    _poll(lambda: ledger.exists() and ledger.read_text().strip())  # the call is in flight
    # The second worker joins now, so the job is the first's.
    second = workers.start([{"text": "never asked: the turn is not run again"}])
    paused = workers.started[0][0]

    def attempts() -> int:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute(sql.SQL("SELECT attempts FROM {}.procrastinate_jobs").format(
                sql.Identifier(workers.queue_schema))).fetchone()
        assert row is not None
        return int(row[0])

    paused.send_signal(signal.SIGSTOP)
    try:
        # Stalled after 3 s without a heartbeat: the other worker retries the job, takes it
        # and is refused the session (its attempts count), at least twice.
        _poll(lambda: attempts() >= 2)
    finally:
        paused.send_signal(signal.SIGCONT)

    def finished() -> dict[str, Any] | None:
        session = httpx.get(f"{second}/sessions/{session_id}", timeout=30).json()
        end = session["lastTurnEnd"]
        return session if end and session["status"] == "idle" else None

    session = _poll(finished)
    assert session["lastTurnEnd"]["turn"] == 1 and session["lastTurnEnd"]["kind"] == "completed"

    def job() -> tuple[str, ...]:
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(sql.SQL("SELECT status FROM {}.procrastinate_jobs").format(
                sql.Identifier(workers.queue_schema))).fetchall()
        return tuple(row[0] for row in rows)

    assert _poll(lambda: job() if "todo" not in job() and "doing" not in job() else None) == (
        "succeeded",
    )
    events = [json.loads(line) for line in httpx.get(
        f"{second}/sessions/{session_id}/events", timeout=30).text.splitlines()]
    assert ledger.read_text().splitlines() == [CALL]  # the side effect happened once
    calls = [e["data"]["callId"] for e in events if e["type"] == "tool/call"]
    results = [e["data"] for e in events if e["type"] == "tool/result"]
    assert calls == [CALL] and len(results) == 1 and not results[0].get("error"), results
    assert [e["data"]["turn"] for e in events if e["type"] == "turn/start"] == [1]
    assert [e["data"]["turn"] for e in events if e["type"] == "turn/end"] == [1]
    answers = [b["text"] for e in events if e["type"] == "assistant/message"
               for b in e["data"]["message"]["content"] if b["type"] == "text"]
    assert answers == ["ledger appended"]  # the first worker's model; the second never asked
