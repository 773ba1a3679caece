"""A user's mistakes at the command line, through the real ``dsh``: no traceback, one
``dsh: error:`` line with exit 2 (or the documented code), nothing written or lost; and the two
things every command line owes (``--version``, a reader that closes the pipe early).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .cli_helpers import dsh


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsh: error: "), result.stderr
    return lines[0]


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
