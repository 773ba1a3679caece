"""One writer per session, seen from the command line: a second ``dsh`` on a held session is
refused (exit 3) before it prints any repair, ``sessions verify`` names the holder, and once the
holder is gone ``resume`` repairs the session (the control)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dsh_host.sdk import lock_holder

from .cli_helpers import dsh


def test_a_second_writer_is_refused_before_it_shows_any_repair(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    root = tmp_path / "sessions"
    script = tmp_path / "script.json"
    call = {"name": "bash", "id": "c-sleep",
            "arguments": {"command": "sleep 120", "description": "hold the session"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "done"}]}))
    common = ("--root", str(root), "--model", f"scripted:{script}")
    writer = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "go", "--session", "held", "--new", *common],
        cwd=workspace, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # The writer holds the lock once its tool call is on disk (the call is flushed first).
        deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
        while lock_holder_of(root, "held") != writer.pid:
            assert writer.poll() is None and time.monotonic() < deadline, "writer never held it"
            time.sleep(0.1)
        held = f"held by a live writer (pid {writer.pid})"
        for args in (("resume", "held"), ("run", "again", "--session", "held")):
            second = dsh(*args, *common, cwd=workspace)
            assert second.returncode == 3, second.stderr
            assert "repair" not in second.stdout, second.stdout  # nothing it did not do
            assert held in second.stderr and "Traceback" not in second.stderr
        verify = dsh("sessions", "verify", "held", "--root", str(root), cwd=workspace)
        assert verify.returncode == 3, verify.stdout + verify.stderr
        assert held in verify.stdout and "dsh resume" not in verify.stdout
        as_json = dsh("sessions", "verify", "held", "--root", str(root), "--json", cwd=workspace)
        assert json.loads(as_json.stdout)["heldBy"] == held
    finally:
        writer.kill()
        writer.wait(timeout=60)
    # The control: with the writer gone the same session is recoverable and resume repairs it.
    verify = dsh("sessions", "verify", "held", "--root", str(root), cwd=workspace)
    assert verify.returncode == 1 and "dsh resume held" in verify.stdout, verify.stdout
    resumed = dsh("resume", "held", "--root", str(root), cwd=workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert "repair: c-sleep OUTCOME_UNKNOWN" in resumed.stdout


def lock_holder_of(root: Path, session_id: str) -> int | None:
    locks = list(root.glob(f"*/{session_id}/session.lock"))
    return lock_holder(str(locks[0])) if locks else None
