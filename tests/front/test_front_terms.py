"""Run terms through the front door: ``Agent(...)`` records them, ``Agent.resume`` obeys them, and
the ``dsh`` command continues an Agent's session under them (a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh_host import Agent

from .front_helpers import script

pytestmark = pytest.mark.both_backends

TOUCH = [
    {
        "tool_calls": [
            {
                "id": "c-touch",
                "name": "bash",
                "arguments": {"command": "touch made-here", "description": "x"},
            }
        ]
    },
    {"text": "tried"},
]


def _logs(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("session.v3.jsonl*"))}


def _dsh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg-config")}
    env.pop("DSH_SESSION_ROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.anyio
async def test_resume_under_another_sandbox_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Before: `Agent(sandbox="workspace-write").resume(id)` of a read-only session ran its
    calls under workspace-write."""
    from dsh_host._front.runner import TermsRefused

    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    kw: dict[str, Any] = {"store": root, "workspace": workspace}
    async with Agent(script(tmp_path, [{"text": "hi"}]), sandbox="read-only", **kw) as agent:
        session_id = (await agent.run("hello")).session_id
        (terms,) = [e for e in agent.session.events if e.type == "run/terms"]
        assert terms.ignorable is True and terms.data.sandbox.mode == "read-only"
        assert terms.data.by == "Agent" and terms.data.workspace == str(workspace)
    before = _logs(root)
    async with Agent(
        script(tmp_path, TOUCH, "touch.json"), sandbox="workspace-write", **kw
    ) as agent:
        with pytest.raises(TermsRefused, match="sandbox read-only, network deny"):
            await agent.resume(session_id)
    assert _logs(root) == before
    async with Agent(script(tmp_path, TOUCH, "touch.json"), sandbox="read-only", **kw) as agent:
        await agent.resume(session_id)
        await agent.run("make a file")
        override = [e for e in agent.session.events if e.type == "run/terms"][-1]
        assert override.data.reason == "override" and override.data.changed == ("model",)
    assert not (workspace / "made-here").exists()


@pytest.mark.anyio
async def test_dsh_continues_an_agent_session_under_its_terms(tmp_path: Path) -> None:
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    async with Agent(
        script(tmp_path, [{"text": "hi"}]), sandbox="read-only", store=root, workspace=workspace
    ) as agent:
        session_id = (await agent.run("hello")).session_id
    touch = script(tmp_path, TOUCH, "touch.json")
    proc = await _to_thread(
        "resume",
        session_id,
        "make a file",
        "--model",
        touch,
        "--root",
        str(root),
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["finalText"] == "tried"
    assert not (workspace / "made-here").exists()  # read-only, as recorded


async def _to_thread(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import anyio

    return await anyio.to_thread.run_sync(lambda: _dsh(*args, cwd=cwd))


@pytest.mark.anyio
async def test_dsh_resume_repairs_a_session_stored_inside_its_workspace(tmp_path: Path) -> None:
    """Before: `dsh resume ID` refused to boot (the store overlaps the recorded workspace),
    though a repair runs no tool."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    root = workspace / ".sessions"
    async with Agent(script(tmp_path, [{"text": "hi"}]), store=root, workspace=workspace) as agent:
        session_id = (await agent.run("hello")).session_id
    proc = await _to_thread("resume", session_id, "--root", str(root), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["closers"] == []
