"""Call identity is the harness's: real ``dsh`` processes fed repeated and empty provider ids.

A scripted model (and, in ``tests/cli/test_call_identity_http.py``, a loopback
OpenAI-compatible server) gives two calls of one step the same id, reuses an id across steps
and turns, or sends none. Through ``dsh run``, ``--approval defer`` + ``dsh approvals decide``
from other processes, and a SIGKILL + ``dsh resume``, judged from the stored log and from a
ledger the calls append to: every call runs at most once per decision, every call id has
exactly one ``tool/result``, ids are unique and non-empty, the provider's id is kept as
``providerId``, and ``$DSH_IDEMPOTENCY_KEY`` differs for every call and is the same across the
crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .deferred_env import DSH, Env, make_env, script

# slow: several real dsh processes per test
pytestmark = pytest.mark.slow


def append(label: str, then: str = "") -> dict[str, Any]:
    """A bash call (provider id ``call_0``) appending its label, call id and idempotency key."""
    command = f'printf "%s %s %s\\n" {label} "$DSH_CALL_ID" "$DSH_IDEMPOTENCY_KEY" >> ledger'
    return {"id": "call_0", "name": "bash",
            "arguments": {"command": command + then, "description": f"Append {label}"}}


def ledger(env: Env) -> list[list[str]]:
    return [line.split() for line in env.ledger_lines()]


def key_of(session_id: str, call_id: str) -> str:
    """The documented derivation: a digest of the durable session id and call id."""
    scope = f"{len(session_id)}:{session_id}:{call_id}"
    return "dsh-" + hashlib.sha256(scope.encode()).hexdigest()[:32]


def check_identity(events: list[dict[str, Any]]) -> list[str]:
    """Every model call: a unique non-empty id with exactly one result; returns the ids."""
    calls = [
        block
        for event in events
        if event["type"] == "assistant/message"
        for block in event["data"]["message"]["content"]
        if block["type"] == "tool-call"
    ]
    ids = [block["id"] for block in calls]
    assert all(ids) and len(set(ids)) == len(ids), ids
    results = Counter(
        e["data"]["message"]["source"]["callId"] for e in events if e["type"] == "tool/result"
    )
    assert results == Counter(ids), (results, ids)
    called = {e["data"]["callId"] for e in events if e["type"] == "tool/call"}
    assert called <= set(ids)
    # The provider's id is kept beside a minted one; a kept id carries no providerId.
    assert [block.get("providerId", block["id"]) for block in calls] == ["call_0"] * len(calls)
    return ids


def no_ask(tmp: Path) -> Env:
    """A composition without the ask rule (bash runs at once)."""
    env = make_env(tmp, "default.yml", {})
    env.config.write_text(env.config.read_text().split("\n- id: rules")[0] + "\n")
    return env


def test_repeated_ids_within_a_step_across_steps_and_turns_run_each_call_once(
    tmp_path: Path,
) -> None:
    env = no_ask(tmp_path)
    first = script(tmp_path / "one.json", [
        {"tool_calls": [append("A"), append("B")]},
        {"tool_calls": [append("C")]},
        {"text": "done"},
    ])
    run = env.dsh("run", "--workspace", str(env.workspace), "--model", f"scripted:{first}",
                  "--json", "go")
    assert run.returncode == 0, run.stdout + run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]
    second = script(tmp_path / "two.json", [{"tool_calls": [append("D")]}, {"text": "done"}])
    again = env.dsh("run", "--session", session_id, "--model", f"scripted:{second}", "--json",
                    "again")
    assert again.returncode == 0, again.stdout + again.stderr

    events = env.events(session_id)
    ids = check_identity(events)
    assert ids[0] == "call_0" and len(ids) == 4  # the first use of an id keeps it
    rows = ledger(env)
    assert [row[0] for row in rows] == ["A", "B", "C", "D"]  # each ran once, in order
    assert [row[1] for row in rows] == ids  # $DSH_CALL_ID is the logged, unique id
    keys = [row[2] for row in rows]
    assert keys == [key_of(session_id, call_id) for call_id in ids]
    assert len(set(keys)) == 4
    verify = env.dsh("sessions", "verify", session_id)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_deferred_calls_with_one_provider_id_are_decided_and_run_separately(
    deferred: Env,
) -> None:
    """On JSONL and on PostgreSQL (the ``deferred`` fixture)."""
    env, tmp_path = deferred, deferred.tmp
    first = script(tmp_path / "defer.json", [{"tool_calls": [append("A"), append("B")]}])
    proc = env.dsh("run", "--workspace", str(env.workspace), "--model", f"scripted:{first}",
                   "--approval", "defer", "--json", "append twice")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    session_id = summary["sessionId"]
    pending = [p["callId"] for p in summary["pendingApprovals"]]
    assert len(pending) == 2 and len(set(pending)) == 2 and pending[0] == "call_0"
    assert ledger(env) == []

    # Each decision from its own process: the first is recorded, the second continues.
    one = env.dsh("approvals", "decide", session_id, pending[0], "allow", "--no-continue")
    assert one.returncode == 0, one.stdout + one.stderr
    done = script(tmp_path / "done.json", [{"text": "both appended"}])
    two = env.dsh("approvals", "decide", session_id, pending[1], "allow", "--model",
                  f"scripted:{done}", "--json")
    assert two.returncode == 0, two.stdout + two.stderr

    rows = ledger(env)
    assert sorted(row[0] for row in rows) == ["A", "B"]  # each ran exactly once
    assert {row[1] for row in rows} == set(pending)
    assert len({row[2] for row in rows}) == 2
    assert all(row[2] == key_of(session_id, row[1]) for row in rows)
    check_identity(env.events(session_id))
    verify = env.dsh("sessions", "verify", session_id)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_sigkill_between_two_calls_with_one_id_is_repaired_per_call(tmp_path: Path) -> None:
    env = no_ask(tmp_path)
    started = env.workspace / "started"
    first = script(tmp_path / "crash.json", [
        {"tool_calls": [append("A"), append("B", "; touch started; sleep 120")]},
        {"text": "never reached"},
    ])
    child = subprocess.Popen(
        [*DSH, "run", "--workspace", str(env.workspace), "--model", f"scripted:{first}",
         "--json", "go", "--config", str(env.config), *env.root_flag()],
        cwd=env.cwd, env={**os.environ, **env.env}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the second call never started"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    listing = env.dsh("sessions", "list", "--json")
    [session_id] = [json.loads(line)["sessionId"] for line in listing.stdout.splitlines() if line]
    keys_before = {row[1]: row[2] for row in ledger(env)}

    resumed = env.dsh("resume", session_id, "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    closers = json.loads(resumed.stdout.splitlines()[-1])["closers"]
    unknown = [c["callId"] for c in closers if c.get("code") == "TOOL_OUTCOME_UNKNOWN"]
    events = env.events(session_id)
    ids = check_identity(events)
    assert unknown == [ids[1]]  # the call that was running, by its own id
    assert [row[0] for row in ledger(env)] == ["A", "B"]
    # The key a retry would use is the one the crashed process handed out.
    assert keys_before == {call_id: key_of(session_id, call_id) for call_id in ids}
    verify = env.dsh("sessions", "verify", session_id)
    assert verify.returncode == 0, verify.stdout + verify.stderr
