"""Approvals that wait, end to end (D19): real ``dsh`` processes on JSONL and PostgreSQL.

``dsh run --approval defer`` asks for a side-effecting ``bash`` call (it appends
``$DSH_CALL_ID`` to a ledger file) that a ``tool-rules`` row sends to approval; nobody can
answer, so the run prints the pending call and exits 4. A second process lists it and decides
it with ``dsh approvals decide``; the ledger then holds exactly one line after allow and none
after deny. Tampered or changed calls and second decisions are refused (exit 2), a session held
by another process is exit 3, and every verdict is judged from the stored log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from postgres.conftest import DSN, _probe, drop_schemas

REPO = Path(__file__).resolve().parents[2]
DSH = [sys.executable, "-m", "dsh_host"]
CALL = "call-ledger"
RULES = (
    "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
    "      - {tool: bash, decision: ask, reason: side effects need a human}\n"
)


@dataclass
class Env:
    """One composition (JSONL or PostgreSQL) with the ask rule, a workspace and two scripts."""

    tmp: Path
    config: Path
    root: Path
    workspace: Path
    env: dict[str, str]
    first: Path
    second: Path

    @property
    def ledger(self) -> Path:
        return self.workspace / "ledger"

    def dsh(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DSH, *args, "--config", str(self.config), *self.root_flag()],
            cwd=self.tmp, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def root_flag(self) -> list[str]:
        return ["--root", str(self.root)] if "DSH_POSTGRES_DSN" not in self.env else []

    def run_deferred(self) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        proc = self.dsh(
            "run", "--workspace", str(self.workspace), "--model", f"scripted:{self.first}",
            "--approval", "defer", "--json", "append to the ledger",
        )
        assert proc.returncode == 4, proc.stdout + proc.stderr
        return proc, json.loads(proc.stdout.strip().splitlines()[-1])

    def events(self, session_id: str) -> list[dict[str, Any]]:
        proc = self.dsh("sessions", "show", session_id, "--view", "events", "--json")
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]

    def ledger_lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []


def script(path: Path, responses: list[Any]) -> Path:
    path.write_text(json.dumps({"responses": responses}))
    return path


def make_env(tmp: Path, base: str, env: dict[str, str]) -> Env:
    workspace = tmp / "ws"
    workspace.mkdir()
    config = tmp / "dsh.yml"
    config.write_text((REPO / "configs" / base).read_text() + RULES)
    command = 'printf "%s\\n" "$DSH_CALL_ID" >> ledger'
    first = script(tmp / "first.json", [
        {"tool_calls": [{"id": CALL, "name": "bash",
                         "arguments": {"command": command, "description": "Append to ledger"}}]},
        {"text": "never reached by the first process"},
    ])
    second = script(tmp / "second.json", [{"text": "The ledger was updated."}])
    return Env(tmp, config, tmp / "sessions", workspace, env, first, second)


@pytest.fixture(params=["jsonl", "postgres"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "jsonl":
        yield make_env(tmp_path, "default.yml", {})
        return
    problem = _probe()
    if problem is not None:
        pytest.skip(f"no PostgreSQL server answers at {DSN!r} ({problem})")
    prefix = f"dsh_t{uuid.uuid4().hex[:12]}"
    try:
        yield make_env(
            tmp_path, "postgres.yml",
            {"DSH_POSTGRES_DSN": DSN, "DSH_POSTGRES_SCHEMA": f"{prefix}_main"},
        )
    finally:
        drop_schemas(DSN, prefix)


def test_defer_exit_4_then_allow_from_another_process_runs_it_exactly_once(setup: Env) -> None:
    proc, summary = setup.run_deferred()
    session_id = summary["sessionId"]
    assert summary["turnEnd"] == {"kind": "awaiting-approval"}
    (pending,) = summary["pendingApprovals"]
    assert (pending["sessionId"], pending["callId"], pending["tool"]) == (session_id, CALL, "bash")
    assert setup.ledger_lines() == []  # nothing ran
    events = setup.events(session_id)
    end = events[-1]
    assert end["type"] == "turn/end"
    assert end["data"]["reason"] == {"kind": "awaiting-approval", "callIds": [CALL]}
    kinds = [e["type"] for e in events]
    assert "approval/decided" not in kinds and "tool/result" not in kinds

    listing = setup.dsh("approvals", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = [json.loads(line) for line in listing.stdout.splitlines() if line.strip()]
    assert [(r["sessionId"], r["callId"]) for r in rows] == [(session_id, CALL)]
    row = rows[0]
    assert set(row) == {"sessionId", "callId", "tool", "argsDigest", "arguments", "askedAt"}
    assert "$DSH_CALL_ID" in row["arguments"]

    decide = setup.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--reason", "reviewed",
        "--args-digest", row["argsDigest"], "--model", f"scripted:{setup.second}", "--json",
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    result = json.loads(decide.stdout.strip().splitlines()[-1])
    assert result["turnEnd"] == {"kind": "completed"}
    assert setup.ledger_lines() == [CALL]  # exactly once

    events = setup.events(session_id)
    decided = [e for e in events if e["type"] == "approval/decided"]
    assert len(decided) == 1
    data = decided[0]["data"]
    assert data["outcome"] == "allowed-once" and data["callId"] == CALL
    assert data["argsDigest"] == row["argsDigest"] and data["reason"] == "reviewed"
    assert data["decidedBy"].startswith("dsh approvals decide by ")
    results = [e for e in events if e["type"] == "tool/result"]
    assert len(results) == 1 and results[0]["data"]["message"]["source"]["callId"] == CALL
    assert events[-1]["data"]["reason"] == {"kind": "completed"}
    assert setup.dsh("approvals", "list", "--json").stdout.strip() == ""

    # One-shot: the call is no longer pending; a second decision is refused and runs nothing.
    again = setup.dsh("approvals", "decide", session_id, CALL, "allow", "--no-continue")
    assert again.returncode == 2, again.stderr
    assert "not awaiting approval" in again.stderr and "Traceback" not in again.stderr
    assert setup.ledger_lines() == [CALL]


def test_deny_never_runs_and_the_model_gets_the_rejection(setup: Env) -> None:
    _, summary = setup.run_deferred()
    session_id = summary["sessionId"]
    decide = setup.dsh(
        "approvals", "decide", session_id, CALL, "deny", "--model", f"scripted:{setup.second}",
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    assert setup.ledger_lines() == []
    events = setup.events(session_id)
    (result,) = [e for e in events if e["type"] == "tool/result"]
    block = result["data"]["message"]["content"][0]
    assert block["content"] == [{"type": "text", "text": 'Error: the user rejected tool "bash"'}]
    assert events[-1]["data"]["reason"] == {"kind": "completed"}


def test_no_continue_records_then_a_second_decision_is_refused(setup: Env) -> None:
    _, summary = setup.run_deferred()
    session_id = summary["sessionId"]
    first = setup.dsh("approvals", "decide", session_id, CALL, "deny", "--no-continue", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["turnEnd"] is None
    second = setup.dsh("approvals", "decide", session_id, CALL, "allow", "--no-continue")
    assert second.returncode == 2
    assert "already decided" in second.stderr
    unknown = setup.dsh("approvals", "decide", session_id, "call-nope", "allow")
    assert unknown.returncode == 2 and "not awaiting approval" in unknown.stderr
    missing = setup.dsh("approvals", "decide", "no-such-session", CALL, "allow")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    events = setup.events(session_id)
    assert sum(e["type"] == "approval/decided" for e in events) == 1
    assert setup.ledger_lines() == []


def test_a_changed_call_is_refused(setup: Env) -> None:
    _, summary = setup.run_deferred()
    session_id = summary["sessionId"]
    wrong = setup.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--args-digest", "0" * 64,
        "--model", f"scripted:{setup.second}",
    )
    assert wrong.returncode == 2
    assert "argsDigest" in wrong.stderr
    assert setup.ledger_lines() == []
    assert not any(e["type"] == "approval/decided" for e in setup.events(session_id))


def test_human_output_prints_each_pending_call_escaped(tmp_path: Path) -> None:
    env = make_env(tmp_path, "default.yml", {})
    evil = 'printf "%s\\n" "$DSH_CALL_ID" >> ledger # \x1b[2J\u202e'
    script(env.first, [
        {"tool_calls": [{"id": CALL, "name": "bash",
                         "arguments": {"command": evil, "description": "x"}}]},
    ])
    proc = env.dsh(
        "run", "--workspace", str(env.workspace), "--model", f"scripted:{env.first}",
        "--approval", "defer", "go",
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("awaiting approval:"))
    line, arguments = lines[at], lines[at + 1]
    assert f"call {CALL}" in line and "tool bash" in line and "session " in line
    # The arguments exactly as logged (the JSON escape of ESC stays text), with the raw
    # right-to-left override from the model made inert.
    assert arguments.startswith("  arguments: {") and "$DSH_CALL_ID" in arguments
    assert "\u202e" not in arguments and "\\u202e" in arguments
    assert "\x1b" not in "".join(lines[at : at + 3])
