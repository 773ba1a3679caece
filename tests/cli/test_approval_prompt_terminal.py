"""The approval prompt appears below the transcript on a real terminal (tmux), not over it.

The prompt resets the scroll region first (output before it may have set one); that reset also
moved the cursor home, so the box landed over older output at the top of the screen and the
rest of the turn overwrote the screen from the top. The pane is read back as a person sees it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it)")
REPO = Path(__file__).resolve().parents[2]


def _until(pane: Callable[[], list[str]], done: Callable[[list[str]], bool]) -> list[str]:
    deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
    lines = pane()
    while not done(lines) and time.monotonic() < deadline:
        time.sleep(0.2)
        lines = pane()
    assert done(lines), "\n".join(lines)
    return lines


def test_the_prompt_lands_where_the_transcript_stopped(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    script = tmp_path / "script.json"
    call = {
        "name": "bash",
        "id": "call-1",
        "arguments": {"command": "echo ran > ran.txt", "description": "leave a marker"},
    }
    script.write_text(json.dumps({"responses": [{"text": "Working.", "tool_calls": [call]},
                                                {"text": "Finished."}]}))  # fmt: skip
    config = tmp_path / "dsh.yml"  # the shipped composition, with bash asked for approval
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        "      - {tool: bash, decision: ask, reason: shell commands need a human}\n"
    )
    dsh = " ".join(shlex.quote(part) for part in [
        sys.executable, "-m", "dsh_host", "run", "go", "--model", f"scripted:{script}",
        "--config", str(config), "--workspace", str(workspace),
        "--root", str(tmp_path / "sessions")])  # fmt: skip
    # 60 lines of earlier output fill the screen and scroll: the prompt must come after them.
    command = f"seq 1 60; env -u COLUMNS -u LINES {dsh}; echo EXITED $?; sleep 120"
    socket = str(tmp_path / "tmux")
    assert TMUX is not None
    subprocess.run([TMUX, "-S", socket, "new-session", "-d", "-x", "100", "-y", "24", command],
                   check=True, timeout=30)  # fmt: skip

    def pane() -> list[str]:
        shown = subprocess.run([TMUX, "-S", socket, "capture-pane", "-p"], check=True,
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return shown.rstrip("\n").splitlines()

    try:
        asking = _until(pane, lambda lines: any("allow once? [y/N]" in line for line in lines))
        prompt_row = max(i for i, line in enumerate(asking) if "allow once? [y/N]" in line)
        assert all(not line.strip() for line in asking[prompt_row + 1 :]), "\n".join(asking)
        # Above the prompt: the call it asks about, and above that the earlier output, intact.
        assert any("leave a marker" in line or "echo ran" in line for line in asking[:prompt_row])
        assert asking[0].strip().isdigit(), "\n".join(asking)  # the screen top is seq's output
        subprocess.run([TMUX, "-S", socket, "send-keys", "y", "Enter"], check=True, timeout=30)
        ended = _until(pane, lambda lines: any(line.startswith("EXITED") for line in lines))
        answered = max(i for i, line in enumerate(ended) if "allow once? [y/N]" in line)
        exited = max(i for i, line in enumerate(ended) if line.startswith("EXITED"))
        assert ended[exited] == "EXITED 0", "\n".join(ended)
        assert any("Finished." in line for line in ended[answered:exited]), "\n".join(ended)
    finally:
        subprocess.run([TMUX, "-S", socket, "kill-server"], timeout=30, check=False)
    assert (workspace / "ran.txt").read_text() == "ran\n"
