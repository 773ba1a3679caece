"""`dsh sessions list` on a real terminal (tmux) of 80, 100 and 120 columns: one line a session.

At 80 columns the old table showed the id, the title and six empty columns; at 100-120 it wrapped
each row over four or five lines. The pane is read back as a person sees it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it)")

LONG_TITLE = "Summarise every TODO in this repository and group them by owner and by urgency"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three stored sessions: a long title, a short one, and a CJK one (two cells a character)."""
    tmp = tmp_path_factory.mktemp("listing")
    (tmp / "ws").mkdir()
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    for prompt in (LONG_TITLE, "hi", "整理这个仓库里的所有待办事项并按负责人分组"):
        done = subprocess.run(
            [sys.executable, "-m", "dsh_host", "run", prompt, "--model", f"scripted:{script}",
             "--root", str(tmp / "sessions"), "--workspace", str(tmp / "ws"), "--json"],
            cwd=tmp, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return tmp / "sessions"


def _pane(root: Path, columns: int, tmp: Path) -> list[str]:
    socket = str(tmp / f"tmux-{columns}")
    done = tmp / f"done-{columns}"
    command = (
        f"env -u COLUMNS -u LINES {shlex.quote(sys.executable)} -m dsh_host sessions list --fresh "
        f"--root {shlex.quote(str(root))}; touch {shlex.quote(str(done))}; sleep 60"
    )
    assert TMUX is not None
    subprocess.run([TMUX, "-S", socket, "new-session", "-d", "-x", str(columns), "-y", "30",
                    command], check=True, timeout=30)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.exists(), "dsh sessions list did not finish in the pane"
        shown = subprocess.run([TMUX, "-S", socket, "capture-pane", "-p"], check=True,
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    finally:
        subprocess.run([TMUX, "-S", socket, "kill-server"], timeout=30, check=False)
    return [line for line in shown.splitlines() if line.strip()]


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_one_line_a_session_at_every_width(root: Path, tmp_path: Path, columns: int) -> None:
    lines = _pane(root, columns, tmp_path)
    assert lines[0].split()[:4] == ["id", "when", "last", "turn"], lines
    rows = lines[1:]
    assert len(rows) == 3, "\n".join(lines)  # a wrapped row would add lines
    for row in rows:
        session_id, _when, last_turn, *_ = row.split()
        assert list(root.glob(f"*/{session_id}")), row
        assert last_turn == "completed", row
    assert any(row.endswith("…") and "Summarise every TODO" in row for row in rows)
    if columns >= 100:
        assert "events" in lines[0]
    else:
        assert "events" not in lines[0] and "cwd" not in lines[0]
