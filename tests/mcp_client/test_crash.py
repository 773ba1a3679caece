"""SIGKILL of the harness while an MCP tool body is in flight (issue 21).

The real ``dsh run`` runs a composition with an ``mcp-client`` row; the scripted model calls a
server tool that takes a minute. The harness is killed mid-call, then ``dsh resume`` repairs the
session: the call's ``tool/call`` was durable before the request was sent (checkpoint policy), so
the closer on disk is ``TOOL_OUTCOME_UNKNOWN`` — never a retry, never "not started".
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .mcp_helpers import FIXTURE, dsh, everything_stdio, needs_everything
from .test_pipeline import composition, events_of, tool_results

pytestmark = pytest.mark.slow


def _run_and_kill(
    tmp_path: Path, mcp: dict[str, Any], tool: str, arguments: dict[str, Any], ready: Any
) -> tuple[Path, str, list[str]]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    root = tmp_path / "sessions"
    config = composition(tmp_path, workspace, mcp)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": tool, "arguments": arguments}]},
        {"text": "never reached"},
    ]}))
    session = "mcp-crash"
    harness = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "go", "--config", str(config),
         "--model", f"scripted:{script}", "--workspace", str(workspace), "--root", str(root),
         "--session", session, "--new", "--json"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120  # a bound for a slow machine, not a timing assertion
        while not ready(root, session):
            assert harness.poll() is None, harness.communicate()
            assert time.monotonic() < deadline, "the call never got under way"
            time.sleep(0.2)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    return root, session, ["--config", str(config)]


def _call_durable(tmp_path: Path) -> Any:
    def ready(root: Path, session: str) -> bool:
        if not root.exists():
            return False
        shown = dsh("sessions", "show", session, "--root", str(root), "--view", "events",
                    "--json", cwd=tmp_path)
        return shown.returncode == 0 and '"type": "tool/call"' in shown.stdout.replace(
            '"type":"tool/call"', '"type": "tool/call"')
    return ready


def _resume_and_check(
    tmp_path: Path, root: Path, session: str, options: list[str], call_id: str
) -> None:
    resumed = dsh("resume", session, "--root", str(root), *options, "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    closers = json.loads(resumed.stdout)["closers"]
    assert [(c["callId"], c["code"]) for c in closers if c["type"] == "tool/result"] == [
        (call_id, "TOOL_OUTCOME_UNKNOWN")
    ]
    events = events_of(tmp_path, root, session)
    code, _text = tool_results(events)[call_id]
    assert code == "TOOL_OUTCOME_UNKNOWN"
    assert [e["type"] for e in events].count("tool/call") == 1  # recorded once, never retried
    assert dsh("sessions", "verify", session, "--root", str(root), cwd=tmp_path).returncode == 0


@needs_everything
def test_sigkill_mid_call_to_server_everything_repairs_as_outcome_unknown(
    tmp_path: Path,
) -> None:
    everything = everything_stdio(command=shutil.which("node"), toolCallTimeoutMs=600_000)
    durable = _call_durable(tmp_path)
    root, session, options = _run_and_kill(
        tmp_path, everything, "mcp__everything__trigger-long-running-operation",
        {"duration": 60, "steps": 60}, durable,
    )
    _resume_and_check(tmp_path, root, session, options, "call_1_1")


def test_sigkill_while_the_server_runs_the_call_repairs_as_outcome_unknown(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "ws"
    marks.mkdir()
    fixture = {"serverName": "fixture", "transport": "stdio", "command": sys.executable,
               "args": [FIXTURE], "env": {"MARK_DIR": str(marks)},
               "sandbox": "workspace-write", "toolCallTimeoutMs": 600_000}
    started = marks / "started-call_1_1"  # the server has the call, with its id in _meta
    root, session, options = _run_and_kill(
        tmp_path, fixture, "mcp__fixture__sleep", {"seconds": 60},
        lambda _root, _session: started.exists(),
    )
    _resume_and_check(tmp_path, root, session, options, "call_1_1")
