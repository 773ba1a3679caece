"""Run terms, from outside: a session continues under what it recorded, by real ``dsh`` processes.

Each test creates a session with one command and continues it with another, the way a user (or
a script) would, then judges from the stored log and the workspace: the recorded model, sandbox
and composition hold unless a flag changes them, a flag's change is logged as a ``run/terms``
override, and a refusal is one ``dsh: error:`` line that leaves the log byte for byte as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .cli_helpers import FIXTURES, REPO, dsh, json_lines

# slow: several real dsh processes per test
pytestmark = pytest.mark.slow

RULES = (
    "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
    "      - {tool: bash, decision: ask, reason: side effects need a human}\n"
)


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "sessions"
        self.workspace = tmp / "ws"
        self.workspace.mkdir()
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.config = tmp / "dsh.yml"
        self.config.write_text((REPO / "configs" / "default.yml").read_text() + RULES)
        self.env = {
            "XDG_CONFIG_HOME": str(tmp / "xdg-config"),
            "XDG_CACHE_HOME": str(tmp / "xdg-cache"),
        }

    def script(self, name: str, responses: list[Any]) -> Path:
        path = self.tmp / name
        path.write_text(json.dumps({"responses": responses}))
        return path

    def dsh(self, *args: str, config: Path | None = None) -> Any:
        flags = ["--root", str(self.root)]
        if config is not None:
            flags += ["--config", str(config)]
        return dsh(*args, *flags, cwd=self.cwd, env=self.env, timeout=300)

    def events(self, session_id: str) -> list[dict[str, Any]]:
        proc = self.dsh(
            "sessions", "show", session_id, "--view", "events", "--json", config=self.config
        )
        assert proc.returncode == 0, proc.stderr
        return json_lines(proc.stdout)

    def log_bytes(self) -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(self.root.rglob("session.v3.jsonl*"))}


def _dsh_admits(events: list[dict[str, Any]]) -> None:
    """DSH v3's admission, as far as these events go: an envelope of known keys, and a type DSH
    knows or one marked ``ignorable: true`` (DSH keeps it uninterpreted); extra data keys on a
    known type (the approval context) are not checked by DSH."""
    from dsh_host._session import DSH_V3_KNOWN_EVENT_TYPES

    for event in events:
        assert set(event) <= {
            "type",
            "seq",
            "time",
            "data",
            "ignorable",
            "surfaceOp",
            "sourceEventSeqs",
        }, event
        assert event["type"] in DSH_V3_KNOWN_EVENT_TYPES or event.get("ignorable") is True, event
        if event["type"] == "run/terms":
            assert "surfaceOp" not in event and "sourceEventSeqs" not in event


def _terms(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "run/terms"]


def _one_error_line(proc: Any) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsh: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return str(lines[0])


def test_continuing_without_model_uses_the_recorded_model_not_the_demo(tmp_path: Path) -> None:
    """Before: `dsh resume ID PROMPT` without --model ran the demo script, whose bash calls
    wrote notes.txt into the session's workspace, and reported `completed`."""
    env = Env(tmp_path)
    first = env.script("a.json", [{"text": "answer from A"}])
    run = env.dsh(
        "run",
        "--workspace",
        str(env.workspace),
        "--model",
        f"scripted:{first}",
        "--json",
        "hello",
        config=env.config,
    )
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]
    (created,) = _terms(env.events(session_id))
    assert created["ignorable"] is True  # DSH keeps the record without interpreting it
    data = created["data"]
    assert data["reason"] == "created" and data["by"] == "dsh run"
    assert data["model"] == {
        "provider": "scripted",
        "model": "scripted",
        "spec": f"scripted:{first}",
    }
    assert data["workspace"] == str(env.workspace)
    assert data["sandbox"] == {"mode": "workspace-write", "network": "deny"}
    assert data["approval"] == {"policy": "ask", "unanswered": "fail"}
    assert data["composition"]["name"] == str(env.config.resolve())

    for argv in (["resume", session_id, "again"], ["run", "--session", session_id, "again"]):
        proc = env.dsh(*argv, "--json", config=env.config)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1])["finalText"] == "answer from A"
    assert not (env.workspace / "notes.txt").exists()  # the demo never ran
    assert len(_terms(env.events(session_id))) == 1  # nothing changed: nothing logged
    _dsh_admits(env.events(session_id))


def test_a_demo_session_is_not_continued_by_the_demo_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    env = Env(tmp_path)
    run = env.dsh("run", "--workspace", str(env.workspace))  # the demo
    assert run.returncode == 0, run.stderr
    assert "no model is configured: this is the built-in demo script" in run.stdout
    session_id = next(
        line.split()[1] for line in run.stdout.splitlines() if line.startswith("session ")
    )
    before = env.log_bytes()
    for argv in (["resume", session_id, "again"], ["run", "--session", session_id, "again"]):
        proc = env.dsh(*argv)
        assert proc.returncode == 2
        assert "built-in demo script" in _one_error_line(proc)
    assert env.log_bytes() == before


