"""``dsh run`` end to end: a ``tool-rules`` row asks for ``bash`` and nobody can answer.

Real processes, real files: the shipped default composition plus one
``tool-rules`` row, a scripted model that calls ``bash`` to create a marker
file, and stdin that is not a terminal (``/dev/null``) or closed outright.
The call must end ``unavailable``, be audited in the stored log, and the
command must not run (the marker never appears).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DSH = [sys.executable, "-m", "dsh_host._cli.main"]
ROOT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yml"
UNAVAILABLE = 'Error: tool "bash" requires approval, but no approval channel is available'


def compose(tmp_path: Path, *, answer_text: bool = True) -> tuple[Path, Path, Path, Path]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = workspace / "marker"
    config = tmp_path / "dsh.yml"
    config.write_text(
        ROOT_CONFIG.read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        + "      - {tool: bash, decision: ask, reason: shell commands need a human}\n"
    )
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "responses": [
                    {
                        "tool_calls": [
                            {
                                "id": "call-touch",
                                "name": "bash",
                                "arguments": {
                                    "command": f"touch {marker}",
                                    "description": "Create the marker file",
                                },
                            }
                        ]
                    },
                    {"text": "The call was not approved."},
                ]
            }
        )
    )
    return config, script, workspace, marker


def stored_events(config: Path, root: Path, session_id: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [*DSH, "sessions", "show", session_id, "--config", str(config), "--root", str(root),
         "--view", "events", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("stdin", ["devnull", "closed"])
def test_dsh_run_without_a_tty_fails_the_ask_closed(tmp_path: Path, stdin: str) -> None:
    config, script, workspace, marker = compose(tmp_path)
    root = tmp_path / "sessions"
    argv = [
        *DSH, "run", "--config", str(config), "--root", str(root), "--workspace", str(workspace),
        "--model", f"scripted:{script}", "--sandbox", "danger-full-access", "--json",
        "create the marker",
    ]
    if stdin == "closed":
        # The shell closes descriptor 0 before exec: stdin does not exist at all.
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" 0<&-', "sh", *argv],
            capture_output=True, text=True, timeout=300, check=False,
        )
    else:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["turnEnd"] == {"kind": "completed"}
    assert "allow once?" not in proc.stdout + proc.stderr  # nobody was prompted

    # The body never ran: even under danger-full-access the command did not execute.
    assert not marker.exists()

    events = stored_events(config, root, summary["sessionId"])
    kinds = [e["type"] for e in events]
    call = kinds.index("tool/call")
    asked, decided, result = call + 1, call + 2, call + 3
    assert kinds[asked] == "approval/asked"
    assert kinds[decided] == "approval/decided"
    assert kinds[result] == "tool/result"
    asked_data = events[asked]["data"]
    assert asked_data["toolName"] == "bash"
    assert asked_data["callId"] == "call-touch"
    assert asked_data["reason"] == "shell commands need a human"
    assert events[decided]["data"] == {"id": asked_data["id"], "outcome": "unavailable"}
    message = events[result]["data"]["message"]
    block = message["content"][0]
    assert block["toolCallId"] == "call-touch"
    assert block["isError"] is True
    assert block["content"] == [{"type": "text", "text": UNAVAILABLE}]


def run_on_a_terminal(tmp_path: Path, keys: bytes) -> tuple[int, str, Path, Path, Path]:
    """``dsh run`` on a pseudo-terminal; ``keys`` are typed at the ``allow once?`` prompt.

    Returns the exit code, everything the terminal showed, and the config, root and marker.
    """
    import os
    import pty
    import select

    config, script, workspace, marker = compose(tmp_path)
    root = tmp_path / "sessions"
    argv = [
        *DSH, "run", "--config", str(config), "--root", str(root), "--workspace", str(workspace),
        "--model", f"scripted:{script}", "--sandbox", "danger-full-access", "--json",
        "create the marker",
    ]  # fmt: skip
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)
    seen = bytearray()
    typed = False
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 300)
            assert ready, f"dsh run hung; output so far: {bytes(seen)!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            seen += chunk
            if not typed and b"allow once? [y/N]" in seen:
                os.write(master, keys)
                typed = True
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(master)
    output = seen.decode("utf-8", "replace")
    assert typed, output
    return os.waitstatus_to_exitcode(status), output, config, root, marker


def summary_of(output: str) -> dict[str, object]:
    line = next(line for line in reversed(output.splitlines()) if line.startswith("{"))
    parsed: dict[str, object] = json.loads(line)
    return parsed


@pytest.mark.parametrize(("keys", "outcome"), [(b"y\n", "allowed-once"), (b"n\n", "rejected")])
def test_dsh_run_on_a_terminal_asks_allow_once(tmp_path: Path, keys: bytes, outcome: str) -> None:
    """The same run on a pseudo-terminal: the prompt appears, y runs the command, n does not."""
    code, output, config, root, marker = run_on_a_terminal(tmp_path, keys)
    assert code == 0, output
    assert "call id:   call-touch" in output
    assert f"touch {marker}" in output  # the logged arguments were shown
    assert marker.exists() is (outcome == "allowed-once")
    events = stored_events(config, root, str(summary_of(output)["sessionId"]))
    decided = [e for e in events if e["type"] == "approval/decided"]
    assert [d["data"]["outcome"] for d in decided] == [outcome]


def test_ctrl_c_at_the_approval_prompt_cancels_the_turn(tmp_path: Path) -> None:
    """Ctrl-C typed at ``allow once? [y/N]`` cancels the whole turn (D18): the ask is
    cancelled, the command never runs, the turn ends ``aborted`` and dsh exits 130. (Before:
    only the ask was cancelled, the turn went on and dsh exited 0 "completed".)"""
    code, output, config, root, marker = run_on_a_terminal(tmp_path, b"\x03")  # ^C: SIGINT
    assert code == 130, output
    assert "Traceback" not in output
    assert not marker.exists()
    summary = summary_of(output)
    assert summary["turnEnd"] == {"kind": "aborted"}
    events = stored_events(config, root, str(summary["sessionId"]))
    decided = [e["data"]["outcome"] for e in events if e["type"] == "approval/decided"]
    assert decided == ["cancelled"]
    results = [e["data"] for e in events if e["type"] == "tool/result"]
    assert [r["error"]["code"] for r in results] == ["ABORTED_BEFORE_DISPATCH"]
    assert [e["type"] for e in events].count("assistant/message") == 1  # no second request
