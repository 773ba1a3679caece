"""``dsh sessions verify``, ``dsh sessions show`` (the transcript, ``--view model``,
``--view events``), ``dsh sessions export --attest`` and the server's session summary read a log
page by page, and ``dsh audit verify`` reads an export line by line: their peak memory does not grow with the log (JSONL
and SQLite, D33).

Real ``dsh`` processes on real logs of 10k and 100k events; each one's peak resident set
is the kernel's (``ru_maxrss`` of ``wait4`` for that child). A reader that materializes the log
holds every decoded event (a few KB each: ~+250 MB between the two sizes); one that walks it in
pages holds a page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_sqlite import SqliteSessionPersistence

pytestmark = pytest.mark.slow

#: 6 events per turn: 10k and 100k events.
SIZES = {"small": 1667, "large": 16_667}
PER_TURN = 6
T0 = 1_789_200_000_000


def turn_events(seq: int, turn: int) -> list[dict[str, Any]]:
    """One answered turn in wire form: turn/start, user, step/start, assistant, step/end,
    turn/end."""

    def ev(kind: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
        event = {"type": kind, "seq": seq + len(out), "time": T0 + seq + len(out), "data": data}
        return {**event, **extra}

    out: list[dict[str, Any]] = []
    out.append(ev("turn/start", {"turn": turn}))
    out.append(ev("user/message", {"id": f"user-{turn}", "role": "user", "source": {"kind": "user"},
                                   "content": [{"type": "text", "text": f"question {turn}"}]},
                  surfaceOp="append"))
    out.append(ev("step/start", {"turn": turn, "step": 1}))
    message = {"id": f"assistant-{turn}", "role": "assistant",
               "content": [{"type": "text", "text": f"answer {turn}"}],
               "source": {"kind": "model", "provider": "mock", "model": "mock"}}
    out.append(ev("assistant/message", {"turn": turn, "step": 1, "message": message,
                                        "usage": {"inputTokens": 100, "outputTokens": 7}},
                  surfaceOp="append"))
    out.append(ev("step/end", {"turn": turn, "step": 1}))
    out.append(ev("turn/end", {"turn": turn, "reason": {"kind": "completed"}}))
    return out


#: A composition whose store is SQLite, the database in ``--root``.
SQLITE_CONFIG = "- name: sessions\n- name: session-persistence-sqlite\n"


async def write_session(root: Path, session_id: str, turns: int, kind: str = "jsonl") -> None:
    events = [e for n in range(turns) for e in turn_events(n * PER_TURN, n + 1)]
    async with anyio.create_task_group() as group:
        store: JsonlSessionPersistence | SqliteSessionPersistence
        if kind == "sqlite":
            store = SqliteSessionPersistence(str(root / "sessions.sqlite3"), spawn=group.start_soon)
        else:
            store = JsonlSessionPersistence(str(root), "zstd", spawn=group.start_soon)
        handle = await store.create(
            {"version": 3, "id": session_id, "createdAt": T0, "cwd": "/home/dev/project"}
        )
        for start in range(0, len(events), 5000):
            handle.append(events[start : start + 5000])
            await handle.flush()
        await handle.close()
        await store.aclose()
        group.cancel_scope.cancel()


#: ``dsh`` with its own peak resident set (``VmHWM``: the high-water mark of this process's
#: memory since its exec; ``wait4``'s ``ru_maxrss`` would also count the forking test's) written
#: to the file named by argv[1] when it exits; ``-c CODE ARGS`` runs CODE instead of ``dsh``.
MEASURED = (
    "import atexit, sys\n"
    "def report(path=sys.argv.pop(1)):\n"
    "    with open('/proc/self/status') as status, open(path, 'w') as out:\n"
    "        out.write(next(l for l in status if l.startswith('VmHWM:')).split()[1])\n"
    "atexit.register(report)\n"
    "if sys.argv[1] == '-c':\n"
    "    code = sys.argv.pop(2)\n"
    "    del sys.argv[1]\n"
    "    exec(compile(code, '<child>', 'exec'), {'__name__': '__main__'})\n"
    "    sys.exit(0)\n"
    "from dsh_host._cli import main\n"
    "sys.exit(main())\n"
)

#: What ``dsh serve`` reads for ``GET /sessions/{id}`` and the inspector's session page: the
#: stored summary of a session the runtime has not read yet (argv: root, session id, workspace,
#: the ``--model`` the default composition runs, unused).
SERVER_SUMMARY = """
import sys, anyio
from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions, open_runtime
async def main():
    compositions = build_compositions(None, [], sys.argv[4], sys.argv[1])
    options = ServeOptions(compositions=compositions, default_workspace=sys.argv[3])
    async with open_runtime(options) as runtime:
        print((await runtime.stored_summary(sys.argv[2])).fields["events"])
