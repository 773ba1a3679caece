"""SIGKILL across defer → decide → body (D19), judged from what is on disk.

A real child process (``deferred_child.py``) is killed at each point; then the real ``dsh
resume`` repairs the session and its closers are checked against the approval evidence:

* killed while the question is open (``tool/call`` and ``approval/asked`` durable, no decision):
  the body cannot have run → ``TOOL_NOT_STARTED``;
* killed after the decision was recorded, before a turn applies it: nothing to repair, nothing
  runs on resume; ``dsh approvals continue`` then runs the call exactly once;
* killed while a continued turn re-checks the decision (its fresh ``tool/call`` is durable):
  ``TOOL_OUTCOME_UNKNOWN`` — conservative, and nothing is re-run;
* killed inside the body: ``TOOL_OUTCOME_UNKNOWN``, the ledger has the one line, nothing re-runs.

Both persistence backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .deferred_env import CALL, Env, ledger_call, script

# slow: real processes SIGKILLed at each point of defer and decide
pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("deferred_child.py")


def child(env: Env, mode: str, session: str) -> subprocess.Popen[str]:
    spec = {
        "config": str(env.config), "root": env.root_flag()[1] if env.root_flag() else None,
        "workspace": str(env.workspace), "script": str(env.second if mode != "kill-asked"
                                                      else env.first),
        "session": session, "call": CALL, "mode": mode,
    }
    return subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)], cwd=env.tmp,
        env={**os.environ, **env.env}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def killed(proc: subprocess.Popen[str], mode: str) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, out + err
    assert f"kill {mode}" in out, out + err


def resume(env: Env, session: str) -> dict[str, Any]:
    proc = env.dsh("resume", session, "--json")
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def codes(result: dict[str, Any]) -> dict[str, str]:
    return {c["callId"]: c["code"] for c in result["closers"] if c["type"] == "tool/result"}


def test_killed_while_the_question_is_open_is_not_started(deferred: Env) -> None:
    killed(child(deferred, "kill-asked", "s-asked"), "kill-asked")
    events = deferred.events("s-asked")
    kinds = [e["type"] for e in events]
    assert "approval/asked" in kinds and "approval/decided" not in kinds and "tool/call" in kinds
    result = resume(deferred, "s-asked")
    assert codes(result) == {CALL: "TOOL_NOT_STARTED"}
    assert deferred.ledger_lines() == []
    assert resume(deferred, "s-asked")["closers"] == []  # balanced now


def test_killed_after_the_decision_runs_nothing_until_continued(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session = summary["sessionId"]
    killed(child(deferred, "kill-decided", session), "kill-decided")
    decided = [e for e in deferred.events(session) if e["type"] == "approval/decided"]
    assert len(decided) == 1 and decided[0]["data"]["outcome"] == "allowed-once"
    result = resume(deferred, session)
    assert result["closers"] == []
    assert deferred.ledger_lines() == []  # resume ran nothing
    again = deferred.dsh("approvals", "decide", session, CALL, "deny", "--no-continue")
    assert again.returncode == 2 and "already decided" in again.stderr
    proc = deferred.dsh("approvals", "continue", session, "--model", f"scripted:{deferred.second}",
                     "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert deferred.ledger_lines() == [CALL]


def test_killed_while_the_decision_is_rechecked_is_outcome_unknown(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session = summary["sessionId"]
    killed(child(deferred, "kill-recheck", session), "kill-recheck")
    result = resume(deferred, session)
    assert codes(result) == {CALL: "TOOL_OUTCOME_UNKNOWN"}  # conservative: tool/call durable
    assert deferred.ledger_lines() == []
    assert deferred.dsh("approvals", "list", "--json").stdout.strip() == ""


def test_killed_inside_the_body_is_outcome_unknown_and_never_rerun(deferred: Env) -> None:
    script(deferred.first, [ledger_call(" && sleep 120"), {"text": "unused"}])
    _, summary = deferred.run_deferred()
    session = summary["sessionId"]
    proc = child(deferred, "decide", session)
    deadline = time.monotonic() + 240
    while not deferred.ledger_lines():  # the body has run its side effect and now sleeps
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the body never started"
        time.sleep(0.05)
    proc.kill()
    proc.communicate(timeout=60)
    result = resume(deferred, session)
    assert codes(result) == {CALL: "TOOL_OUTCOME_UNKNOWN"}
    assert deferred.ledger_lines() == [CALL]
    assert resume(deferred, session)["closers"] == []
    assert deferred.ledger_lines() == [CALL]


def test_a_session_held_by_another_process_is_exit_3(deferred: Env) -> None:
    _, summary = deferred.run_deferred()
    session = summary["sessionId"]
    holder = child(deferred, "hold", session)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        proc = deferred.dsh("approvals", "decide", session, CALL, "allow")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        holder.kill()
        holder.communicate(timeout=60)
    assert deferred.ledger_lines() == []
    assert not any(e["type"] == "approval/decided" for e in deferred.events(session))
