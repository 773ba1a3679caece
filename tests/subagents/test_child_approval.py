"""A child's deferred approval pauses its parent (D36): real ``dsh`` processes, real stores.

``dsh run --approval defer`` of a parent that delegates to ``alpha``, whose ``ledger`` call (it
appends its call id to a file) a ``tool-rules`` row sends to approval. Nobody answers: the
child's turn ends ``awaiting-approval``, and so does the parent's, with the delegating call left
open (a ``tool/waits`` record names the child and its call). Another process decides the child's
call with ``dsh approvals decide CHILD CALL allow|deny``: the parent is continued, its delegating
call re-attaches to the child, the child applies the decision and answers, and that answer is the
delegating call's result. A SIGKILL during that continuation, then ``dsh resume``, leaves both
logs balanced. On JSONL, SQLite and PostgreSQL (a fresh schema each).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .test_crash import (
    PARENT,
    _declared,
    _dsh,
    _events,
    _is_error,
    _results,
    _store_rows,
    _text,
    _turn_end,
    _write_composition,
)

CHILD = f"{PARENT}--d1"
DELEGATE = {
    "name": "subagent",
    "id": "d1",
    "arguments": {"agent": "alpha", "description": "ledger", "prompt": "write the ledger"},
}


def _compose(
    tmp: Path, backend: str, schema: str | None, kill: str | None = None, resume: str = "report"
) -> Path:
    _scripts(tmp, [{"tool_calls": [DELEGATE]}], [{"tool_calls": [{"name": "ledger", "id": "y1"}]}])
    rows: list[dict[str, Any]] = [
        *_store_rows(tmp, backend, schema),
        {
            "id": "model-a",
            "name": "llm-scripted",
            "config": {"provider": "scripted-a", "path": str(tmp / "alpha.yml")},
        },
        {"id": "tools", "name": "tools"},
        {
            "id": "crash-points",
            "name": "tests.subagents.crashpoints:CrashPoints",
            "config": {"kill": kill, "ledger": str(tmp / "ledger")},
        },
        {"id": "approval", "name": "user-approval", "config": {"policy": "ask"}},
        {
            "id": "rules",
            "name": "tool-rules",
            "config": {"rules": [{"tool": "ledger", "decision": "ask", "reason": "a side effect"}]},
        },
        {
            "id": "subagents",
            "name": "subagents",
            "config": {
                "agents": [_declared("alpha", "writes the ledger", "scripted-a", ["ledger"])],
                "resume": resume,
            },
        },
        {"id": "agent", "name": "agent"},
    ]
    return _write_composition(tmp, rows)


def _scripts(tmp: Path, parent: list[dict[str, Any]], alpha: list[dict[str, Any]]) -> None:
    """Each process's scripted models start at their first response: the next phase's."""
    (tmp / "parent.yml").write_text(yaml.safe_dump({"responses": parent}))
    (tmp / "alpha.yml").write_text(yaml.safe_dump({"responses": alpha}))


def _ledger(tmp: Path) -> list[str]:
    path = tmp / "ledger"
    return path.read_text().split() if path.exists() else []


def _run_deferred(tmp: Path, config: Path) -> dict[str, Any]:
    ran = _dsh(
        tmp, "run", "--config", str(config), "--model", f"scripted:{tmp / 'parent.yml'}",
        "--session", PARENT, "--new", "--approval", "defer", "--json", "go",
    )  # fmt: skip
    assert ran.returncode == 4, (ran.returncode, ran.stdout, ran.stderr)
    summary: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    return summary


def _waiting_parent(tmp: Path, config: Path) -> None:
    """After the deferred run: both turns end awaiting approval, the delegating call is open."""
    parent = _events(tmp, config, PARENT)
    child = _events(tmp, config, CHILD)
    assert parent is not None and child is not None
    ends = [e["data"]["reason"] for e in parent if e["type"] == "turn/end"]
    assert ends == [{"kind": "awaiting-approval", "callIds": ["d1"]}]
    ends = [e["data"]["reason"] for e in child if e["type"] == "turn/end"]
    assert ends == [{"kind": "awaiting-approval", "callIds": ["y1"]}]
    assert not [e for e in parent if e["type"] == "tool/result"], "d1 waits: no result"
    (waits,) = [e for e in parent if e["type"] == "tool/waits"]
    assert waits["ignorable"] is True
    assert (waits["data"]["callId"], waits["data"]["sessionId"], waits["data"]["callIds"]) == (
        "d1",
        CHILD,
        ["y1"],
    )
    assert _ledger(tmp) == [], "nothing ran"


BACKENDS = ["jsonl", "sqlite", "postgres"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_allow_from_another_process_continues_child_and_parent(
    tmp_path: Path, backend: str, pg_schema: str | None
) -> None:
    config = _compose(tmp_path, backend, pg_schema)
    summary = _run_deferred(tmp_path, config)
    assert summary["turnEnd"] == {"kind": "awaiting-approval"}
    (pending,) = summary["pendingApprovals"]
    assert (pending["sessionId"], pending["callId"], pending["tool"]) == (CHILD, "y1", "ledger")
    assert pending["waitedOnBy"] == [{"sessionId": PARENT, "callId": "d1"}]
    _waiting_parent(tmp_path, config)

    listed = _dsh(tmp_path, "approvals", "list", "--config", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    assert [(r["sessionId"], r["callId"], r.get("waitedOnBy")) for r in rows] == [
        (CHILD, "y1", [{"sessionId": PARENT, "callId": "d1"}])
    ]
    human = _dsh(tmp_path, "approvals", "list", "--config", str(config))
    assert f"waited on by: session {PARENT} · call d1" in human.stdout
    own = _dsh(tmp_path, "approvals", "decide", PARENT, "d1", "allow", "--config", str(config))
    assert own.returncode == 2 and f'waits on session "{CHILD}"' in own.stderr, own.stderr
    assert "Traceback" not in own.stderr

    # `dsh resume` of a waiting parent changes nothing: the open call waits, it is not crashed.
    resumed = _dsh(tmp_path, "resume", PARENT, "--config", str(config))
    assert resumed.returncode == 4, (resumed.stdout, resumed.stderr)  # still awaiting approval
    assert "nothing to repair" in resumed.stdout and f"session {CHILD} · call y1" in resumed.stdout
    _waiting_parent(tmp_path, config)

    _scripts(tmp_path, [{"text": "parent done"}], [{"text": "alpha wrote it"}])
    decided = _dsh(tmp_path, "approvals", "decide", CHILD, "y1", "allow", "--config", str(config))
    assert decided.returncode == 0, (decided.stdout, decided.stderr)
    assert f"continuing session {PARENT}" in decided.stdout
    assert _ledger(tmp_path) == ["y1"], "the child's decided call ran exactly once"

    child = _events(tmp_path, config, CHILD)
    parent = _events(tmp_path, config, PARENT)
    assert child is not None and parent is not None
    child_results = _results(child)
    assert _text(child_results["y1"][0]) == "ledger written"
    assert _turn_end(child) == "completed"
    results = _results(parent)
    assert not _is_error(results["d1"][0]) and _text(results["d1"][0]) == "alpha wrote it"
    assert _turn_end(parent) == "completed"
    assert [e["data"]["childId"] for e in parent if e["type"] == "subagent/catalog"] == [CHILD]
    listed = _dsh(tmp_path, "approvals", "list", "--config", str(config), "--json")
    assert listed.stdout.strip() == ""


def test_deny_gives_the_parent_the_childs_answer(tmp_path: Path) -> None:
    config = _compose(tmp_path, "jsonl", None)
    _run_deferred(tmp_path, config)
    _scripts(tmp_path, [{"text": "parent done"}], [{"text": "alpha was refused"}])
    decided = _dsh(
        tmp_path, "approvals", "decide", CHILD, "y1", "deny", "--config", str(config), "--json"
    )
    assert decided.returncode == 0, (decided.stdout, decided.stderr)
    assert json.loads(decided.stdout.strip().splitlines()[-1])["sessionId"] == PARENT
    assert _ledger(tmp_path) == [], "a denied call never runs"
    child = _events(tmp_path, config, CHILD)
    parent = _events(tmp_path, config, PARENT)
    assert child is not None and parent is not None
    (y1,) = _results(child)["y1"]
    assert _is_error(y1) and "rejected" in _text(y1)
    (d1,) = _results(parent)["d1"]
    assert not _is_error(d1) and _text(d1) == "alpha was refused"
    assert (_turn_end(child), _turn_end(parent)) == ("completed", "completed")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("point", ["reattach", "ledger-written"])
def test_a_kill_during_the_continuation_then_resume_is_honest(
    tmp_path: Path, backend: str, point: str, pg_schema: str | None
) -> None:
    parent, child = _killed_then_resumed(tmp_path, backend, pg_schema, point, "report")
    (d1,) = _results(parent)["d1"]  # every call of the parent has exactly one result
    assert _turn_end(parent) == "interrupted"
    assert CHILD in _text(d1)
    if point == "reattach":  # the decision is recorded, never applied: nothing ran
        assert _ledger(tmp_path) == []
        assert d1["error"]["code"] == "SUBAGENT_UNFINISHED", d1
        assert f"`dsh approvals continue {CHILD}` applies them" in _text(d1)
        # The child still waits (its last turn ended awaiting approval: y1 is pending, decided,
        # not crashed), so no result was invented for it.
        assert not [e for e in child if e["type"] == "tool/result"]
        assert [e["data"]["outcome"] for e in child if e["type"] == "approval/decided"] == [
            "allowed-once"
        ]
    else:  # the decided call ran once, then the process died: its outcome is unknown
        child_results = _results(child)
        assert _ledger(tmp_path) == ["y1"]
        assert child_results["y1"][0]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert _turn_end(child) == "interrupted"
        assert d1["error"]["code"] == "TOOL_OUTCOME_UNKNOWN", d1
        assert "ledger x1" in _text(d1)


def test_resume_continue_applies_the_decision_the_kill_left(tmp_path: Path) -> None:
    """``resume: continue``: the child's recorded decision is applied on resume, once."""
    parent, child = _killed_then_resumed(tmp_path, "jsonl", None, "reattach", "continue")
    assert _ledger(tmp_path) == ["y1"]
    assert _text(_results(child)["y1"][0]) == "ledger written"
    assert _turn_end(child) == "completed"
    (d1,) = _results(parent)["d1"]
    assert not _is_error(d1) and _text(d1) == "alpha wrote it"


