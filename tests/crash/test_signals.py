"""Interrupting the real ``dsh run`` with signals keeps the log honest (D18, issue 14 item 1).

Every test runs the real command line in a subprocess (a scripted model, the
real ``bash`` tool, the shipped JSONL backend), sends it real signals, and then
judges only from the disk: it reads the stored log with a fresh backend, runs
the real ``dsh resume``, and reads the log again. The invariant, on every
path:

- on disk, no ``step/end`` is ever written while a call of that step lacks its
  ``tool/result``;
- after ``dsh resume``, every durable ``tool/call`` has exactly one
  ``tool/result``, every requested call is answered, and every turn has ended;
- a call whose body had started and was stopped is never "not started" and
  never a success;
- the process exits 130 / 143 / 129 and prints no traceback.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_postgres import PostgresSessionPersistence
from dsh_session_persistence_sqlite import SqliteSessionPersistence
from postgres.conftest import DSN, drop_schemas

from dsh_host._persistence.persistence import SessionNotFoundError
from dsh_host._session.events import (
    AssistantMessageData,
    SessionEvent,
    StepEnd,
    ToolCallData,
    ToolResultData,
    TurnEnd,
    TurnStart,
)
from dsh_host._session.messages import ToolCallBlock

# slow: real processes signalled and killed at chosen and random moments
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
#: a hang guard only (a stuck child is a failure), never a timing assertion
TIMEOUT = 90.0


# --------------------------------------------------------------------------- the judge


class Store:
    """Where the runs keep their sessions: JSONL files or an SQLite database
    (``configs/sqlite.yml``) under the run's directory, or a private schema of the real
    PostgreSQL server (``configs/postgres.yml``)."""

    def __init__(self, kind: str, prefix: str = "") -> None:
        self.kind = kind
        self.prefix = prefix

    def composition(self) -> Path:
        name = {"postgres": "postgres.yml", "sqlite": "sqlite.yml"}.get(self.kind, "default.yml")
        return REPO / "configs" / name

    def env(self, run_dir: Path) -> dict[str, str]:
        if self.kind != "postgres":
            return {}
        return {"DSH_POSTGRES_DSN": DSN, "DSH_POSTGRES_SCHEMA": self.schema(run_dir)}

    def schema(self, run_dir: Path) -> str:
        return f"{self.prefix}_{run_dir.name.lower()}"[:63]

    def backend(self, run_dir: Path) -> Any:
        if self.kind == "postgres":
            return PostgresSessionPersistence(DSN, schema=self.schema(run_dir))
        if self.kind == "sqlite":
            return SqliteSessionPersistence(str(run_dir / "sessions" / "sessions.sqlite3"))
        return JsonlSessionPersistence(str(run_dir / "sessions"))


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param in ("jsonl", "sqlite"):
        yield Store(request.param)
        return
    try:
        psycopg.connect(DSN, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL server answers at {DSN!r} ({exc})")
    prefix = f"dsh_sig{uuid.uuid4().hex[:10]}"
    try:
        yield Store("postgres", prefix)
    finally:
        drop_schemas(DSN, prefix)


def read_log(store: Store, run_dir: Path, session_id: str) -> list[SessionEvent]:
    async def read() -> list[SessionEvent]:
        backend = store.backend(run_dir)
        handle = await backend.open(session_id, "read")
        try:
            load = await handle.read()
        finally:
            await handle.close()
        return list(load.events)

    return anyio.run(read)


def violations(events: list[SessionEvent], *, repaired: bool) -> list[str]:
    """What breaks the invariant in a stored log (``repaired``: after ``dsh resume``)."""
    found: list[str] = []
    requested: dict[tuple[int, int], list[str]] = {}
    calls: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    open_turns: set[int] = set()
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            open_turns.add(data.turn)
        elif isinstance(data, TurnEnd):
            open_turns.discard(data.turn)
        elif isinstance(data, AssistantMessageData):
            ids = [b.id for b in data.message.content if isinstance(b, ToolCallBlock)]
            requested.setdefault((data.turn, data.step), []).extend(ids)
        elif isinstance(data, ToolCallData):
            calls[data.call_id] += 1
        elif isinstance(data, ToolResultData):
            answered[data.message.source.call_id] += 1
        elif isinstance(data, StepEnd):
            missing = [i for i in requested.get((data.turn, data.step), []) if not answered[i]]
            if missing:
                found.append(f"step/end of step {data.step} (seq {event.seq}) with {missing} open")
    for call_id, count in answered.items():
        if count > 1:
            found.append(f"{call_id} has {count} tool/results")
    if repaired:
        for call_id in calls:
            if answered[call_id] != 1:
                found.append(f"durable tool/call {call_id} has {answered[call_id]} results")
        for ids in requested.values():
            for call_id in ids:
                if not answered[call_id]:
                    found.append(f"requested call {call_id} was never answered")
        if open_turns:
            found.append(f"turns {sorted(open_turns)} never ended")
    return found


def result_codes(events: list[SessionEvent]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for event in events:
        if isinstance(event.data, ToolResultData):
            error = event.data.error
            out[event.data.message.source.call_id] = getattr(error, "code", None)
    return out


def turn_end_kinds(events: list[SessionEvent]) -> list[str]:
    return [
        msgspec.to_builtins(e.data.reason)["kind"] for e in events if isinstance(e.data, TurnEnd)
    ]


# --------------------------------------------------------------------------- running dsh


class Run:
    """One real ``dsh run`` subprocess over a scripted model."""

    def __init__(
        self, store: Store, tmp: Path, responses: list[dict[str, Any]], **env: str
    ) -> None:
        self.store = store
        self.tmp = tmp
        self.root = tmp / "sessions"
        self.workspace = tmp / "ws"
        self.workspace.mkdir(exist_ok=True)
        # commands run beside the sessions, never above them: a session root inside the
        # directory a command works in is refused (D15)
        self.cwd = tmp / "cwd"
        self.cwd.mkdir(exist_ok=True)
        self.session_id = f"sig-{os.getpid()}-{random.randrange(1 << 30):x}"
        script = tmp / "script.json"
        script.write_text(json.dumps({"responses": responses}))
        self.config = tmp / "composition.yml"
        self.config.write_text(
            store.composition().read_text().replace(
                "    sandbox: workspace-write\n",
                "    sandbox: danger-full-access\n    killGraceMs: 20000\n",
            )
        )
        self.env = {**os.environ, "DSH_INTERRUPT_GRACE_S": "30", **store.env(tmp), **env}
        self.env.pop("DSH_SESSION_ROOT", None)
        self.argv = [
            sys.executable, "-m", "dsh_host", "run", "go",
            "--model", f"scripted:{script}", "--session", self.session_id, "--new",
            "--workspace", str(self.workspace), *self.root_flag(), "--config", str(self.config),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None

    def root_flag(self) -> list[str]:
        return ["--root", str(self.root)] if self.store.kind in ("jsonl", "sqlite") else []

    def start(self) -> subprocess.Popen[str]:
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # our signals only, not the test runner's terminal's
        )
        return self.proc

    def wait_for(self, path: Path) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not (path.exists() and path.read_text().strip()):
            assert self.proc is not None
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"dsh exited {self.proc.returncode} early:\n{out}\n{err}")
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.02)

    def finish(self) -> tuple[int, str, str]:
        assert self.proc is not None
        out, err = self.proc.communicate(timeout=TIMEOUT)
        return self.proc.returncode, out, err

    def log(self) -> list[SessionEvent]:
        return read_log(self.store, self.tmp, self.session_id)

    def resume(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dsh_host", "resume", self.session_id, *self.root_flag(),
             "--config", str(self.config), "--model", "demo"],
            cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=TIMEOUT,
        )  # fmt: skip


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {"name": "bash", "id": call_id, "arguments": {"command": command, "description": "x"}}


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text
        assert "BaseExceptionGroup" not in text, text


def kill_leftover(pid_file: Path) -> None:
    """A test that makes dsh exit at once leaves its command behind (by design): end it."""
    try:
        os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- the paths


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_first_signal_during_a_tool_body_cancels_the_turn_cooperatively(
    store: Store, tmp_path: Path, sig: signal.Signals
) -> None:
    marker = tmp_path / "ws" / "started"
    run = Run(
        store,
        tmp_path,
        [
            {"tool_calls": [bash_call("c1", f"echo $$ > {marker}; sleep 60; echo end")]},
            {"text": "never asked"},
        ],
    )
    run.start()
    run.wait_for(marker)
    assert run.proc is not None
    os.kill(run.proc.pid, sig)
    code, out, err = run.finish()
    no_traceback(out, err)
    assert code == EXIT[sig], err
    events = run.log()
    assert violations(events, repaired=True) == []  # balanced without any repair
    assert result_codes(events) == {"c1": "TOOL_OUTCOME_UNKNOWN"}
    assert turn_end_kinds(events) == ["aborted"]
    # the command itself was stopped, not abandoned
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)
    resumed = run.resume()
    no_traceback(resumed.stdout, resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr
    assert "nothing to repair" in resumed.stdout


def test_first_sigint_during_the_model_stream_keeps_the_visible_prefix(
    store: Store, tmp_path: Path
) -> None:
    words = " ".join(f"word{i}" for i in range(400))
    run = Run(store, tmp_path, [{"text": words, "chunk_delay_ms": 20}])
    proc = run.start()
    assert proc.stdout is not None
    seen = ""
    while "word5 " not in seen:  # the transcript prints text as it streams
        seen += proc.stdout.read(1)
        assert proc.poll() is None, seen
    os.kill(proc.pid, signal.SIGINT)
    code, out, err = run.finish()
    no_traceback(out, err)
    assert code == 130, err
    events = run.log()
    kept = [e.data for e in events if isinstance(e.data, AssistantMessageData)]
    assert len(kept) == 1 and kept[0].interrupted is True
    [block] = kept[0].message.content
    text = getattr(block, "text", "")
    assert text.startswith("word0 word1 word2 word3 word4 word5 ") and text != words
    assert turn_end_kinds(events) == ["aborted"]
    assert violations(events, repaired=True) == []


def test_a_second_sigint_within_the_grace_period_exits_at_once(
    store: Store, tmp_path: Path
) -> None:
    marker = tmp_path / "ws" / "started"
    # The command ignores SIGTERM, so the cooperative stop has to wait for the tool's
    # kill grace (20 s here): the second Ctrl-C must not wait for it.
    run = Run(
        store,
        tmp_path,
        [{"tool_calls": [bash_call("c1", f"trap '' TERM; echo $$ > {marker}; sleep 60")]}],
    )
    run.start()
    try:
        run.wait_for(marker)
        assert run.proc is not None
        os.kill(run.proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.kill(run.proc.pid, signal.SIGINT)
        code, out, err = run.finish()
    finally:
        kill_leftover(marker)
    no_traceback(out, err)
    assert code == 130, err
    assert "exiting now" in err
    before = run.log()
    assert violations(before, repaired=False) == []
    assert "c1" in {e.data.call_id for e in before if isinstance(e.data, ToolCallData)}
    resumed = run.resume()
    no_traceback(resumed.stdout, resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr
    assert "repair: c1 OUTCOME_UNKNOWN" in resumed.stdout
    after = run.log()
    assert violations(after, repaired=True) == []
    assert result_codes(after) == {"c1": "TOOL_OUTCOME_UNKNOWN"}


def test_a_turn_that_does_not_stop_within_the_grace_period_exits_anyway(
    store: Store, tmp_path: Path
) -> None:
    marker = tmp_path / "ws" / "started"
    run = Run(
        store,
        tmp_path,
        [{"tool_calls": [bash_call("c1", f"trap '' TERM; echo $$ > {marker}; sleep 60")]}],
        DSH_INTERRUPT_GRACE_S="1",
    )
    run.start()
    try:
        run.wait_for(marker)
        assert run.proc is not None
        os.kill(run.proc.pid, signal.SIGTERM)
        code, out, err = run.finish()
    finally:
        kill_leftover(marker)
    no_traceback(out, err)
    assert code == 143, err
    assert "still running 1 s after SIGTERM" in err
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stderr
    assert violations(run.log(), repaired=True) == []


RANDOM_RUNS = {
    "jsonl": int(os.environ.get("DSH_SIGNAL_RUNS", "12")),
    "sqlite": int(os.environ.get("DSH_SIGNAL_RUNS_SQLITE", "6")),
    "postgres": int(os.environ.get("DSH_SIGNAL_RUNS_POSTGRES", "6")),
}


def test_signals_at_random_moments_keep_the_invariant(store: Store, tmp_path: Path) -> None:
    """SIGINT / SIGTERM / SIGHUP (and sometimes a second one) at random moments of a run
    with several steps, parallel-looking bursts of short commands and streamed text."""
    rng = random.Random(int(os.environ.get("DSH_SIGNAL_SEED", "14")))
    responses: list[dict[str, Any]] = []
    for step in range(4):
        responses.append(
            {
                "text": " ".join(f"s{step}w{i}" for i in range(15)),
                "chunk_delay_ms": 5,
                "tool_calls": [
                    bash_call(f"s{step}c{n}", f"sleep 0.{rng.randrange(1, 4)}; echo {n}")
                    for n in range(2)
                ],
            }
        )
    responses.append({"text": "all done"})
    tally: Counter[str] = Counter()
    for index in range(RANDOM_RUNS[store.kind]):
        workdir = tmp_path / f"run{index}"
        workdir.mkdir()
        run = Run(store, workdir, responses, DSH_INTERRUPT_GRACE_S="5")
        proc = run.start()
        sig = rng.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
        time.sleep(rng.uniform(0.3, 3.0))  # boot takes ~0.5-1 s: some land before the turn
        twice = rng.random() < 0.3
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            if twice:
                time.sleep(rng.uniform(0.0, 0.3))
                if proc.poll() is None:
                    os.kill(proc.pid, sig)
        code, out, err = run.finish()
        label = f"run {index}: {sig.name}{' x2' if twice else ''} -> exit {code}"
        no_traceback(out, err)
        if code < 0:
            # Killed by the signal itself: while Python was still starting (before dsh's
            # handlers exist) or finalizing (after they are gone). A shell reports that as
            # 128 + N too; the log must hold all the same.
            tally["died of the signal"] += 1
            code = 128 - code
        assert code in (0, EXIT[sig]), f"{label}\n{err}"
        tally[f"exit {code}"] += 1
        try:
            before = run.log()
        except Exception as exc:  # nothing published yet (signal during boot)
            assert isinstance(exc, SessionNotFoundError), exc
            tally["no log"] += 1
            continue
        assert violations(before, repaired=False) == [], label
        resumed = run.resume()
        no_traceback(resumed.stdout, resumed.stderr)
        assert resumed.returncode == 0, f"{label}\n{resumed.stderr}"
        after = run.log()
        assert violations(after, repaired=True) == [], label
        for call_id, code_ in result_codes(after).items():
            tally[code_ or "ok"] += 1
            assert call_id
        tally["repaired" if "repair:" in resumed.stdout else "balanced"] += 1
    print(store.kind, dict(tally))
