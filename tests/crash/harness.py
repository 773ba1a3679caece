"""Parent side of the crash suite: run ``child.py``, kill it, judge what is stored, resume.

The suite runs against each persistence backend (a :class:`CrashStore`: the
JSONL files, or a private schema of a real PostgreSQL server). The parent
never trusts the child's memory. After the child is dead -- and, for
PostgreSQL, after the server has ended every connection it had, so that a
statement still running for the dead client has finished -- it reads the
ledger (side effects that really happened) and the session log (through a
fresh backend in read mode), and checks:

1. every call id in the ledger has a durable ``tool/call`` (no side effect
   without a record first);
2. every event the child reported as flushed is stored, at that seq, with
   that type; seqs are contiguous from 0 (no duplicates, no holes);
3. resume -- ``ctx.agent.resume`` opens the log for write, appends the
   closers, flushes -- yields exactly the closers the durable log calls for,
   computed here independently: ``TOOL_OUTCOME_UNKNOWN`` for each call with a
   durable ``tool/call`` and no result, ``TOOL_NOT_STARTED`` for each call
   only in the assistant message, ``step/end`` for an open step, and
   ``turn/end {interrupted}``; the stored prefix is untouched; then a new turn
   completes.

Violations are returned as text, never asserted here, so a test can also show
that the suite *does* report one (the composition without the policy).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec
import psycopg
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_postgres import PostgresSessionPersistence
from dsh_session_persistence_sqlite import SqliteSessionPersistence
from psycopg.conninfo import make_conninfo

from dsh_host import Row, open_host
from dsh_host._persistence.persistence import SessionNotFoundError
from dsh_host._session.events import SessionEvent, ToolCallData, ToolResultData
from dsh_host._session.messages import ToolCallBlock

CHILD = Path(__file__).with_name("child.py")
SESSION_ID = "crash-session"
UNKNOWN_TEXT_TAIL = "Do not retry blindly."
#: how long a child may take before the parent gives up on it (a hang is a failure)
CHILD_TIMEOUT = 60.0
#: how long the server may take to end a dead child's connections (bounded wait, not a limit
#: under test: the kernel closes the sockets at once and the server notices in milliseconds)
SETTLE_TIMEOUT = 30.0


def sandbox_mode() -> str:
    """``workspace-write`` when bubblewrap or Landlock works here, else unconfined."""
    from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig

    verdict = LocalSandboxProvider(SandboxLocalConfig(network="deny")).probe()
    return "workspace-write" if verdict.backend is not None else "danger-full-access"


# --------------------------------------------------------------------------- stores


class CrashStore(Protocol):
    """A persistence backend under test: the contract's ``BackendFactory`` plus the crash bits.

    ``make`` and ``child_source`` have the shape of ``BackendFactory`` in
    tests/persistence/contract.py (a *store* name selects the data: same name,
    same sessions). The crash suite adds the plugin row a host mounts over a
    store, a store name per child run, and the wait for a dead child's traces.
    """

    #: ``jsonl``, ``sqlite`` or ``postgres`` (test ids, the tally, the child's kill points)
    kind: str

    def make(self, store: str, spawn: Callable[..., Any] | None) -> Any:
        """A fresh backend instance over ``store``."""
        ...

    def child_source(self, store: str) -> str:
        """Python source defining ``make_backend(spawn)`` over ``store``."""
        ...

    def store_for(self, directory: Path) -> str:
        """The store of the child run whose files live in ``directory``."""
        ...

    def persistence(self, store: str) -> dict[str, Any]:
        """The persistence row (``name`` and ``config``) a host mounts over ``store``."""
        ...

    def settle(self, store: str) -> str | None:
        """Wait until a dead child can have no more effect on ``store``; a problem, or None."""
        ...


class JsonlStore:
    """JSONL logs: a store is a root directory under ``base``."""

    kind = "jsonl"

    def __init__(self, base: Path) -> None:
        self.base = base

    def root(self, store: str) -> str:
        return os.path.join(self.base, store)

    def make(self, store: str, spawn: Callable[..., Any] | None) -> JsonlSessionPersistence:
        return JsonlSessionPersistence(self.root(store), spawn=spawn)

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_jsonl import JsonlSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return JsonlSessionPersistence({self.root(store)!r}, spawn=spawn)\n"
        )

    def store_for(self, directory: Path) -> str:
        return str(directory.relative_to(self.base) / "sessions")

    def persistence(self, store: str) -> dict[str, Any]:
        return {"name": "session-persistence-jsonl", "config": {"root": self.root(store)}}

    def settle(self, store: str) -> str | None:
        return None  # a dead process leaves only what it wrote to the files


class SqliteStore:
    """One SQLite database per store: ``<base>/<store>/sessions.sqlite3``."""

    kind = "sqlite"

    def __init__(self, base: Path) -> None:
        self.base = base

    def root(self, store: str) -> str:
        return os.path.join(self.base, store)

    def path(self, store: str) -> str:
        return os.path.join(self.root(store), "sessions.sqlite3")

    def make(self, store: str, spawn: Callable[..., Any] | None) -> SqliteSessionPersistence:
        return SqliteSessionPersistence(self.path(store), spawn=spawn)

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_sqlite import SqliteSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return SqliteSessionPersistence({self.path(store)!r}, spawn=spawn)\n"
        )

    def store_for(self, directory: Path) -> str:
        return str(directory.relative_to(self.base) / "sessions")

    def persistence(self, store: str) -> dict[str, Any]:
        return {"name": "session-persistence-sqlite", "config": {"root": self.root(store)}}

    def settle(self, store: str) -> str | None:
        return None  # SQLite rolls a dead writer's open transaction back at the next open


class PostgresStore:
    """PostgreSQL: a store is the schema ``<prefix>_<store>`` on the test server.

    A child's connections carry ``application_name=dsh-crash-<store>`` (set in
    its DSN, which the backend keeps), so the parent can wait for the server to
    end exactly that child's sessions: until then a statement the child sent
    may still commit, and its advisory lock is still held.
    """

    kind = "postgres"

    def __init__(self, dsn: str, prefix: str) -> None:
        self.dsn = dsn
        self.prefix = prefix

    def schema(self, store: str) -> str:
        return f"{self.prefix}_{store}"

    def application_name(self, store: str) -> str:
        return f"dsh-crash-{store}"

    def make(self, store: str, spawn: Callable[..., Any] | None) -> PostgresSessionPersistence:
        return PostgresSessionPersistence(self.dsn, schema=self.schema(store), spawn=spawn)

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_postgres import PostgresSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return PostgresSessionPersistence({self.dsn!r}, schema={self.schema(store)!r}, "
            "spawn=spawn)\n"
        )

    def store_for(self, directory: Path) -> str:
        return directory.name

    def persistence(self, store: str) -> dict[str, Any]:
        dsn = make_conninfo(self.dsn, application_name=self.application_name(store))
        return {
            "name": "session-persistence-postgres",
            "config": {"dsn": dsn, "schema": self.schema(store)},
        }

    def settle(self, store: str) -> str | None:
        name = self.application_name(store)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
                if row is None or row[0] == 0:
                    return None
                if time.monotonic() > deadline:
                    return (
                        f"the server still had {row[0]} connection(s) of the dead child "
                        f"({name}) after {SETTLE_TIMEOUT:.0f} s"
                    )
                time.sleep(0.002)


# --------------------------------------------------------------------------- running


@dataclass
class ChildRun:
    """One child process: what it printed and how it ended."""

    label: str
    directory: Path
    spec: dict[str, Any]
    factory: CrashStore
    store: str
    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    #: seconds from ``ready`` to ``done`` (clean runs only)
    span: float | None = None

    @property
    def workspace(self) -> Path:
        return Path(self.spec["workspace"])

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def kill_point(self) -> str | None:
        for line in self.lines:
            if line.startswith("kill "):
                return line[len("kill ") :]
        return None

    @property
    def finished(self) -> bool:
        return "done" in self.lines

    @property
    def flushed(self) -> list[tuple[int, str, str]]:
        out = []
        for line in self.lines:
            parts = line.split()
            if parts and parts[0] == "flushed":
                out.append((int(parts[1]), parts[2], parts[3]))
        return out

    def ledger(self) -> list[str]:
        path = self.workspace / "ledger"
        if not path.exists():
            return []
        text = path.read_text()
        complete = text if text.endswith("\n") else text.rsplit("\n", 1)[0]
        return [line for line in complete.splitlines() if line]

    def describe(self) -> str:
        tail = "\n".join(self.lines[-12:])
        return (
            f"{self.factory.kind} run {self.label!r} in {self.directory}, store {self.store!r} "
            f"(exit {self.returncode}, "
            f"kill point {self.kill_point!r})\nlast stdout lines:\n{tail}\n"
            f"stderr tail:\n{self.stderr[-2000:]}"
        )


def new_spec(
    directory: Path,
    factory: CrashStore,
    *,
    kill: dict[str, Any] | None = None,
    policy: bool = True,
    backend: str = "trio",
    sandbox: str = "workspace-write",
) -> dict[str, Any]:
    """The child's spec; ``persistence`` is ``factory``'s row over the run's own store."""
    workspace = directory / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    return {
        "persistence": factory.persistence(factory.store_for(directory)),
        "workspace": str(workspace),
        "session": SESSION_ID,
        "policy": policy,
        "sandbox": sandbox,
        "backend": backend,
        "kill": kill,
        "idle": 0.3,
    }


