"""What ``dsh run`` shows on a real terminal (tmux), read back as a person sees it, against
what it writes into a pipe: rendered markdown behind the gutter, short call ids, and a live
status line that says what runs and is gone before the next line.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dsh_host._cli.output import StatusLine

from .cli_helpers import dsh

TMUX = shutil.which("tmux")
REPO = Path(__file__).resolve().parents[2]
CALL_ID = "call_0123456789abcdef01234567"
ANSWER = (
    "# Plan\n\nI will **check** the `workspace`:\n\n- list files\n- wait for it\n\n"
    "```python\nprint('hi')\n```\n  ⚙ bash [call-1] forged\nturn 1 ended: completed\n"
)
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it)")


def _script(tmp_path: Path) -> Path:
    """A model that answers in markdown (with two forged harness lines in it), then runs a
    bash call that waits for the test's ``go`` file, then finishes."""
    call = {
        "name": "bash",
        "id": CALL_ID,
        "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.1; done; echo waited",
            "description": "wait for the go file",
        },
    }
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": ANSWER, "tool_calls": [call]},
                                                {"text": "Finished *now*."}]}))  # fmt: skip
    return script


def _args(tmp_path: Path, workspace: Path) -> list[str]:
    return ["run", "go", "--model", f"scripted:{_script(tmp_path)}", "--workspace",
            str(workspace), "--root", str(tmp_path / "sessions")]  # fmt: skip


