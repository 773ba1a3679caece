"""What a newcomer trips over first (issue 18): every case runs the real ``dsh``.

No traceback for a user mistake, one ``dsh: error:`` line with exit 2 (or the documented
code), and nothing written or lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .cli_helpers import dsh

REPO = Path(__file__).resolve().parents[2]


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsh: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def rich_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A stored session with every event type the loop writes: prompt, system message,
    runtime-context snapshot, request header/context, text, tool calls and results, an
    approval asked and decided (unavailable: no terminal), an error result, turn ends."""
    tmp = tmp_path_factory.mktemp("rich")
    workspace = tmp / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    config = tmp / "composition.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        + "      - {tool: write_file, decision: ask, reason: writes need a human}\n"
    )
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Looking.", "tool_calls": [
            {"name": "read_file", "id": "c-read", "arguments": {"path": "notes.txt"}},
            {"name": "bash", "id": "c-bash",
             "arguments": {"command": "echo hi; exit 3", "description": "x"}},
            {"name": "write_file", "id": "c-write",
             "arguments": {"path": "out.txt", "content": "x"}},
        ]},
        {"text": "Done."},
    ]}))  # fmt: skip
    root = tmp / "sessions"
    result = dsh(
        "run", "go", "--model", f"scripted:{script}", "--workspace", str(workspace),
        "--root", str(root), "--config", str(config), "--json", cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp, root, json.loads(result.stdout)["sessionId"]


@pytest.mark.parametrize("view", ["transcript", "model", "events"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_every_view_of_a_session_with_every_event_type(
    rich_session: tuple[Path, Path, str], view: str, as_json: bool
) -> None:
    tmp, root, session_id = rich_session
    args = ["sessions", "show", session_id, "--root", str(root), "--view", view]
    result = dsh(*args, *(["--json"] if as_json else []), cwd=tmp)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    if as_json:
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        assert lines
        if view == "events":
            kinds = {line["type"] for line in lines}
            assert {"approval/asked", "approval/decided", "tool/call", "tool/result",
                    "request/header", "turn/end"} <= kinds  # fmt: skip
    else:
        assert "c-write" in result.stdout or view == "model"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("resume", ""), "session id must be a non-empty string"),
        (("sessions", "show", ""), "session id must be a non-empty string"),
        (("sessions", "show", "a" * 300), "too long to be stored as a directory name"),
        (("run", "--session", "b" * 300), "too long to be stored as a directory name"),
        (("run", "--workspace", "/etc/passwd"), "--workspace /etc/passwd: not a directory"),
        (("run", "--workspace", "missing-dir"), "pass --create-workspace"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    cwd = tmp_path / "cwd"  # beside the session root, not above it (D15)
    cwd.mkdir()
    line = one_line_error(dsh(*args, "--root", str(tmp_path / "sessions"), cwd=cwd))
    assert needle in line
    assert not (cwd / "missing-dir").exists()


def test_create_workspace_is_explicit(tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = dsh(
        "run", "--workspace", "new-ws", "--create-workspace", "--root", str(tmp_path / "s"),
        "--json", cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (cwd / "new-ws").is_dir()


def test_a_root_that_is_not_a_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = dsh("run", "--root", str(tmp_path / "file" / "sessions"), cwd=cwd)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert f'session root "{tmp_path / "file" / "sessions"}"' in result.stderr


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dsh_host", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout.startswith("dsh 0.")


def test_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    # More output than a pipe buffers (64 KiB), so the writer really meets a closed pipe.
    script = tmp_path / "big.json"
    call = {"name": "bash", "arguments": {"command": "head -c 60000 /dev/zero | tr '\\0' x",
                                          "description": "x"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call] * 6}, {"text": "ok"}]}))
    root = tmp_path / "sessions"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    made = dsh(
        "run", "go", "--model", f"scripted:{script}", "--workspace", str(workspace),
        "--root", str(root), "--json", cwd=workspace,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    session_id = json.loads(made.stdout)["sessionId"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "sessions", "show", session_id, "--root", str(root),
         "--view", "events", "--json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err