def run_child(
    label: str, spec: dict[str, Any], factory: CrashStore, *, kill_after: float | None = None
) -> ChildRun:
    """Run one child to its end; ``kill_after``: SIGKILL it that long after ``ready``.

    ``spec`` comes from :func:`new_spec` with the same ``factory``.
    """
    directory = Path(spec["workspace"]).parent
    run = ChildRun(label, directory, spec, factory, factory.store_for(directory))
    env = dict(os.environ, DSH_CRASH_SPEC=json.dumps(spec), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(CHILD)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    ready = threading.Event()
    stamps: dict[str, float] = {}
    err_chunks: list[str] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if not raw.endswith("\n"):
                break  # a line cut by the kill is not a report
            line = raw.rstrip("\n")
            run.lines.append(line)
            if line in ("ready", "done"):
                stamps[line] = time.monotonic()
            if line == "ready":
                ready.set()
        ready.set()

    def read_stderr() -> None:
        assert proc.stderr is not None
        err_chunks.append(proc.stderr.read())

    readers = [threading.Thread(target=read_stdout), threading.Thread(target=read_stderr)]
    for reader in readers:
        reader.daemon = True
        reader.start()
    try:
        if kill_after is not None:
            ready.wait(CHILD_TIMEOUT)
            time.sleep(kill_after)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        proc.wait(CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        run.lines.append("<parent: child timed out>")
    for reader in readers:
        reader.join(10)
    run.returncode = proc.returncode
    run.stderr = "".join(err_chunks)
    if "ready" in stamps and "done" in stamps:
        run.span = stamps["done"] - stamps["ready"]
    return run


# --------------------------------------------------------------------------- reading


def read_log(
    factory: CrashStore, store: str, session_id: str = SESSION_ID
) -> tuple[SessionEvent, ...] | None:
    """The durable log as a fresh reader sees it (None: nothing was ever published)."""

    async def read() -> tuple[SessionEvent, ...] | None:
        reader = factory.make(store, None)  # reads only: no write window to spawn
        try:
            handle = await reader.open(session_id, "read")
            load = await handle.read()
        except SessionNotFoundError:
            return None
        finally:
            await reader.aclose()
        return tuple(load.events)

    return anyio.run(read, backend="trio")


def durable_call_ids(events: Sequence[SessionEvent]) -> set[str]:
    return {e.data.call_id for e in events if isinstance(e.data, ToolCallData)}


def check_crash(run: ChildRun, events: Sequence[SessionEvent] | None) -> list[str]:
    """Invariants 1 and 2 (see the module docstring); returns the violations."""
    problems: list[str] = []
    log = list(events or ())
    calls = durable_call_ids(log)
    for call_id in run.ledger():
        if call_id not in calls:
            problems.append(
                f"ledger entry {call_id} has no durable tool/call (a side effect without a "
                "record first)"
            )
    for seq, kind, barrier in run.flushed:
        if seq >= len(log):
            problems.append(
                f"the child reported seq {seq} ({kind}, {barrier} barrier) flushed, but the "
                f"stored log ends at {len(log) - 1}"
            )
        elif log[seq].type != kind:
            problems.append(
                f"the child reported seq {seq} as {kind} flushed, the store has {log[seq].type}"
            )
    seqs = [e.seq for e in log]
    if seqs != list(range(len(seqs))):
        problems.append(f"stored seqs are not 0..n-1: {seqs}")
    return problems


# --------------------------------------------------------------------------- repair


def expected_closers(events: Sequence[SessionEvent]) -> list[str]:
    """What resume must append, derived from the durable log alone (D7).

    ``UNKNOWN <id>`` / ``NOT_STARTED <id>`` for unanswered calls of the open
    step in transcript order, ``step/end`` for an open step, then
    ``turn/end interrupted``; ``[]`` for a balanced log.
    """
    open_turn = False
    open_step = False
    pending: dict[str, bool] = {}  # call id -> a tool/call was recorded
    for event in events:
        data = event.data
        if event.type == "turn/start":
            open_turn, open_step, pending = True, False, {}
        elif event.type == "turn/end":
            open_turn, open_step, pending = False, False, {}
        elif event.type == "step/start":
            open_step = True
        elif event.type == "step/end":
            open_step, pending = False, {}
        elif event.type == "assistant/message":
            for block in data.message.content:
                if isinstance(block, ToolCallBlock):
                    pending[block.id] = False
        elif event.type == "tool/call" and data.call_id in pending:
            pending[data.call_id] = True
        elif event.type == "tool/result":
            pending.pop(data.message.source.call_id, None)
    if not open_turn:
        return []
    out = [f"{'UNKNOWN' if started else 'NOT_STARTED'} {cid}" for cid, started in pending.items()]
    if open_step:
        out.append("step/end")
    out.append("turn/end interrupted")
    return out


def describe_closer(event: SessionEvent) -> str:
    data = event.data
    if event.type == "tool/result" and isinstance(data, ToolResultData):
        code = data.error.code if data.error else "?"
        short = {"TOOL_OUTCOME_UNKNOWN": "UNKNOWN", "TOOL_NOT_STARTED": "NOT_STARTED"}
        return f"{short.get(code, code)} {data.message.source.call_id}"
    if event.type == "turn/end":
        return f"turn/end {msgspec.to_builtins(data.reason)['kind']}"
    return event.type


@dataclass
class Resumed:
    """What resume did to one crashed log."""

    closers: list[str]
    problems: list[str]
    no_log: bool = False


def resume_rows(factory: CrashStore, store: str) -> list[Row]:
    """The resuming host: the same persistence row as the child's, the policy, a scripted model."""
    persistence = factory.persistence(store)
    return [
        Row(name="sessions"),
        Row(id="session-persistence", name=persistence["name"], config=persistence["config"]),
        Row(id="session-checkpoints", name="session-checkpoint-policy"),
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", config={"responses": [{"text": "resumed; carrying on"}]}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]


def resume_and_continue(
    factory: CrashStore,
    store: str,
    before: Sequence[SessionEvent] | None,
    *,
    backend: str = "trio",
) -> Resumed:
    """Resume the crashed session in this process, run one more turn, judge the log."""
    rows = resume_rows(factory, store)

    async def go() -> str:
        async with open_host(rows) as host:
            agent = await host.ctx.agent.resume(SESSION_ID)
            reason = await agent.run_turn("Carry on after the crash.")
            await agent.aclose()
        kind: str = msgspec.to_builtins(reason)["kind"]
        return kind

    async def go_missing() -> None:
        async with open_host(rows) as host:
            await host.ctx.agent.resume(SESSION_ID)

    if before is None:
        try:
            anyio.run(go_missing, backend=backend)
        except SessionNotFoundError:
            return Resumed([], [], no_log=True)
        return Resumed([], ["resume of a session that was never published did not fail"])

    kind = anyio.run(go, backend=backend)
    after = read_log(factory, store) or ()
    problems: list[str] = []
    if kind != "completed":
        problems.append(f"the turn after resume ended {kind!r}, not completed")
    if list(after[: len(before)]) != list(before):
        problems.append("resume changed the stored prefix")
    expected = expected_closers(before)
    appended = list(after[len(before) :])
    got = [describe_closer(e) for e in appended[: len(expected)]]
    if got != expected:
        problems.append(f"closers {got} != expected {expected}")
    calls = {e.data.call_id: e.seq for e in before if isinstance(e.data, ToolCallData)}
    for event in appended[: len(expected)]:
        data = event.data
        if isinstance(data, ToolResultData) and data.error and data.error.code:
            call_id = data.message.source.call_id
            text = data.message.content[0].content[0].text  # type: ignore[union-attr]
            cites = list(event.source_event_seqs or ())
            if data.error.code == "TOOL_OUTCOME_UNKNOWN":
                if not text.endswith(UNKNOWN_TEXT_TAIL):
                    problems.append(f"unknown-outcome text for {call_id} is {text!r}")
                if cites != [calls.get(call_id)]:
                    problems.append(f"repaired result of {call_id} cites {cites}")
            elif cites:
                problems.append(f"not-started result of {call_id} cites {cites}")
    rest = [e.type for e in appended[len(expected) :]]
    if not rest or rest[0] != "session/end-seed":
        problems.append(f"no session/end-seed after the closers: {rest[:3]}")
    if "turn/start" not in rest or rest[-1] != "turn/end":
        problems.append(f"no new turn after resume: {rest}")
    seqs = [e.seq for e in after]
    if seqs != list(range(len(seqs))):
        problems.append("seqs after resume are not 0..n-1")
    return Resumed(got, problems)


# --------------------------------------------------------------------------- tally


_OUTCOME_NAMES = {
    "UNKNOWN": "tool/result TOOL_OUTCOME_UNKNOWN",
    "NOT_STARTED": "tool/result TOOL_NOT_STARTED",
    "step/end": "step/end (open step closed)",
    "turn/end": "turn/end {interrupted}",
}


@dataclass
class Tally:
    """Counts for the closing note (written to ``$DSH_CRASH_REPORT`` when set)."""

    runs: int = 0
    kills: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    points: Counter[str] = field(default_factory=Counter)
    #: at points where a lost and a stored batch are both correct: which one happened
    either: Counter[str] = field(default_factory=Counter)

    def add(self, run: ChildRun, resumed: Resumed) -> None:
        self.runs += 1
        self.kills += int(run.killed)
        self.points[run.label.split(":")[0]] += 1
        if resumed.no_log:
            self.outcomes["no log published"] += 1
        elif not resumed.closers:
            self.outcomes["balanced log (no repair)"] += 1
        for closer in resumed.closers:
            self.outcomes[_OUTCOME_NAMES.get(closer.split()[0], closer)] += 1

    def as_json(self) -> dict[str, Any]:
        outcomes = dict(sorted(self.outcomes.items()))
        return {
            "runs": self.runs,
            "kills": self.kills,
            "outcomes": outcomes,
            "runsPerKind": dict(sorted(self.points.items())),
            "eitherPoints": dict(sorted(self.either.items())),
        }


#: one tally per persistence backend (``CrashStore.kind``)
TALLY: dict[str, Tally] = {}


def judge(run: ChildRun, *, backend: str = "trio") -> tuple[list[str], Resumed]:
    """Invariants after the kill, then resume; returns (problems, what resume did)."""
    settled = run.factory.settle(run.store)
    if settled is not None:
        return [settled], Resumed([], [settled])
    events = read_log(run.factory, run.store)
    problems = check_crash(run, events)
    resumed = resume_and_continue(run.factory, run.store, events, backend=backend)
    problems += resumed.problems
    if events is None and (run.ledger() or run.flushed):
        problems.append("no log stored, yet side effects or flushes were reported")
    TALLY.setdefault(run.factory.kind, Tally()).add(run, resumed)
    return problems, resumed
