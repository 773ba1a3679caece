"""Sub-agents across a SIGKILL: real ``dsh run`` processes, real stores, real ``dsh resume``.

A parent delegates to two children in parallel (``alpha`` and ``beta``, each on its own scripted
model route). The process kills itself (``crashpoints.py``) before the first child exists, once
it is stored but before it runs, inside a child's (or a grandchild's) tool body, or after
``alpha`` finished but before the parent logged its result. Then
``dsh resume`` of the parent, and both logs are read back with ``dsh sessions show --json``:
every call in every log has exactly one result, every turn is closed, a completed child's answer
is the parent's result, an interrupted child is reported with its id and what it did, and a child
that never stored a turn is ``TOOL_NOT_STARTED``. On JSONL, SQLite and PostgreSQL (a fresh
schema each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import PG_DSN

HERE = Path(__file__).resolve().parent
DSH = [sys.executable, "-m", "dsh_host"]
PARENT = "p1"

PARENT_SCRIPT = {
    "responses": [
        {
            "tool_calls": [
                {
                    "name": "subagent",
                    "id": "d1",
                    "arguments": {"agent": "alpha", "description": "first", "prompt": "do A"},
                },
                {
                    "name": "subagent",
                    "id": "d2",
                    "arguments": {"agent": "beta", "description": "second", "prompt": "do B"},
                },
            ]
        },
        {"text": "parent done"},
    ]
}


def _child_script(point: str, name: str) -> dict[str, Any]:
    if name == "alpha" and point == "child-tool":
        return {"responses": [{"tool_calls": [{"name": "crash", "id": "a1"}]}, {"text": "x"}]}
    if name == "alpha" and point == "grandchild-tool":  # alpha delegates to gamma, which dies
        call = {
            "name": "subagent",
            "id": "g1",
            "arguments": {"agent": "gamma", "description": "deeper", "prompt": "do C"},
        }
        return {"responses": [{"tool_calls": [call]}, {"text": "x"}]}
    if name == "gamma":
        return {"responses": [{"tool_calls": [{"name": "crash", "id": "c1"}]}, {"text": "x"}]}
    return {"responses": [{"text": f"answer {name[0].upper()}"}]}


def _persistence(backend: str, root: Path, schema: str | None = None) -> dict[str, Any]:
    if backend == "postgres":
        return {
            "id": "session-persistence",
            "name": "session-persistence-postgres",
            "config": {"dsn": PG_DSN, "schema": schema},
        }
    if backend == "jsonl":
        return {
            "id": "session-persistence",
            "name": "session-persistence-jsonl",
            "config": {"root": str(root)},
        }
    return {
        "id": "session-persistence",
        "name": "session-persistence-sqlite",
        "config": {"root": str(root)},
    }


def _store_rows(tmp: Path, backend: str, schema: str | None) -> list[dict[str, Any]]:
    """The rows every crash composition starts with: the store, its checkpoints, the model."""
    return [
        {"id": "sessions", "name": "sessions"},
        _persistence(backend, tmp / "store", schema),
        {"id": "session-checkpoints", "name": "session-checkpoint-policy"},
        {"id": "llm", "name": "llm"},
    ]


def _tool_rows(point: str | None) -> list[dict[str, Any]]:
    """The tools row and the crash instrumentation (``crashpoints.py``) killing at ``point``."""
    return [
        {"id": "tools", "name": "tools"},
        {
            "id": "crash-points",
            "name": "tests.subagents.crashpoints:CrashPoints",
            "config": {"kill": point},
        },
    ]


def _compose(
    tmp: Path, backend: str, point: str | None, schema: str | None = None, resume: str = "report"
) -> Path:
    scripts = {"parent": PARENT_SCRIPT}
    for name in ("alpha", "beta", "gamma"):
        scripts[name] = _child_script(point or "", name)
    for name, script in scripts.items():
        (tmp / f"{name}.yml").write_text(yaml.safe_dump(script))
    rows = [
        *_store_rows(tmp, backend, schema),
        {
            "id": "model-a",
            "name": "llm-scripted",
            "config": {"provider": "scripted-a", "path": str(tmp / "alpha.yml")},
        },
        {
            "id": "model-b",
            "name": "llm-scripted",
            "config": {"provider": "scripted-b", "path": str(tmp / "beta.yml")},
        },
        {
            "id": "model-c",
            "name": "llm-scripted",
            "config": {"provider": "scripted-c", "path": str(tmp / "gamma.yml")},
        },
        *_tool_rows(point),
        {
            "id": "subagents",
            "name": "subagents",
            "config": {
                "agents": [
                    _declared("alpha", "does A", "scripted-a", ["crash", "subagent"]),
                    _declared("beta", "does B", "scripted-b", []),
                    _declared("gamma", "does C", "scripted-c", ["crash"]),
                ],
                "resume": resume,
            },
        },
        {"id": "agent", "name": "agent"},
    ]
    return _write_composition(tmp, rows)


def _declared(name: str, description: str, provider: str, tools: list[str]) -> dict[str, Any]:
    """One ``agents:`` entry of the subagents row, on its own scripted route."""
    return {
        "name": name,
        "description": description,
        "provider": provider,
        "model": "scripted",
        "tools": tools,
    }


def _write_composition(tmp: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp / "dsh.yml"
    path.write_text(yaml.safe_dump(rows, sort_keys=False))
    return path


def _dsh(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "DSH_SESSION_ROOT": str(tmp / "x")}
    return subprocess.run(
        [*DSH, *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _run_parent(
    tmp: Path, config: Path, session: str = PARENT, script: str = "parent.yml"
) -> subprocess.CompletedProcess[str]:
    """``dsh run`` of a new parent session on its scripted model, prompt ``go``."""
    model = f"scripted:{tmp / script}"
    return _dsh(
        tmp, "run", "--config", str(config), "--model", model, "--session", session, "--new", "go"
    )


def _events(tmp: Path, config: Path, session: str) -> list[dict[str, Any]] | None:
    shown = _dsh(
        tmp, "sessions", "show", session, "--config", str(config), "--view", "events", "--json"
    )
    if shown.returncode != 0:
        assert "not found" in (shown.stderr + shown.stdout).lower(), shown.stderr
        return None
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


def _results(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """call id -> its tool/result data, after checking that every call has exactly one."""
    calls = [
        block["id"]
        for e in events
        if e["type"] == "assistant/message"
        for block in e["data"]["message"]["content"]
        if block["type"] == "tool-call"
    ]
    results: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e["type"] == "tool/result":
            results.setdefault(e["data"]["message"]["source"]["callId"], []).append(e["data"])
    assert sorted(results) == sorted(calls), (calls, list(results))
    assert all(len(r) == 1 for r in results.values()), results
    starts = Counter(e["type"] for e in events)
    assert starts["turn/start"] == starts["turn/end"], "every turn is closed"
    return results


def _text(result: dict[str, Any]) -> str:
    block = result["message"]["content"][0]
    return "".join(part["text"] for part in block["content"] if part["type"] == "text")


def _is_error(result: dict[str, Any]) -> bool:
    return bool(result["message"]["content"][0].get("isError"))


def _turn_end(events: list[dict[str, Any]]) -> str | None:
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    return ends[-1] if ends else None


def _answer(events: list[dict[str, Any]]) -> str:
    texts = [
        part["text"]
        for e in events
        if e["type"] == "assistant/message"
        for part in e["data"]["message"]["content"]
        if part["type"] == "text"
    ]
    return texts[-1] if texts else ""


BACKENDS = ["jsonl", "sqlite", "postgres"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "point", ["before-child", "child-stored", "child-tool", "grandchild-tool", "child-finished"]
)
def test_resume_after_a_kill_balances_both_logs(
    tmp_path: Path, backend: str, point: str, pg_schema: str | None
) -> None:
    config = _compose(tmp_path, backend, point, pg_schema)
    crashed = _run_parent(tmp_path, config)
    assert crashed.returncode == -9, (crashed.returncode, crashed.stdout, crashed.stderr)
    died = "child-tool" if point == "grandchild-tool" else point  # the crash tool's label
    assert f"kill {died}" in crashed.stdout
    before = _events(tmp_path, config, PARENT)
    assert before is not None
    durable_calls = {e["data"]["callId"] for e in before if e["type"] == "tool/call"}
    assert durable_calls == {"d1", "d2"}, "the checkpoint made both delegating calls durable"
    assert not [e for e in before if e["type"] == "tool/result"]

    resumed = _dsh(tmp_path, "resume", PARENT, "--config", str(config))
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)

    parent = _events(tmp_path, config, PARENT)
    assert parent is not None
    results = _results(parent)
    assert _turn_end(parent) == "interrupted"
    for call_id, agent in (("d1", "alpha"), ("d2", "beta")):
        child_id = f"{PARENT}--{call_id}"
        child = _events(tmp_path, config, child_id)
        result = results[call_id][0]
        if child is None or not any(e["type"] == "turn/start" for e in child):
            assert result["error"]["code"] == "TOOL_NOT_STARTED", result
            assert child_id in _text(result)
            assert f'sub-agent "{agent}"' in _text(result), "named from the stored call"
            continue
        _results(child)  # the child's own calls are balanced too
        if point in ("before-child", "child-stored"):
            pytest.fail(f"no child turn can be durable before the first child runs: {child}")
        if _turn_end(child) == "completed":
            assert not _is_error(result) and "error" not in result
            assert _text(result) == _answer(child) == f"answer {agent[0].upper()}"
        else:
            assert _turn_end(child) == "interrupted"
            assert result["error"]["code"] == "TOOL_OUTCOME_UNKNOWN", result
            assert child_id in _text(result)
    if point in ("before-child", "child-stored"):
        assert {r[0]["error"]["code"] for r in results.values()} == {"TOOL_NOT_STARTED"}
    catalog = {e["data"]["childId"] for e in parent if e["type"] == "subagent/catalog"}
    for child_id in catalog:  # a durable catalog fact always has its child stored
        assert _events(tmp_path, config, child_id) is not None, child_id
    if point == "child-stored":
        assert catalog, "the catalog fact is durable before the child runs"
    if point != "before-child":
        assert catalog, "a child that ran is listed in its parent's catalog"
    if point == "child-tool":
        alpha = _events(tmp_path, config, f"{PARENT}--d1")
        assert alpha is not None
        (crash,) = _results(alpha)["a1"]
        assert crash["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        text = _text(results["d1"][0])
        assert "crash x1" in text and "interrupted" in text
    if point == "child-finished":
        assert _text(results["d1"][0]) == "answer A", "a finished child's answer is kept"
    if point == "grandchild-tool":  # repaired from the bottom up: gamma, alpha, the parent
        gamma = _events(tmp_path, config, f"{PARENT}--d1--g1")
        alpha = _events(tmp_path, config, f"{PARENT}--d1")
        assert gamma is not None and alpha is not None
        assert _results(gamma)["c1"][0]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert _turn_end(gamma) == "interrupted"
        (g1,) = _results(alpha)["g1"]
        assert g1["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
        assert f"{PARENT}--d1--g1" in _text(g1) and "crash x1" in _text(g1)
        assert "subagent x1" in _text(results["d1"][0])


LIBRARY_RUN = """
import sys
import anyio
from dsh_host import Agent

