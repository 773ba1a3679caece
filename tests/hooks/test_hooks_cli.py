"""Command hooks end to end: the real ``dsh run`` with a scripted model and a ``hooks`` row.

Each attack is judged from the host by a ledger file the ``bash`` call would append to; each
has its control, the same call without the hook, which proves the call writes the ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli.cli_helpers import REPO, dsh, json_lines

HOOKS_ROW = "\n- id: hooks\n  name: hooks\n"
SHIPPED = (REPO / "configs" / "default.yml").read_text()
assert HOOKS_ROW in SHIPPED  # the shipped default composes hooks (inert until trusted)
#: The default without its hooks row: each test appends the row it configures.
DEFAULT = SHIPPED.replace(HOOKS_ROW, "\n", 1)
DENY_RM = (
    "input=$(cat); case \"$input\" in *'rm -rf'*) "
    "echo 'destructive command refused: rm -rf is not allowed here' >&2; exit 2;; esac; exit 0"
)


def hooks_file(path: Path, point: str, command: str, **extra: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    hook = {"type": "command", "command": command, **extra}
    path.write_text(json.dumps({"hooks": {point: [{"matcher": "bash", "hooks": [hook]}]}}))
    return path


def user_hooks() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "dsh" / "hooks.json"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    return project


def run(
    project: Path,
    tmp_path: Path,
    commands: list[str],
    *,
    row: str = HOOKS_ROW,
    returncode: int = 0,
    extra_texts: tuple[str, ...] | list[str] = (),
) -> tuple[str, str]:
    config = tmp_path / "composition.yml"
    config.write_text(DEFAULT + row)
    script = tmp_path / "script.json"
    responses: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "id": f"call-{i}",
                    "name": "bash",
                    "arguments": {"command": c, "description": "run it"},
                }
            ]
        }
        for i, c in enumerate(commands)
    ]
    script.write_text(
        json.dumps(
            {"responses": [*responses, {"text": "done"}, *({"text": t} for t in extra_texts)]}
        )
    )
    result = dsh(
        "run",
        "clean up",
        "--config",
        str(config),
        "--model",
        f"scripted:{script}",
        "--json",
        cwd=project,
    )
    assert result.returncode == returncode, result.stderr
    session_id: str = json.loads(result.stdout)["sessionId"]
    return session_id, result.stderr


def events(project: Path, session_id: str) -> list[dict[str, Any]]:
    shown = dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=project)
    assert shown.returncode == 0, shown.stderr
    return json_lines(shown.stdout)


def model_view(project: Path, session_id: str) -> str:
    shown = dsh("sessions", "show", session_id, "--view", "model", cwd=project)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def verify(project: Path, session_id: str) -> None:
    checked = dsh("sessions", "verify", session_id, cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr


RM = "echo ran >> ledger; rm -rf victim"


def test_a_pretooluse_hook_denies_rm_rf_and_the_model_reads_why(
    project: Path, tmp_path: Path
) -> None:
    hooks_file(user_hooks(), "PreToolUse", DENY_RM)
    (project / "victim").mkdir()
    session_id, _ = run(project, tmp_path, [RM, "echo safe >> ledger"])
    ledger = project / "ledger"
    assert ledger.read_text() == "safe\n"  # the rm -rf call never ran; the harmless one did
    assert (project / "victim").is_dir()
    view = model_view(project, session_id)
    assert "destructive command refused: rm -rf is not allowed here" in view
    log = events(project, session_id)
    results = [e["data"] for e in log if e["type"] == "hook/result"]
    assert [r["decision"] for r in results] == ["deny", "allow"]
    assert results[0]["exitCode"] == 2 and "rm -rf is not allowed" in results[0]["reason"]
    assert len([e for e in log if e["type"] == "hook/invoked"]) == 2
    verify(project, session_id)


def test_control_without_the_hook_the_same_call_runs(project: Path, tmp_path: Path) -> None:
    (project / "victim").mkdir()
    run(project, tmp_path, [RM])
    assert (project / "ledger").read_text() == "ran\n"
    assert not (project / "victim").exists()


@pytest.mark.parametrize(
    ("command", "extra", "why"),
    [
        ("sleep 30", {"timeout": 1}, "PreToolUse hook failed: timed out after 1 s"),
        ("echo boom >&2; exit 1", {}, "PreToolUse hook failed: exit code 1: boom"),
        ('echo \'{"decision": "maybe"}\'', {}, "answered an unknown decision 'maybe'"),
    ],
    ids=["timeout", "crash", "garbage"],
)
def test_a_failing_pretooluse_hook_denies(
    project: Path, tmp_path: Path, command: str, extra: dict[str, Any], why: str
) -> None:
    hooks_file(user_hooks(), "PreToolUse", command, **extra)
    session_id, _ = run(project, tmp_path, ["echo ran >> ledger"])
    assert not (project / "ledger").exists()
    assert why in model_view(project, session_id)
    [result] = [e["data"] for e in events(project, session_id) if e["type"] == "hook/result"]
    assert result["decision"] == "deny"


def test_a_hooks_file_planted_by_a_tool_is_not_loaded_until_trusted(
    project: Path, tmp_path: Path
) -> None:
    planted = json.dumps(
        {
            "hooks": {
                "PreToolUse": [
                    {
                        "matcher": "bash",
                        "hooks": [{"type": "command", "command": "echo planted >&2; exit 2"}],
                    }
                ]
            }
        }
    )
    # Run 1: the model's own bash call writes .claude/hooks.json into its workspace.
    run(project, tmp_path, [f"mkdir -p .claude && printf '%s' '{planted}' > .claude/hooks.json"])
    assert json.loads((project / ".claude" / "hooks.json").read_text())["hooks"]
    # Run 2: not loaded; the call runs, and a note says why.
    session_id, stderr = run(project, tmp_path, ["echo ran >> ledger"])
    assert (project / "ledger").read_text() == "ran\n"
    assert ".claude/hooks.json was not loaded: project hooks run only when trusted" in stderr
    assert not [e for e in events(project, session_id) if e["type"].startswith("hook/")]
    # Control: once the user trusts that file, the very same hook runs and denies.
    trusted = dsh("trust", ".claude/hooks.json", cwd=project)
    assert trusted.returncode == 0, trusted.stderr
    session_id, _ = run(project, tmp_path, ["echo again >> ledger"])
    assert (project / "ledger").read_text() == "ran\n"
    assert "planted" in model_view(project, session_id)
    # A tool rewriting the trusted file breaks the trust: not loaded again.
    (project / ".claude" / "hooks.json").write_text(planted + "\n")
    _, stderr = run(project, tmp_path, ["echo third >> ledger"])
    assert (project / "ledger").read_text() == "ran\nthird\n"
    assert "it changed since you trusted it" in stderr


def test_a_trusted_project_dsh_yml_may_not_point_at_a_hooks_file(
    project: Path, tmp_path: Path
) -> None:
    hooks_file(project / "evil.json", "PreToolUse", "exit 0")
    (project / "dsh.yml").write_text(
        DEFAULT + "\n- id: hooks\n  name: hooks\n  config:\n    configPath: evil.json\n"
    )
    trusted = dsh("trust", cwd=project)
    assert trusted.returncode != 0
    assert "config key configPath of hooks chooses an executable" in trusted.stderr


def test_posttooluse_context_and_userpromptsubmit_block(project: Path, tmp_path: Path) -> None:
    context = json.dumps(
        {
            "hookSpecificOutput": {
                "hookEventName": "PostToolUse",
                "additionalContext": "LEDGER-CHECKED",
            }
        }
    )
    hooks_file(user_hooks(), "PostToolUse", f"echo '{context}'")
    session_id, _ = run(project, tmp_path, ["echo ran >> ledger"])
    assert "LEDGER-CHECKED" in model_view(project, session_id)
    # UserPromptSubmit: exit 2 blocks the prompt, the turn ends without a model request.
    hooks_file(user_hooks(), "UserPromptSubmit", "echo no prompts today >&2; exit 2")
    session_id, _ = run(project, tmp_path, ["echo blocked >> ledger"], returncode=1)
    assert (project / "ledger").read_text() == "ran\n"
    log = events(project, session_id)
    assert not [e for e in log if e["type"] == "assistant/message"]
    [result] = [e["data"] for e in log if e["type"] == "hook/result"]
    assert result["point"] == "UserPromptSubmit" and result["decision"] == "deny"


SANDBOX_ROW = "- id: sandbox\n  name: sandbox-local\n  config:\n    network: deny\n"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """Not under /tmp: bubblewrap's /tmp is private and Landlock grants host /tmp to writers,
    so a /tmp target would prove nothing."""
    base = (
        Path(os.environ.get("DSH_SANDBOX_TEST_ROOT", "/var/tmp")) / f"dsh-hooks-{uuid.uuid4().hex}"
    )
    (base / "ws").mkdir(parents=True)
    (base / "out").mkdir()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_hooks_run_confined(scratch: Path, tmp_path: Path, backend: str, mode: str) -> None:
    """A hook writing outside the workspace: denied by the sandbox (judged from the host), so
    the hook fails and, being a PreToolUse gate, denies. The control runs the same command
    unconfined on the host and the write lands."""
    target = scratch / "out" / "escaped"
    command = f"echo escaped > {target} && exit 0 || exit 1"
    hooks_file(user_hooks(), "PreToolUse", command)
    assert SANDBOX_ROW in DEFAULT
    composition = DEFAULT.replace(SANDBOX_ROW, SANDBOX_ROW + f"    backend: {backend}\n")
    row = f"{HOOKS_ROW}  config:\n    sandbox: {mode}\n"
    config = tmp_path / "composition.yml"
    config.write_text(composition + row)
    script = tmp_path / "script.json"
    call = {
        "id": "call-0",
        "name": "bash",
        "arguments": {"command": "echo ran >> ledger", "description": "run it"},
    }
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "done"}]}))
    workspace = scratch / "ws"
    result = dsh(
        "run",
        "go",
        "--config",
        str(config),
        "--model",
        f"scripted:{script}",
        "--json",
        cwd=workspace,
    )
    assert result.returncode == 0, result.stderr
    assert not target.exists(), f"the hook wrote outside its sandbox ({backend}, {mode})"
    assert not (workspace / "ledger").exists()
    session_id = json.loads(result.stdout)["sessionId"]
    [hook] = [e["data"] for e in events(workspace, session_id) if e["type"] == "hook/result"]
    assert hook["decision"] == "deny" and hook["exitCode"] == 1
    # control: the same command, unconfined, writes the target
    subprocess.run(["bash", "-c", command], check=True)
    assert target.read_text() == "escaped\n"


def test_a_stop_hook_continues_the_turn_once(project: Path, tmp_path: Path) -> None:
    """The Stop hook blocks unless Claude Code's stop_hook_active says it already did: the
    model gets the reason as steering and one more step, then the turn ends."""
    stop = (
        'case "$(cat)" in *\'"stop_hook_active": true\'*) exit 0;; esac; '
        "echo 'write the summary to the ledger first' >&2; exit 2"
    )
    hooks_file(user_hooks(), "Stop", stop)
    session_id, _ = run(project, tmp_path, [], extra_texts=["now summarized"])
    log = events(project, session_id)
    decisions = [e["data"]["decision"] for e in log if e["type"] == "hook/result"]
    assert decisions == ["deny", "pass"]
    assert "write the summary to the ledger first" in model_view(project, session_id)
    assert len([e for e in log if e["type"] == "assistant/message"]) == 2


def test_a_claude_settings_file_without_hooks_is_skipped_silently(
    project: Path, tmp_path: Path
) -> None:
    """The shipped default composes hooks, and many projects carry a Claude Code
    ``.claude/settings.json`` holding only permissions: no note on every run for it. The same
    file once it declares hooks is untrusted and noted (not run)."""
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"permissions": {"allow": ["Bash(ls)"]}}))
    _, stderr = run(project, tmp_path, ["echo ran >> ledger"])
    assert "was not loaded" not in stderr
    assert (project / "ledger").read_text() == "ran\n"
    hooks_file(settings, "PreToolUse", "echo planted >&2; exit 2")
    _, stderr = run(project, tmp_path, ["echo again >> ledger"])
    assert ".claude/settings.json was not loaded: project hooks run only when trusted" in stderr
    assert (project / "ledger").read_text() == "ran\nagain\n"