def test_a_route_that_is_not_configured_here_is_refused(tmp_path: Path) -> None:
    """A session whose model is a composition's row continues only where that row is."""
    env = Env(tmp_path)
    script = env.script("own.json", [{"text": "from the composition's model"}])
    own = tmp_path / "own.yml"
    own.write_text(
        env.config.read_text().replace(
            "- id: agent\n  name: agent\n  config:\n",
            "- id: agent\n  name: agent\n  config:\n    provider: house\n    model: house-model\n",
        )
        + f"\n- id: house\n  name: llm-scripted\n  config:\n    path: {script}\n"
        "    provider: house\n    model: house-model\n"
    )
    run = env.dsh("run", "--workspace", str(env.workspace), "--json", "hi", config=own)
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]
    before = env.log_bytes()

    other = env.dsh("resume", session_id, "again", config=env.config)  # another composition
    assert other.returncode == 2
    line = _one_error_line(other)
    assert "house:house-model; its route is not configured here; pass --model or --config" in line
    unnamed = env.dsh("resume", session_id, "again")  # the shipped default, not named
    assert unnamed.returncode == 2
    assert "pass --config FILE" in _one_error_line(unnamed)
    assert env.log_bytes() == before
    repair = env.dsh("resume", session_id, "--json")  # runs nothing: no term is checked
    assert repair.returncode == 0, repair.stderr
    assert json.loads(repair.stdout.splitlines()[-1])["closers"] == []

    again = env.dsh("resume", session_id, "again", "--json", config=own)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["finalText"] == "from the composition's model"


def test_a_call_deferred_read_only_runs_read_only_after_decide(tmp_path: Path) -> None:
    """Before: `approvals decide` (no --sandbox) ran the call under the composition's
    workspace-write, and the file the read-only run could not write appeared."""
    env = Env(tmp_path)
    first = env.script(
        "first.json",
        [
            {
                "tool_calls": [
                    {
                        "id": "call-touch",
                        "name": "bash",
                        "arguments": {"command": "touch made-here", "description": "Create a file"},
                    }
                ]
            },
            {"text": "never reached by the first process"},
        ],
    )
    second = env.script("second.json", [{"text": "decided"}])
    run = env.dsh(
        "run",
        "--workspace",
        str(env.workspace),
        "--model",
        f"scripted:{first}",
        "--sandbox",
        "read-only",
        "--approval",
        "defer",
        "--json",
        "make a file",
        config=env.config,
    )
    assert run.returncode == 4, run.stdout + run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]

    decide = env.dsh(
        "approvals",
        "decide",
        session_id,
        "call-touch",
        "allow",
        "--model",
        f"scripted:{second}",
        "--json",
        config=env.config,
    )
    assert decide.returncode == 0, decide.stdout + decide.stderr
    assert not (env.workspace / "made-here").exists()  # still read-only
    events = env.events(session_id)
    results = [e for e in events if e["type"] == "tool/result"]
    assert len(results) == 1 and results[0]["data"]["message"]["source"]["callId"] == "call-touch"
    *_, override = _terms(events)
    assert override["data"]["reason"] == "override" and override["data"]["changed"] == ["model"]
    assert override["data"]["by"] == "dsh approvals decide"
    assert override["data"]["sandbox"]["mode"] == "read-only"
    assert override["data"]["approval"] == {"policy": "ask", "unanswered": "defer"}


def test_an_override_is_logged_and_holds_for_the_next_command(tmp_path: Path) -> None:
    env = Env(tmp_path)
    first = env.script("a.json", [{"text": "answer"}])
    run = env.dsh(
        "run",
        "--workspace",
        str(env.workspace),
        "--model",
        f"scripted:{first}",
        "--sandbox",
        "read-only",
        "--json",
        "hi",
        config=env.config,
    )
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]
    widened = env.dsh(
        "resume", session_id, "again", "--sandbox", "workspace-write", config=env.config
    )
    assert widened.returncode == 0, widened.stderr
    created, override = _terms(env.events(session_id))
    assert created["data"]["sandbox"]["mode"] == "read-only"
    assert override["data"]["reason"] == "override" and override["data"]["changed"] == ["sandbox"]
    assert override["data"]["sandbox"]["mode"] == "workspace-write"
    assert override["data"]["by"] == "dsh resume"
    assert override["data"]["model"] == created["data"]["model"]
    # the next command without the flag continues under the terms now in force, logging nothing
    plain = env.dsh("resume", session_id, "third", config=env.config)
    assert plain.returncode == 0, plain.stderr
    assert len(_terms(env.events(session_id))) == 2


def test_a_session_without_terms_says_what_it_assumes(tmp_path: Path) -> None:
    """A log written before the terms (here DSH's own fixture) keeps today's behaviour with an
    explicit model, says what it assumes, and records it; without a model it is refused."""
    import shutil

    env = Env(tmp_path)
    shutil.copytree(FIXTURES / "root-zstd", env.root)
    workspace = Path("/home/dev/project")
    flags = ["--workspace", str(env.workspace)] if not workspace.is_dir() else []
    before = env.log_bytes()
    refused = env.dsh("resume", "clean", "again", *flags, config=env.config)
    assert refused.returncode == 2
    assert "records no run terms" in _one_error_line(refused)
    assert env.log_bytes() == before
    script = env.script("a.json", [{"text": "continued"}])
    proc = env.dsh(
        "resume", "clean", "again", "--model", f"scripted:{script}", *flags, config=env.config
    )
    assert proc.returncode == 0, proc.stderr
    assert "records no run terms (it predates them); assuming model scripted:" in proc.stderr
    (assumed,) = _terms(env.events("clean"))
    assert assumed["data"]["reason"] == "assumed" and assumed["ignorable"] is True