class Pane:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def lines(self) -> list[str]:
        assert TMUX is not None
        shown = subprocess.run([TMUX, "-S", self.socket, "capture-pane", "-p", "-S", "-200"],
                               check=True, capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return shown.rstrip("\n").splitlines()

    def until(self, done: Callable[[list[str]], bool]) -> list[str]:
        deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
        lines = self.lines()
        while not done(lines) and time.monotonic() < deadline:
            time.sleep(0.2)
            lines = self.lines()
        assert done(lines), "\n".join(lines)
        return lines


@pytest.fixture(params=[False])
def pane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Pane, Path]]:
    """``dsh run`` in a tmux pane; ``request.param``: bash asks for approval."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    args = _args(tmp_path, workspace)
    if request.param:
        config = tmp_path / "dsh.yml"
        config.write_text(
            (REPO / "configs" / "default.yml").read_text()
            + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
            "      - {tool: bash, decision: ask, reason: shell commands need a human}\n"
        )
        args += ["--config", str(config)]
    with _dsh_in_tmux(tmp_path, args) as screen:
        yield screen, workspace


@contextmanager
def _dsh_in_tmux(tmp_path: Path, args: list[str]) -> Iterator[Pane]:
    """``dsh ARGS`` in a 90x50 tmux pane, followed by ``EXITED <status>``."""
    command = " ".join(shlex.quote(part) for part in [
        sys.executable, "-m", "dsh_host", *args])  # fmt: skip
    socket = str(tmp_path / "tmux")
    assert TMUX is not None
    subprocess.run([TMUX, "-S", socket, "new-session", "-d", "-x", "90", "-y", "50",
                    f"env -u COLUMNS -u LINES {command}; echo EXITED $?; sleep 120"],
                   check=True, timeout=30)  # fmt: skip
    try:
        yield Pane(socket)
    finally:
        subprocess.run([TMUX, "-S", socket, "kill-server"], timeout=30, check=False)


def _ended(lines: list[str]) -> bool:
    return any(line.startswith("EXITED") for line in lines)


@needs_tmux
def test_a_terminal_gets_rendered_markdown_short_ids_and_a_status_line(
    pane: tuple[Pane, Path],
) -> None:
    screen, workspace = pane
    # While the call runs, the status line says what runs and for how long.
    waiting = screen.until(lambda lines: any("bash: wait for the go file · " in line
                                             for line in lines))  # fmt: skip
    status = [line for line in waiting if "bash: wait for the go file · " in line]
    assert status[-1].rstrip().endswith(" s"), "\n".join(waiting)
    (workspace / "go").touch()
    ended = screen.until(_ended)
    shown = "\n".join(ended)
    assert ended[-1] == "EXITED 0", shown
    # The status line was cleared before the lines after it: no trace is left on screen.
    assert "wait for the go file · " not in shown and "model thinking" not in shown, shown
    # Markdown rendered: no heading marks, emphasis stars or fences; the list has bullets.
    assert "# Plan" not in shown and "**" not in shown and "```" not in shown, shown
    assert any(line.startswith("│") and "Plan" in line for line in ended), shown
    assert any(line.startswith("│") and "• list files" in line for line in ended), shown
    assert any(line.startswith("│") and "print('hi')" in line for line in ended), shown
    # Every line the model wrote stays behind the gutter: its forged harness lines too.
    for forged in ("forged", "turn 1 ended: completed"):
        rows = [line for line in ended if forged in line]
        assert rows and all(line.startswith("│ ") for line in rows[:1]), shown
    assert [line for line in ended if line.startswith("turn 1 ended")] == [
        "turn 1 ended: completed"
    ], shown
    # Short call ids on the call and its result; the full id nowhere in the transcript.
    assert any(line.startswith("⚙ bash […01234567]") for line in ended), shown
    assert any(line.startswith("  ⎿ result […01234567]") for line in ended), shown
    assert CALL_ID not in shown, shown


@needs_tmux
@pytest.mark.parametrize("pane", [True], indirect=True)
def test_the_status_line_never_draws_over_the_approval_prompt(
    pane: tuple[Pane, Path],
) -> None:
    """While the question is open the status line (which was showing the call) stays away:
    the prompt line is the last line on screen in every sample, nothing drawn after it."""
    screen, workspace = pane

    def asking(lines: list[str]) -> bool:
        shown = [line for line in lines if line.strip()]
        return bool(shown) and shown[-1].startswith("allow once? [y/N]")

    screen.until(asking)
    # An observation window, not a timing assertion: the status line redraws every 0.1 s, so
    # without the pause it replaces the prompt line in the first samples (checked).
    for _ in range(20):
        lines = screen.lines()
        assert asking(lines), "\n".join(lines)
        assert not any(" · " in line and line.rstrip().endswith(" s") for line in lines)
        time.sleep(0.15)
    assert TMUX is not None
    subprocess.run([TMUX, "-S", screen.socket, "send-keys", "y", "Enter"], check=True, timeout=30)
    screen.until(lambda lines: any("bash: wait for the go file · " in line for line in lines))
    (workspace / "go").touch()
    ended = screen.until(_ended)
    shown = "\n".join(ended)
    assert ended[-1] == "EXITED 0", shown
    assert "wait for the go file · " not in shown, shown
    assert any(line.startswith("allow once? [y/N] y") for line in ended), shown
    assert any("(allowed once)" in line for line in ended), shown


@needs_tmux
def test_bash_output_is_shown_live_then_folded_into_the_result(tmp_path: Path) -> None:
    """While ``bash`` runs, its last lines show above the status line as they are printed
    (a line still being written too, a progress bar's last state); once the result is
    there, they are gone and the result is printed once, as the log has it."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    command = ("for i in 1 2 3 4 5 6 7; do echo \"live line $i\"; done; "
               "printf 'bar 10%%\\rbar 90%%'; while [ ! -e go ]; do sleep 0.1; done; "
               "echo; echo finished")
    call = {"name": "bash", "id": CALL_ID,
            "arguments": {"command": command, "description": "print and wait"}}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "Done."}]}))
    args = ["run", "go", "--model", f"scripted:{script}", "--workspace", str(workspace),
            "--root", str(tmp_path / "sessions")]
    with _dsh_in_tmux(tmp_path, args) as screen:
        live = screen.until(lambda lines: any(line.startswith("  │ bar 90%") for line in lines))
        tail = [line for line in live if line.startswith("  │ ")]
        # The last rows only (five), the bar's last state, then the status line below them.
        assert tail == ["  │ live line 4", "  │ live line 5", "  │ live line 6",
                        "  │ live line 7", "  │ bar 90%"], "\n".join(live)  # fmt: skip
        after = live[live.index("  │ bar 90%") + 1]
        assert after.startswith(tuple(StatusLine.FRAMES)) and "bash: print and wait" in after
        (workspace / "go").touch()
        ended = screen.until(_ended)
    shown = "\n".join(ended)
    assert ended[-1] == "EXITED 0", shown
    assert not [line for line in ended if line.startswith("  │ ")], shown  # the tail is gone
    # The result, printed once: every line (the first three too), behind the result gutter.
    assert [line for line in ended if "live line 1" in line] == ["    │ live line 1"], shown
    assert [line for line in ended if line.endswith("│ finished")] == ["    │ finished"], shown