async def main() -> None:
    async with Agent(model="scripted:parent.yml", composition="dsh.yml") as agent:
        if sys.argv[1] == "run":
            await agent.run("go")
        else:
            await agent.resume(sys.argv[2])
            print("repaired", len(agent.core.repairs))

anyio.run(main)
"""


def test_agent_resume_keeps_a_finished_childs_answer(tmp_path: Path) -> None:
    """The library's ``Agent.resume`` repairs through the same refiner as ``dsh resume``."""
    config = _compose(tmp_path, "jsonl", "child-finished")
    (tmp_path / "lib.py").write_text(LIBRARY_RUN)
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "DSH_SESSION_ROOT": str(tmp_path)}

    def lib(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "lib.py", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    crashed = lib("run")
    assert crashed.returncode == -9 and "kill child-finished" in crashed.stdout, crashed.stderr
    listed = _dsh(tmp_path, "sessions", "list", "--config", str(config), "--json", "--fresh")
    (parent_id,) = [
        row["sessionId"]
        for row in map(json.loads, listed.stdout.splitlines())
        if row["parentSession"] is None
    ]
    resumed = lib("resume", parent_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "repaired 4" in resumed.stdout  # two results, step/end, turn/end
    parent = _events(tmp_path, config, parent_id)
    assert parent is not None
    results = _results(parent)
    assert _text(results["d1"][0]) == "answer A"
    assert not _is_error(results["d1"][0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("point", ["child-tool", "grandchild-tool"])
def test_resume_continue_reattaches_an_interrupted_child(
    tmp_path: Path, backend: str, point: str, pg_schema: str | None
) -> None:
    """``resume: continue``: the interrupted child (and grandchild) run one more turn on resume
    and their answers are the delegating calls' results, not ``TOOL_OUTCOME_UNKNOWN``."""
    config = _compose(tmp_path, backend, point, pg_schema, resume="continue")
    crashed = _run_parent(tmp_path, config)
    assert crashed.returncode == -9, (crashed.returncode, crashed.stdout, crashed.stderr)
    # The resuming process's models (each script restarts per process): the continuations answer.
    for name in ("alpha", "gamma"):
        again = {"responses": [{"text": f"answer {name[0].upper()} again"}]}
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(again))

    resumed = _dsh(tmp_path, "resume", PARENT, "--config", str(config))
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)

    parent = _events(tmp_path, config, PARENT)
    alpha = _events(tmp_path, config, f"{PARENT}--d1")
    assert parent is not None and alpha is not None
    results = _results(parent)
    assert _turn_end(parent) == "interrupted"
    d1 = results["d1"][0]
    assert not _is_error(d1) and _text(d1) == "answer A again", d1
    _results(alpha)  # balanced: the interrupted turn closed, the continuation complete
    ends = [e["data"]["reason"]["kind"] for e in alpha if e["type"] == "turn/end"]
    assert ends == ["interrupted", "completed"]
    prompts = [json.dumps(e["data"]) for e in alpha if e["type"] == "user/message"]
    assert "Your previous turn was interrupted" in prompts[-1]
    if point == "child-tool":
        (crash,) = _results(alpha)["a1"]
        assert crash["error"]["code"] == "TOOL_OUTCOME_UNKNOWN", "the crashed call stays unknown"
    else:
        gamma = _events(tmp_path, config, f"{PARENT}--d1--g1")
        assert gamma is not None
        _results(gamma)
        assert [e["data"]["reason"]["kind"] for e in gamma if e["type"] == "turn/end"] == [
            "interrupted",
            "completed",
        ]
        (g1,) = _results(alpha)["g1"]
        assert not _is_error(g1) and _text(g1) == "answer G again", g1
