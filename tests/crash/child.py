"""The process the crash suite kills: real agent turns on a real host, instrumented from outside.

Run as ``python child.py`` with ``DSH_CRASH_SPEC`` holding a JSON object:

``persistence``
    the persistence row, ``{"name": ..., "config": ...}``:
    ``session-persistence-jsonl`` or ``session-persistence-postgres``;
``workspace`` / ``session``
    the bash workspace (the ledger lives there), the session id;
``policy``
    mount ``session-checkpoint-policy`` (false: the composition without it);
``sandbox``
    the ``builtin-tools`` mode (``workspace-write`` when a backend works);
``backend``
    ``trio`` or ``asyncio``;
``kill``
    where to SIGKILL ourselves (see :class:`Killer`), or null for a clean run;
``idle``
    seconds to stay idle between the two turns (the 200 ms window fires there);
``window``
    optional: the write-behind window in seconds instead of 200 ms (the test
    without the policy stretches it so the window cannot win the race).
``record``
    optional (JSONL): a file to which every ``os.write``, ``os.fsync``,
    ``os.ftruncate`` and ``os.link`` under the store's root is appended as one JSON
    line, in the order they ran, with each ``flushed`` report between them (the
    power-cut suite replays it: :class:`Recorder`);
``noise``
    optional: bytes of random base64 each ``bash`` call prints, so that a batch
    spans more than one disk page.

Nothing here touches production code: the window is a default changed in
*this* process, and every kill point is a wrapper installed in it around the
backend's writes (``os.fsync`` and ``os.link`` for JSONL;
``psycopg.Connection.execute`` of the events ``INSERT`` for PostgreSQL, the one
statement that stores a batch), the store's ``flush``, a ``tools/execute``
listener innermost in the chain (so inside the policy) and a ``session/event``
listener registered after the persistence row.

Protocol on stdout, one line each, written and flushed before going on:

* ``sandbox <mode> <backend>`` -- how ``bash`` is confined (backend None: unconfined);
* ``ready`` -- the host is up, the first turn is about to start;
* ``flushed <seq> <type> <barrier>`` -- ``ctx.sessions.flush`` returned: every
  event up to ``seq`` (the last one when the flush *started*) is durable;
* ``kill <point>`` -- about to SIGKILL ourselves at ``point``;
* ``turn <n> <kind>`` and ``done`` for a run that finished.

The scripted model drives two turns: turn 1 = a message with two ``bash``
calls, then one with one call, then text; turn 2 = one call, then text. Each
call's command appends ``$DSH_CALL_ID`` to ``ledger`` in the workspace, then
sleeps a little so that "inside the body" is a real moment.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

import anyio
import msgspec
import psycopg
from psycopg import sql

from dsh_host import Row, open_host
from dsh_host._persistence.write_behind import WriteBehind

SPEC: dict[str, Any] = json.loads(os.environ["DSH_CRASH_SPEC"])
PERSISTENCE: dict[str, Any] = SPEC["persistence"]
LEDGER = os.path.join(SPEC["workspace"], "ledger")
#: seconds each bash command sleeps after appending to the ledger
BODY_SLEEP = SPEC.get("body_sleep", 0.05)
_out_lock = threading.Lock()
if "window" in SPEC:
    # Every backend builds its WriteBehind with the default window.
    assert WriteBehind.__init__.__kwdefaults__ is not None
    WriteBehind.__init__.__kwdefaults__["window"] = float(SPEC["window"])


def say(line: str) -> None:
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def die(point: str) -> None:
    say(f"kill {point}")
    os.kill(os.getpid(), signal.SIGKILL)


def bash_call(note: str) -> dict[str, Any]:
    command = f'printf "%s\\n" "$DSH_CALL_ID" >> ledger && sleep {BODY_SLEEP}'
    if SPEC.get("noise"):
        command += f" && head -c {int(SPEC['noise'])} /dev/urandom | base64 -w 0"
    return {"name": "bash", "arguments": {"command": command, "description": note}}


class Recorder:
    """Appends the store's file operations to ``SPEC["record"]`` as they run (see above).

    Each entry is written with the real ``os.write`` under one lock, so the file holds
    them in the order the operations happened (writes run on worker threads); only
    paths under the store's root are recorded.
    """

    def __init__(self, path: str, root: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.root = os.path.realpath(root)
        self.lock = threading.Lock()
        self.real_write = os.write

    def entry(self, record: dict[str, Any]) -> None:
        self.real_write(self.fd, (json.dumps(record) + "\n").encode())

    def mine(self, fd: int) -> str | None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        return path if path.startswith(self.root + os.sep) else None

    def install(self) -> None:
        real_write, real_fsync = os.write, os.fsync
        real_truncate, real_link = os.ftruncate, os.link

        def write(fd: int, data: Any) -> int:
            path = self.mine(fd)
            if path is None:
                return real_write(fd, data)
            with self.lock:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
                written = real_write(fd, data)
                chunk = bytes(data)[:written]
                self.entry({"op": "write", "path": path, "offset": offset, "data": chunk.hex()})
            return written

        def fsync(fd: Any) -> None:
            path = self.mine(fd)
            real_fsync(fd)
            if path is not None:
                with self.lock:
                    self.entry({"op": "fsync", "path": path})

        def ftruncate(fd: int, size: int) -> None:
            path = self.mine(fd)
            with self.lock:
                real_truncate(fd, size)
                if path is not None:
                    self.entry({"op": "truncate", "path": path, "size": size})

        def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            with self.lock:
                real_link(src, dst, *args, **kwargs)
                self.entry({"op": "link", "src": os.path.realpath(src),
                            "dst": os.path.realpath(dst)})

        os.write, os.fsync = write, fsync
        os.ftruncate, os.link = ftruncate, link

    def flushed(self, seq: int) -> None:
        with self.lock:
            self.entry({"op": "flushed", "seq": seq})


RECORDER: Recorder | None = None


SCRIPT: list[dict[str, Any]] = [
    # turn 1
    {"tool_calls": [bash_call("record the first call"), bash_call("record the second call")]},
    {"tool_calls": [bash_call("record the third call here")]},
    {"text": "turn one is done"},
    # turn 2
    {"tool_calls": [bash_call("record the fourth call here")]},
    {"text": "turn two is done"},
]


def rows() -> list[Row]:
    out = [
        Row(name="sessions"),
        Row(
            id="session-persistence",
            name=PERSISTENCE["name"],
            config=PERSISTENCE["config"],
        ),
    ]
    if SPEC["policy"]:
        out.append(Row(id="session-checkpoints", name="session-checkpoint-policy"))
    out += [
        Row(name="llm"),
        Row(name="tools"),
        Row(name="llm-scripted", config={"responses": SCRIPT}),
        Row(name="sandbox-local", config={"network": "deny"}),
        Row(
            name="builtin-tools",
            config={"workspace": SPEC["workspace"], "sandbox": SPEC["sandbox"]},
        ),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    return out


#: Where to die around the events ``INSERT`` (PostgreSQL). The backend sends each
#: batch as one autocommit statement, so the client never sees "inserted, not yet
#: committed"; ``uncommitted`` reproduces that server state by sending the same
#: statement inside ``BEGIN`` (dying before ``COMMIT``). ``in-flight`` dies while
#: the server holds our request: another connection of this process locks the
#: events table first, and we die once the server reports our connection waiting
#: on it. The server then goes on for a client that is gone, with what it had
#: received: usually the INSERT, which it runs and commits (the batch is stored);
#: but the backend asks psycopg to prepare the INSERT, and psycopg sends a
#: connection's first ``Parse`` as a round trip of its own -- that is what waits
#: there, the ``Execute`` is never sent, and the batch is lost. Either is correct.
INSERT_PHASES = ("before-insert", "uncommitted", "in-flight", "after-commit")
#: barrier phases armed for the duration of the flush (fired by the first write)
ARMED_PHASES = ("before-fsync", "after-fsync", *INSERT_PHASES)


class Killer:
    """Parses ``kill`` and fires at the chosen point.

    Points (``n`` counts from 1):

    * JSONL: ``{"at": "fsync", "n": n, "phase": "before"|"after"}`` -- the n-th
      ``os.fsync`` of the process (files and directories; the first few are the
      log's publication);
    * JSONL: ``{"at": "link", "n": n, "phase": ...}`` -- the n-th ``os.link``
      (publication);
    * PostgreSQL: ``{"at": "insert", "n": n, "phase": p}`` -- the n-th events
      ``INSERT`` of the process (the first one is the publication, which
      inserts the header too), at one of :data:`INSERT_PHASES`;
    * ``{"at": "barrier", "barrier": "pre-step"|"llm"|"tool", "n": n,
      "phase": ...}`` -- the n-th checkpoint of that barrier: ``before-flush``
      as it starts (its events are only in memory), ``after-flush`` once the
      flush returned (before the policy lets the step, request or body
      proceed), or inside the flush at its first write: ``before-fsync`` (the
      batch is already written: a process kill, unlike a power cut, keeps
      written bytes in the page cache) and ``after-fsync`` for JSONL, one of
      :data:`INSERT_PHASES` for PostgreSQL;
    * ``{"at": "tool-body", "n": n}`` -- inside the n-th tool body, as soon as
      its call id is in the ledger (the command is still running);
    * ``{"at": "after-body", "n": n}`` -- the n-th body returned, no result yet;
    * ``{"at": "after-result", "n": n}`` -- right after the n-th ``tool/result``
      was appended (buffered, before the next checkpoint);
    * ``{"at": "window", "event": type, "n": n, "delay": seconds}`` --
      ``delay`` after the n-th event of ``type`` was appended, i.e. inside the
      backend's 200 ms batching window when ``delay < 0.2``.
    """

    def __init__(self, spec: dict[str, Any] | None) -> None:
        self.spec = spec or {}
        self.at = self.spec.get("at")
        self.fsyncs = 0
        self.links = 0
        self.inserts = 0
        self.lock = threading.Lock()
        #: the phase armed by a barrier checkpoint in progress ("before-fsync" / "after-fsync")
        self.armed: str | None = None
        self.fired = False
        self.barriers: Counter[str] = Counter()
        self.tools = 0
        self.results = 0
        self.events: Counter[str] = Counter()

    def matches(self, at: str, n: int) -> bool:
        return self.at == at and self.spec.get("n") == n

    # -- os wrappers (may run on worker threads)

    def wrap_os(self) -> None:
        real_fsync, real_link = os.fsync, os.link

        def fsync(fd: Any) -> None:
            with self.lock:
                self.fsyncs += 1
                number = self.fsyncs
                armed = self.armed
            phase = self.spec.get("phase")
            if self.matches("fsync", number) and phase == "before":
                die(f"fsync {number} before")
            if armed == "before-fsync":
                die(f"{self.describe()} (fsync {number})")
            real_fsync(fd)
            if self.matches("fsync", number) and phase == "after":
                die(f"fsync {number} after")
            if armed == "after-fsync":
                die(f"{self.describe()} (fsync {number})")

        def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            with self.lock:
                self.links += 1
                number = self.links
            phase = self.spec.get("phase")
            if self.matches("link", number) and phase == "before":
                die(f"link {number} before")
            real_link(src, dst, *args, **kwargs)
            if self.matches("link", number) and phase == "after":
                die(f"link {number} after")

        os.fsync = fsync
        os.link = link

    # -- the events INSERT (PostgreSQL; may run on worker threads)

    def wrap_pg(self, dsn: str, schema: str) -> None:
        real_execute = psycopg.Connection.execute

        def execute(conn: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            if not _is_events_insert(conn, query):
                return real_execute(conn, query, params, **kwargs)
            with self.lock:
                self.inserts += 1
                number = self.inserts
                armed = self.armed
            if self.matches("insert", number):
                phase: str | None = self.spec.get("phase")
                label = f"insert {number} {phase}"
            else:
                phase = armed
                label = f"{self.describe()} (insert {number})"
            if phase == "before-insert":
                die(label)
            elif phase == "uncommitted":
                real_execute(conn, "BEGIN")
                real_execute(conn, query, params, **kwargs)
                die(label)
            elif phase == "in-flight":
                _die_while_waiting(conn, dsn, schema, label)
            result = real_execute(conn, query, params, **kwargs)
            if phase == "after-commit":
                die(label)
            return result

        psycopg.Connection.execute = execute  # type: ignore[method-assign, assignment]

    def describe(self) -> str:
        spec = self.spec
        return f"barrier {spec.get('barrier')} {spec.get('n')} {spec.get('phase')}"

    # -- the store's flush (the policy calls ctx.sessions.flush for every barrier)

    def wrap_flush(self, store: Any) -> None:
        real_flush = store.flush

        async def flush(session: Any) -> bool:
            barrier = _barrier_of(sys._getframe(1))
            self.barriers[barrier] += 1
            number = self.barriers[barrier]
            events = session.events
            last = events[-1] if events else None
            chosen = (
                self.at == "barrier"
                and self.spec.get("barrier") == barrier
                and self.spec.get("n") == number
            )
            phase = self.spec.get("phase") if chosen else None
            if phase == "before-flush":
                die(self.describe())
            if phase in ARMED_PHASES:
                self.armed = phase
            try:
                result: bool = await real_flush(session)
            finally:
                self.armed = None
            if phase in ARMED_PHASES:
                # Nothing was left to write (the 200 ms window wrote it first):
                # the state is the same as just after the barrier's fsync / commit.
                die(f"{self.describe()} (nothing left to write)")
            if phase == "after-flush":
                die(self.describe())
            if last is not None:
                if RECORDER is not None:
                    RECORDER.flushed(last.seq)
                say(f"flushed {last.seq} {last.type} {barrier}")
            return result

        store.flush = flush

    # -- host listeners

    def install_listeners(self, ctx: Any) -> None:
        async def inner_execute(exec_: Any, next_: Any) -> Any:
            self.tools += 1
            number = self.tools
            if self.matches("tool-body", number):
                _watch_ledger(exec_.call_id, f"tool-body {number} ({exec_.call_id})")
            result = await next_()
            if self.matches("tool-body", number):
                # The watcher thread was starved past the command's end: the body has
                # returned but no result exists yet -- the same state, one moment later.
                die(f"tool-body {number} ({exec_.call_id}, at its return)")
            if self.matches("after-body", number):
                die(f"after-body {number} ({exec_.call_id})")
            return result

        def on_event(session: Any, event: Any) -> None:
            self.events[event.type] += 1
            if event.type == "tool/result":
                self.results += 1
                if self.matches("after-result", self.results):
                    die(f"after-result {self.results}")
            if (
                self.at == "window"
                and self.spec.get("event") == event.type
                and self.spec.get("n") == self.events[event.type]
            ):
                delay = float(self.spec.get("delay", 0.1))
                label = f"window {event.type} {self.spec.get('n')} +{delay:.3f}s"
                timer = threading.Timer(delay, die, args=(label,))
                timer.daemon = True
                timer.start()

        # Root-context listeners are registered last: innermost in tools/execute
        # (inside the policy's checkpoint), after the backend on session/event.
        ctx.on("tools/execute", inner_execute)
        ctx.on("session/event", on_event)


def _barrier_of(frame: Any) -> str:
    """Which barrier called ``flush``: the policy's listener is the awaiting frame."""
    names = {"before_step": "pre-step", "_flush_then_relay": "llm", "around_execute": "tool"}
    while frame is not None:
        name = names.get(frame.f_code.co_name)
        if name is not None and "checkpoint_policy" in frame.f_code.co_filename:
            return name
        frame = frame.f_back
    return "other"


def _is_events_insert(conn: Any, query: Any) -> bool:
    """Whether ``query`` stores events: the plain INSERT or the publishing CTE."""
    if isinstance(query, sql.Composable):
        text = query.as_string(conn)
    elif isinstance(query, bytes):
        text = query.decode()
    else:
        text = str(query)
    head = text.lstrip().upper()
    return head.startswith(("INSERT", "WITH")) and ".events " in text and "INSERT INTO" in head


#: connections that must live until the process dies
_KEEP: list[Any] = []


def _die_while_waiting(writer: Any, dsn: str, schema: str, label: str) -> None:
    """Make the coming INSERT wait on the server, and SIGKILL us once it does.

    A connection of ours takes ``SHARE`` on the events table (which every
    INSERT's ``ROW EXCLUSIVE`` waits for, from the statement's parse on); a
    thread watches, on a third connection, until the server lists that
    connection among the writer's blockers, then kills the process. Both
    connections die with us, the lock goes, and the server finishes what the
    writer had sent for nobody (see :data:`INSERT_PHASES`).
    """
    writer_pid = writer.info.backend_pid
    blocker = psycopg.connect(dsn, autocommit=True)
    blocker.execute("BEGIN")
    blocker.execute(sql.SQL("LOCK TABLE {}.events IN SHARE MODE").format(sql.Identifier(schema)))
    blocker_pid = blocker.info.backend_pid
    _KEEP.append(blocker)  # a collected connection closes, and its lock would go with it

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as probe:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = probe.execute(
                    "SELECT %s = ANY(pg_blocking_pids(%s))", (blocker_pid, writer_pid)
                ).fetchone()
                if row is not None and row[0]:
                    die(f"{label} (the server holds the request)")
                time.sleep(0.001)
        die(f"{label} (never saw the request wait)")

    threading.Thread(target=watch, daemon=True).start()


def _watch_ledger(call_id: str, label: str) -> None:
    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(LEDGER) as ledger:
                    if call_id in ledger.read().split():
                        die(label)
            except FileNotFoundError:
                pass
            time.sleep(0.0005)

    threading.Thread(target=watch, daemon=True).start()


async def main() -> None:
    global RECORDER
    killer = Killer(SPEC.get("kill"))
    if PERSISTENCE["name"] == "session-persistence-jsonl":
        if SPEC.get("record"):
            root = PERSISTENCE["config"]["root"]
            os.makedirs(root, exist_ok=True)
            RECORDER = Recorder(SPEC["record"], root)
            RECORDER.install()  # innermost: the killer's wrappers call through it
        killer.wrap_os()
    elif PERSISTENCE["name"] == "session-persistence-postgres":
        config = PERSISTENCE["config"]
        killer.wrap_pg(config["dsn"], config["schema"])
    async with open_host(rows()) as host:
        ctx = host.ctx
        killer.wrap_flush(ctx.sessions)
        killer.install_listeners(ctx)
        agent = ctx.agent.create(session_id=SPEC["session"], cwd=SPEC["workspace"])
        backend = ctx.sandbox.probe().backend if SPEC["sandbox"] != "danger-full-access" else None
        say(f"sandbox {SPEC['sandbox']} {backend}")
        say("ready")
        first = await agent.run_turn("Record two calls, then a third.")
        say(f"turn 1 {msgspec.to_builtins(first)['kind']}")
        await anyio.sleep(SPEC.get("idle", 0.3))
        second = await agent.run_turn("Record one more call.")
        say(f"turn 2 {msgspec.to_builtins(second)['kind']}")
        await agent.aclose()
    say("done")


if __name__ == "__main__":
    anyio.run(main, backend=SPEC.get("backend", "trio"))