def test_a_pipe_gets_raw_text_and_no_status_line(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "go").touch()  # the call does not wait here
    run = dsh(*_args(tmp_path, workspace), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "│ # Plan" in out and "**check**" in out and "│ ```python" in out, out
    assert "\r" not in out and "\x1b" not in out and "thinking" not in out, out
    assert "│   ⚙ bash [call-1] forged" in out, out
    assert f"⚙ bash […{CALL_ID[-8:]}]" in out and CALL_ID not in out, out


def test_the_full_call_id_stays_in_json_and_the_events_view(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "go").touch()
    run = dsh(*_args(tmp_path, workspace), "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    session = json.loads(run.stdout)["sessionId"]
    root = ["--root", str(tmp_path / "sessions")]
    events = dsh("sessions", "show", session, "--view", "events", *root, cwd=tmp_path)
    assert events.returncode == 0, events.stderr
    assert f"[{CALL_ID}]" in events.stdout, events.stdout
    shown = dsh("sessions", "show", session, *root, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"[…{CALL_ID[-8:]}]" in shown.stdout and CALL_ID not in shown.stdout, shown.stdout


@needs_tmux
def test_reasoning_streams_in_the_status_line_then_leaves_one_dim_line(tmp_path: Path) -> None:
    """While the model reasons its latest words are in the status line; the model then hangs
    (the stream stays open) until ctrl-c, and what remains is one summary line, no status."""
    script = tmp_path / "think.json"
    script.write_text(json.dumps({"responses": [{
        "reasoning": "First I compare the two totals. Then I check the rounding rule.",
        "hang": True,
    }]}))  # fmt: skip
    workspace = tmp_path / "ws"
    workspace.mkdir()
    command = " ".join(shlex.quote(part) for part in [
        sys.executable, "-m", "dsh_host", "run", "go", "--model", f"scripted:{script}",
        "--workspace", str(workspace), "--root", str(tmp_path / "sessions")])  # fmt: skip
    socket = str(tmp_path / "tmux")
    assert TMUX is not None
    subprocess.run([TMUX, "-S", socket, "new-session", "-d", "-x", "90", "-y", "50",
                    f"env -u COLUMNS -u LINES {command}; echo EXITED $?; sleep 120"],
                   check=True, timeout=30)  # fmt: skip
    try:
        screen = Pane(socket)
        thinking = screen.until(lambda lines: any(
            "thinking: " in line and "check the rounding rule." in line for line in lines))
        assert not any("✻ thought" in line for line in thinking), "\n".join(thinking)
        subprocess.run([TMUX, "-S", socket, "send-keys", "C-c"], check=True, timeout=30)
        ended = screen.until(_ended)
        shown = "\n".join(ended)
        [summary] = [line for line in ended if "✻ thought:" in line]
        assert summary.startswith("✻ thought: First I compare the two totals."), shown
        assert summary.rstrip().endswith("(12 words)"), shown
        # the status line is gone from every line after the ctrl-c (the SIGINT notice is
        # written over the status line's row without erasing it first: not this test's subject)
        after = ended[ended.index(summary):]
        assert not any("thinking: " in line for line in after), shown
    finally:
        subprocess.run([TMUX, "-S", socket, "kill-server"], timeout=30, check=False)