def _killed_then_resumed(
    tmp: Path, backend: str, schema: str | None, point: str, resume: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    config = _compose(tmp, backend, schema, kill=point, resume=resume)
    _run_deferred(tmp, config)
    _scripts(tmp, [{"text": "parent done"}], [{"text": "alpha wrote it"}])
    decided = _dsh(tmp, "approvals", "decide", CHILD, "y1", "allow", "--config", str(config))
    assert decided.returncode == -9, (decided.returncode, decided.stdout, decided.stderr)
    assert f"kill {point}" in decided.stdout
    resumed = _dsh(tmp, "resume", PARENT, "--config", str(config))
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    parent = _events(tmp, config, PARENT)
    child = _events(tmp, config, CHILD)
    assert parent is not None and child is not None
    return parent, child


@pytest.mark.parametrize("target", [PARENT, CHILD])
def test_decide_no_continue_then_resume_then_continue_the_parent(
    tmp_path: Path, target: str
) -> None:
    """Between the decision and the continuation nothing is crashed: resume leaves the parent
    waiting (its call is not outcome unknown), and ``approvals continue PARENT`` finishes it;
    ``approvals continue CHILD`` continues the waiting parent too, never the child alone."""
    config = _compose(tmp_path, "jsonl", None)
    _run_deferred(tmp_path, config)
    recorded = _dsh(
        tmp_path, "approvals", "decide", CHILD, "y1", "allow", "--no-continue",
        "--config", str(config),
    )  # fmt: skip
    assert recorded.returncode == 0, (recorded.stdout, recorded.stderr)
    assert _ledger(tmp_path) == []
    resumed = _dsh(tmp_path, "resume", PARENT, "--config", str(config))
    assert "nothing to repair" in resumed.stdout, (resumed.stdout, resumed.stderr)
    parent = _events(tmp_path, config, PARENT)
    assert parent is not None
    assert not [e for e in parent if e["type"] == "tool/result"], "d1 still waits"
    _scripts(tmp_path, [{"text": "parent done"}], [{"text": "alpha wrote it"}])
    continued = _dsh(tmp_path, "approvals", "continue", target, "--config", str(config))
    assert continued.returncode == 0, (continued.stdout, continued.stderr)
    assert _ledger(tmp_path) == ["y1"]
    parent = _events(tmp_path, config, PARENT)
    assert parent is not None
    (d1,) = _results(parent)["d1"]
    assert not _is_error(d1) and _text(d1) == "alpha wrote it"
    assert _turn_end(parent) == "completed"
