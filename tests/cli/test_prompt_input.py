"""Where a prompt comes from: PROMPT, '-', a pipe, --prompt-file. Every case runs the real `dsh`.

A command-line argument is capped near 128 KiB (MAX_ARG_STRLEN), so a long prompt must come
from standard input or a file; the log then holds exactly the text that was sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .cli_helpers import dsh

#: Over the kernel's 128 KiB limit for one argument: only a pipe or a file can carry it.
LONG = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(3000))


def _run(tmp: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    argv = [sys.executable, "-m", "dsh_host", "run", *args, "--model", f"scripted:{script}"]
    (tmp / "ws").mkdir(exist_ok=True)
    argv += ["--root", str(tmp / "sessions"), "--workspace", str(tmp / "ws"), "--json"]
    return subprocess.run(
        argv,
        cwd=tmp,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _prompt_in_log(tmp: Path, result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    session_id = json.loads(result.stdout)["sessionId"]
    shown = dsh("sessions", "show", session_id, "--root", str(tmp / "sessions"),
                "--view", "events", "--json", cwd=tmp)  # fmt: skip
    events = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    prompt = next(e for e in events if e["type"] == "user/message")  # the turn's own, first
    return "".join(block["text"] for block in prompt["data"]["content"])


def test_a_piped_prompt_longer_than_an_argument_reaches_the_log(tmp_path: Path) -> None:
    assert len(LONG.encode()) > 131072
    assert _prompt_in_log(tmp_path, _run(tmp_path, stdin=LONG)) == LONG.removesuffix("\n")


def test_dash_reads_standard_input(tmp_path: Path) -> None:
    assert _prompt_in_log(tmp_path, _run(tmp_path, "-", stdin="fix the build\n")) == (
        "fix the build"
    )


def test_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "task.md").write_text(LONG)
    result = _run(tmp_path, "--prompt-file", "task.md")
    assert _prompt_in_log(tmp_path, result) == LONG.removesuffix("\n")


@pytest.mark.parametrize(
    ("args", "stdin", "error"),
    [
        (["--prompt-file", "missing.md"], None,
         "dsh: error: cannot read the prompt from missing.md: No such file or directory"),
        (["-"], "  \n", "dsh: error: the prompt read from standard input is empty"),
        (["go", "--prompt-file", "task.md"], None,
         "dsh: error: give the prompt once: PROMPT or --prompt-file, not both"),
    ],
)  # fmt: skip
def test_a_prompt_that_cannot_be_read_is_one_error_line_and_no_session(
    tmp_path: Path, args: list[str], stdin: str | None, error: str
) -> None:
    (tmp_path / "task.md").write_text("x")
    result = _run(tmp_path, *args, stdin=stdin)
    assert result.returncode == 2
    assert result.stderr.strip() == error
    assert not (tmp_path / "sessions").exists()