def _deferred(env: Env) -> tuple[str, Path]:
    first = env.script(
        "first.json",
        [
            {
                "tool_calls": [
                    {
                        "id": "call-touch",
                        "name": "bash",
                        "arguments": {"command": "touch made-here", "description": "Create a file"},
                    }
                ]
            },
            {"text": "never reached by the first process"},
        ],
    )
    run = env.dsh(
        "run",
        "--workspace",
        str(env.workspace),
        "--model",
        f"scripted:{first}",
        "--sandbox",
        "read-only",
        "--approval",
        "defer",
        "--json",
        "make a file",
        config=env.config,
    )
    assert run.returncode == 4, run.stdout + run.stderr
    return json.loads(run.stdout.splitlines()[-1])["sessionId"], env.script(
        "second.json", [{"text": "decided"}]
    )


def test_an_approval_is_bound_to_its_context(tmp_path: Path) -> None:
    """The ask records its context; `approvals list` shows the mode; a decision under another
    composition (named with --config, so the runner lets it continue) is refused, and a
    decision recorded in the asked context is not applied in another one: the call is asked
    again (here nobody can answer, so it fails closed) and does not run."""
    env = Env(tmp_path)
    session_id, second = _deferred(env)
    (asked,) = [e for e in env.events(session_id) if e["type"] == "approval/asked"]
    context = {
        k: asked["data"][k] for k in ("sandboxMode", "network", "toolDigest", "compositionDigest")
    }
    assert context["sandboxMode"] == "read-only" and context["network"] == "deny"
    listing = env.dsh("approvals", "list", config=env.config)
    assert "asked under: sandbox read-only, network deny" in listing.stdout

    other = tmp_path / "other.yml"
    other.write_text(
        env.config.read_text().replace(
            "- id: repeat-tool-reminder\n  name: repeat-tool-reminder\n", ""
        )
    )
    before = env.events(session_id)
    refused = env.dsh(
        "approvals",
        "decide",
        session_id,
        "call-touch",
        "allow",
        "--model",
        f"scripted:{second}",
        config=other,
    )
    assert refused.returncode == 2
    assert "the context changed since it was asked (the composition changed)" in (
        _one_error_line(refused)
    )
    # refused after the session was opened for write and the explicit --config logged (the
    # context is the terms in force): the resume marker DSH writes on every resume and the
    # override, no decision, no result
    after = env.events(session_id)
    assert after[: len(before)] == before
    assert [e["type"] for e in after[len(before) :]] == ["session/end-seed", "run/terms"]

    decided = env.dsh(
        "approvals", "decide", session_id, "call-touch", "allow", "--no-continue", config=env.config
    )
    assert decided.returncode == 0, decided.stderr
    (decision,) = [e for e in env.events(session_id) if e["type"] == "approval/decided"]
    assert {k: decision["data"][k] for k in context} == context
    moved = env.dsh(
        "approvals", "continue", session_id, "--model", f"scripted:{second}", config=other
    )
    # Before: the call was asked again inline (and, nobody answering, failed closed with a
    # result). Now it waits again, for a person to decide in the new context (D22).
    assert moved.returncode == 4, moved.stdout + moved.stderr
    assert not (env.workspace / "made-here").exists()
    events = env.events(session_id)
    again = [e for e in events if e["type"] == "approval/asked"][-1]
    assert again["seq"] > decision["seq"] and "the context changed" in again["data"]["reason"]
    assert again["data"]["compositionDigest"] != context["compositionDigest"]
    assert [e for e in events if e["type"] == "tool/result"] == []  # it did not run
    assert [e for e in events if e["type"] == "approval/decided"] == [decision]  # nobody asked
    assert not [e for e in events[events.index(decision) :] if e["type"] == "assistant/message"]
    (end,) = [e for e in events if e["type"] == "turn/end"][-1:]
    assert end["data"]["reason"]["kind"] == "awaiting-approval"
    listing = env.dsh("approvals", "list", config=other)
    assert listing.returncode == 0 and again["data"]["callId"] in listing.stdout, listing.stdout
    decided_again = env.dsh(
        "approvals", "decide", session_id, again["data"]["callId"], "allow", config=other
    )
    assert decided_again.returncode == 0, decided_again.stdout + decided_again.stderr
    events = env.events(session_id)
    (result,) = [e for e in events if e["type"] == "tool/result"]
    # run once, under the recorded read-only sandbox: the file could not be made
    assert "Read-only file system" in json.dumps(result["data"]["message"]["content"]), result
    assert not (env.workspace / "made-here").exists()
    _dsh_admits(events)