anyio.run(main, backend="trio")
"""


def peak_rss(args: list[str], cwd: Path) -> tuple[int, bytes]:
    """Run ``dsh ARGS``; its exit status must be 0. Returns (its peak RSS in bytes, stdout)."""
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    hwm = cwd / "hwm"
    with open(cwd / "out", "wb") as out:
        proc = subprocess.run([sys.executable, "-c", MEASURED, str(hwm), *args], cwd=cwd,
                              env=env, stdout=out, stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return int(hwm.read_text()) * 1024, (cwd / "out").read_bytes()


def test_verify_and_show_of_a_100k_event_log_in_bounded_memory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for name, turns in SIZES.items():
        anyio.run(write_session, root, name, turns)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "unused"}]}))
    model = f"scripted:{script}"
    workspace = tmp_path / "ws"  # not holding the session root
    workspace.mkdir()
    peaks: dict[str, dict[str, int]] = {
        name: {}
        for name in ("verify", "show", "transcript", "model", "export", "audit verify",
                     "server summary")
    }
    for name, turns in SIZES.items():
        rss, out = peak_rss(["sessions", "verify", name, "--root", str(root), "--json"], tmp_path)
        report = json.loads(out)
        assert report["events"] == turns * PER_TURN and report["closers"] == [], report
        assert report["callProblems"] == [] and report["corrupt"] is None, report
        peaks["verify"][name] = rss
        rss, out = peak_rss(
            ["sessions", "show", name, "--view", "events", "--json", "--root", str(root)], tmp_path
        )
        lines = out.splitlines()
        assert len(lines) == turns * PER_TURN
        assert json.loads(lines[-1])["seq"] == turns * PER_TURN - 1
        peaks["show"][name] = rss
        rss, out = peak_rss(["sessions", "show", name, "--root", str(root)], tmp_path)
        assert f"answer {turns}" in out.decode() and "usage: " in out.decode()
        peaks["transcript"][name] = rss
        rss, out = peak_rss(
            ["sessions", "show", name, "--view", "model", "--json", "--root", str(root)], tmp_path
        )
        lines = out.splitlines()
        assert len(lines) == 2 * turns  # the prompt and the answer of each turn
        assert json.loads(lines[-1])["content"][0]["text"] == f"answer {turns}"
        peaks["model"][name] = rss
        export = tmp_path / f"{name}.attested.jsonl"
        rss, _ = peak_rss(["sessions", "export", name, "--attest", "--output", str(export),
                           "--root", str(root)], tmp_path)
        peaks["export"][name] = rss
        rss, out = peak_rss(["audit", "verify", str(export), "--json"], tmp_path)
        report = json.loads(out)
        assert report["ok"] and report["events"] == turns * PER_TURN, report
        peaks["audit verify"][name] = rss
        rss, out = peak_rss(["-c", SERVER_SUMMARY, str(root), name, str(workspace), model], tmp_path)
        assert int(out) == turns * PER_TURN
        peaks["server summary"][name] = rss
    print(f"peak RSS in bytes (10k / 100k events): {peaks}")
    for command, peak in peaks.items():
        # 90,000 more events: a generous bound, a fraction of what holding them costs. The
        # transcript, the model's view and the server's summary keep folds that grow with the
        # log (the token meter's surface nodes, every billed call, the turns seen, the
        # surface's node seqs): measured +14, +17 and +10 MB, against +47, +54 and +59 MB when
        # they held the log (export and audit verify: +1 and +0.1 MB, against +265 and +285).
        grows = ("transcript", "model", "server summary")
        bound = 30_000_000 if command in grows else 40_000_000
        assert peak["large"] - peak["small"] < bound, (command, peak)


def test_verify_of_a_100k_event_sqlite_log_in_bounded_memory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    config = tmp_path / "sqlite.yml"
    config.write_text(SQLITE_CONFIG)
    for name, turns in SIZES.items():
        anyio.run(write_session, root, name, turns, "sqlite")
    peaks: dict[str, int] = {}
    for name, turns in SIZES.items():
        rss, out = peak_rss(["sessions", "verify", name, "--config", str(config), "--root",
                             str(root), "--json"], tmp_path)
        report = json.loads(out)
        assert report["events"] == turns * PER_TURN and report["closers"] == [], report
        assert report["callProblems"] == [] and report["corrupt"] is None, report
        peaks[name] = rss
    print(f"peak RSS in bytes (10k / 100k events): {peaks}")
    assert peaks["large"] - peaks["small"] < 40_000_000, peaks
