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
from pathlib import Path

import pytest

from .deferred_env import CALL, Env, make_env, script

# slow: several real dsh processes per test
pytestmark = pytest.mark.slow


def test_defer_exit_4_then_allow_from_another_process_runs_it_exactly_once(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session_id = summary["sessionId"]
    assert summary["turnEnd"] == {"kind": "awaiting-approval"}
    (pending,) = summary["pendingApprovals"]
    assert (pending["sessionId"], pending["callId"], pending["tool"]) == (session_id, CALL, "bash")
    assert deferred.ledger_lines() == []  # nothing ran
    events = deferred.events(session_id)
    end = events[-1]
    assert end["type"] == "turn/end"
    assert end["data"]["reason"] == {"kind": "awaiting-approval", "callIds": [CALL]}
    kinds = [e["type"] for e in events]
    assert "approval/decided" not in kinds and "tool/result" not in kinds

    listing = deferred.dsh("approvals", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = [json.loads(line) for line in listing.stdout.splitlines() if line.strip()]
    assert [(r["sessionId"], r["callId"]) for r in rows] == [(session_id, CALL)]
    row = rows[0]
    assert set(row) == {"sessionId", "callId", "tool", "argsDigest", "arguments", "askedAt",
                        "turn", "sandboxMode", "network"}
    assert (row["sandboxMode"], row["network"]) == ("workspace-write", "deny")
    assert "$DSH_CALL_ID" in row["arguments"]

    decide = deferred.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--reason", "reviewed",
        "--args-digest", row["argsDigest"], "--model", f"scripted:{deferred.second}", "--json",
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    result = json.loads(decide.stdout.strip().splitlines()[-1])
    assert result["turnEnd"] == {"kind": "completed"}
    assert deferred.ledger_lines() == [CALL]  # exactly once

    events = deferred.events(session_id)
    decided = [e for e in events if e["type"] == "approval/decided"]
    assert len(decided) == 1
    data = decided[0]["data"]
    assert data["outcome"] == "allowed-once" and data["callId"] == CALL
    assert data["argsDigest"] == row["argsDigest"] and data["reason"] == "reviewed"
    assert data["decidedBy"].startswith("dsh approvals decide by ")
    results = [e for e in events if e["type"] == "tool/result"]
    assert len(results) == 1 and results[0]["data"]["message"]["source"]["callId"] == CALL
    assert events[-1]["data"]["reason"] == {"kind": "completed"}
    assert deferred.dsh("approvals", "list", "--json").stdout.strip() == ""

    # One-shot: the call is no longer pending; a second decision is refused and runs nothing.
    again = deferred.dsh("approvals", "decide", session_id, CALL, "allow", "--no-continue")
    assert again.returncode == 2, again.stderr
    assert "not awaiting approval" in again.stderr and "Traceback" not in again.stderr
    assert deferred.ledger_lines() == [CALL]


def test_deny_never_runs_and_the_model_gets_the_rejection(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session_id = summary["sessionId"]
    decide = deferred.dsh(
        "approvals", "decide", session_id, CALL, "deny", "--model", f"scripted:{deferred.second}",
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    assert deferred.ledger_lines() == []
    events = deferred.events(session_id)
    (result,) = [e for e in events if e["type"] == "tool/result"]
    block = result["data"]["message"]["content"][0]
    assert block["content"] == [{"type": "text", "text": 'Error: the user rejected tool "bash"'}]
    assert events[-1]["data"]["reason"] == {"kind": "completed"}


def test_no_continue_records_then_a_second_decision_is_refused(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session_id = summary["sessionId"]
    first = deferred.dsh("approvals", "decide", session_id, CALL, "deny", "--no-continue", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["turnEnd"] is None
    second = deferred.dsh("approvals", "decide", session_id, CALL, "allow", "--no-continue")
    assert second.returncode == 2
    assert "already decided" in second.stderr
    unknown = deferred.dsh("approvals", "decide", session_id, "call-nope", "allow")
    assert unknown.returncode == 2 and "not awaiting approval" in unknown.stderr
    missing = deferred.dsh("approvals", "decide", "no-such-session", CALL, "allow")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    events = deferred.events(session_id)
    assert sum(e["type"] == "approval/decided" for e in events) == 1
    assert deferred.ledger_lines() == []


def test_a_changed_call_is_refused(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session_id = summary["sessionId"]
    wrong = deferred.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--args-digest", "0" * 64,
        "--model", f"scripted:{deferred.second}",
    )
    assert wrong.returncode == 2
    assert "argsDigest" in wrong.stderr
    assert deferred.ledger_lines() == []
    assert not any(e["type"] == "approval/decided" for e in deferred.events(session_id))


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


def test_a_tampered_log_is_refused(deferred: Env) -> None:
    """The stored tool/call arguments are edited after the ask: no decision binds to them."""
    postgres = "DSH_POSTGRES_DSN" in deferred.env
    if not postgres:  # raw JSONL lines, so the edit is a plain text edit (zstd is checksummed)
        text = deferred.config.read_text()
        anchor = "  name: session-persistence-jsonl\n"
        assert anchor in text
        deferred.config.write_text(
            text.replace(anchor, anchor + "  config:\n    compression: none\n")
        )
    _, summary = deferred.run_deferred()
    session_id = summary["sessionId"]
    if postgres:
        import psycopg
        from psycopg import sql

        schema = deferred.env["DSH_POSTGRES_SCHEMA"]
        with psycopg.connect(deferred.env["DSH_POSTGRES_DSN"], autocommit=True) as conn:
            (kind,) = conn.execute(
                sql.SQL("SELECT pg_typeof(event)::text FROM {}.events LIMIT 1").format(
                    sql.Identifier(schema)
                )
            ).fetchone() or ("json",)
            # The append-only trigger refuses edits; a tamperer with the owner's rights lifts it.
            table = sql.SQL("{}.events").format(sql.Identifier(schema))
            conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER events_append_only").format(table))
            changed = conn.execute(
                sql.SQL(
                    "UPDATE {}.events SET event = CAST(replace(event::text, %s, %s) AS {}) "
                    "WHERE session_id = %s AND event::text LIKE %s"
                ).format(sql.Identifier(schema), sql.SQL(kind)),
                (">> ledger", ">> /tmp/elsewhere", session_id, "%>> ledger%"),
            ).rowcount
            conn.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER events_append_only").format(table))
    else:
        (log,) = [p for p in deferred.root.rglob("*.jsonl") if session_id in str(p)]
        raw = log.read_text()
        changed = raw.count(">> ledger")
        log.write_text(raw.replace(">> ledger", ">> /tmp/elsewhere"))
    assert changed >= 1
    decide = deferred.dsh(
        "approvals", "decide", session_id, CALL, "allow", "--model", f"scripted:{deferred.second}",
    )
    assert decide.returncode == 2, decide.stdout + decide.stderr
    assert "do not match the argsDigest" in decide.stderr
    assert deferred.ledger_lines() == []
    assert not Path("/tmp/elsewhere").exists() or CALL not in Path("/tmp/elsewhere").read_text()
    assert not any(e["type"] == "approval/decided" for e in deferred.events(session_id))
