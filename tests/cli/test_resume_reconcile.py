"""``dsh resume`` reconciles a call a SIGKILL left outcome-unknown (D26), end to end: a plugin
named in the composition registers a ``@tool(reconcile=...)``; ``dsh run`` is killed inside its
body after the effect; ``dsh resume --json`` reports the reconciler's verdict and the log records
it. Real processes, the JSONL store and SQLite (configs/sqlite.yml)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .cli_helpers import REPO, dsh, json_lines

PLUGIN = textwrap.dedent('''
    import os, time
    from pathlib import Path
    from dsh_host import Plugin, ToolContext, tool
    from dsh_host._tools import Done, NotDone, Unknown

    LEDGER = os.environ["TRANSFER_LEDGER"]

    def find(ctx: ToolContext, to: str):
        if not os.path.exists(LEDGER):
            return Unknown("the ledger cannot be read")
        for line in Path(LEDGER).read_text().splitlines():
            if line.split()[0] == ctx.idempotency_key:
                return Done(f"transferred to {to}")
        return NotDone()

    @tool(reconcile=find)
    def transfer(ctx: ToolContext, to: str, cents: int) -> str:
        """Transfer money once per idempotency key."""
        with open(LEDGER, "a") as out:
            out.write(f"{ctx.idempotency_key} {to} {cents}\\n")
            out.flush()
            os.fsync(out.fileno())
        ready = os.environ.get("TRANSFER_READY")
        if ready:
            Path(ready).write_text("ready")
            time.sleep(600)  # the test SIGKILLs dsh here
        return f"transferred to {to}"

    class Transfer(Plugin):
        name = "transfer"
        inject = ("tools",)

        def apply(self, ctx, config):
            ctx.tools.register(transfer.definition, owner=ctx)
''')

CALL = {"tool_calls": [{"name": "transfer", "arguments": {"to": "bob", "cents": 5},
                        "id": "pay-1"}]}  # fmt: skip


@pytest.mark.parametrize("base", ["default.yml", "sqlite.yml"])
def test_dsh_resume_reports_and_records_the_reconciled_verdict(
    tmp_path: Path, base: str
) -> None:
    (tmp_path / "transfer_plugin.py").write_text(PLUGIN)
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / base).read_text()
                      + "\n- name: transfer_plugin:Transfer\n")  # fmt: skip
    workspace, root = tmp_path / "ws", tmp_path / "store"
    workspace.mkdir()
    ledger, ready = tmp_path / "ledger.txt", tmp_path / "ready"
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [CALL, {"text": "never"}]}))
    flags = ["--config", str(config), "--root", str(root)]
    env = {**os.environ, "TRANSFER_LEDGER": str(ledger), "TRANSFER_READY": str(ready),
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    env.pop("DSH_SESSION_ROOT", None)
    child = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "pay bob", "--session", "pay", "--new",
         "--model", f"scripted:{script}", "--workspace", str(workspace), *flags],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), child.communicate(timeout=60)[1] if child.poll() is not None else ""
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.wait(timeout=60)
        if child.stderr is not None:
            child.stderr.close()
    assert len(ledger.read_text().splitlines()) == 1  # the transfer happened once
    resumed = dsh("resume", "pay", "--json", *flags, cwd=tmp_path,
                  env={"TRANSFER_LEDGER": str(ledger), "PYTHONPATH": env["PYTHONPATH"]})  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    payload = json.loads(resumed.stdout)
    # the call is answered by what the reconciler found; repair closes only the turn
    assert [c["type"] for c in payload["closers"]] == ["step/end", "turn/end"]
    assert payload["reconciled"] == [
        {"callId": "pay-1", "tool": "transfer", "verdict": "done", "detail": None}
    ]
    shown = dsh("sessions", "show", "pay", "--view", "events", "--json", *flags, cwd=tmp_path,
                env={"TRANSFER_LEDGER": str(ledger), "PYTHONPATH": env["PYTHONPATH"]})  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    events = json_lines(shown.stdout)
    (marker,) = [e for e in events if e["type"] == "tool/reconciled"]
    assert marker["data"]["verdict"] == "done" and marker["ignorable"] is True
    (result,) = [e for e in events if e["type"] == "tool/result"]
    assert "error" not in result["data"] and result["seq"] == marker["seq"] + 1
    assert len(ledger.read_text().splitlines()) == 1  # nothing ran the body again
