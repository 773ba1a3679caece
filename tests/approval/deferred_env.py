"""Shared setup of the deferred-approval process tests: a composition, a workspace, scripts.

The ``deferred`` fixture (``tests/approval/conftest.py``) yields an :class:`Env` for JSONL and for
PostgreSQL (a fresh schema per test, dropped afterwards; skipped only when no server answers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from postgres.conftest import DSN, _probe, drop_schemas

REPO = Path(__file__).resolve().parents[2]
DSH = [sys.executable, "-m", "dsh_host"]
CALL = "call-ledger"
RULES = (
    "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
    "      - {tool: bash, decision: ask, reason: side effects need a human}\n"
)


@dataclass
class Env:
    """One composition (JSONL or PostgreSQL) with the ask rule, a workspace and two scripts."""

    tmp: Path
    config: Path
    root: Path
    workspace: Path
    env: dict[str, str]
    first: Path
    second: Path

    @property
    def cwd(self) -> Path:
        """Where the commands run: beside the session root, never above it (D15)."""
        work = self.tmp / "work"
        work.mkdir(exist_ok=True)
        return work

    @property
    def ledger(self) -> Path:
        return self.workspace / "ledger"

    def dsh(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DSH, *args, "--config", str(self.config), *self.root_flag()],
            cwd=self.cwd, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def root_flag(self) -> list[str]:
        return ["--root", str(self.root)] if "DSH_POSTGRES_DSN" not in self.env else []

    def run_deferred(self) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        proc = self.dsh(
            "run", "--workspace", str(self.workspace), "--model", f"scripted:{self.first}",
            "--approval", "defer", "--json", "append to the ledger",
        )
        assert proc.returncode == 4, proc.stdout + proc.stderr
        return proc, json.loads(proc.stdout.strip().splitlines()[-1])

    def events(self, session_id: str) -> list[dict[str, Any]]:
        proc = self.dsh("sessions", "show", session_id, "--view", "events", "--json")
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]

    def ledger_lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []


def ledger_call(then: str = "") -> dict[str, Any]:
    """The model's side-effecting call: append ``$DSH_CALL_ID`` to ``ledger`` (then ``then``)."""
    command = 'printf "%s\\n" "$DSH_CALL_ID" >> ledger' + then
    return {"tool_calls": [{"id": CALL, "name": "bash",
                            "arguments": {"command": command, "description": "Append to ledger"}}]}


def script(path: Path, responses: list[Any]) -> Path:
    path.write_text(json.dumps({"responses": responses}))
    return path


def make_env(tmp: Path, base: str, env: dict[str, str]) -> Env:
    workspace = tmp / "ws"
    workspace.mkdir()
    config = tmp / "dsh.yml"
    config.write_text((REPO / "configs" / base).read_text() + RULES)
    first = script(tmp / "first.json", [
        ledger_call(), {"text": "never reached by the first process"},
    ])
    second = script(tmp / "second.json", [{"text": "The ledger was updated."}])
    return Env(tmp, config, tmp / "sessions", workspace, env, first, second)


def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "jsonl":
        yield make_env(tmp_path, "default.yml", {})
        return
    problem = _probe()
    if problem is not None:
        pytest.skip(f"no PostgreSQL server answers at {DSN!r} ({problem})")
    prefix = f"dsh_t{uuid.uuid4().hex[:12]}"
    try:
        yield make_env(
            tmp_path, "postgres.yml",
            {"DSH_POSTGRES_DSN": DSN, "DSH_POSTGRES_SCHEMA": f"{prefix}_main"},
        )
    finally:
        drop_schemas(DSN, prefix)
