"""Continuing a session runs its tools where the session works, not where dsh was started.

A session records its workspace (the header's ``cwd``). ``dsh run --session ID`` and
``dsh resume ID PROMPT`` restore it; ``--workspace`` overrides it (``dsh resume`` now has
``--workspace``, ``--approval`` and ``--sandbox`` as ``dsh run`` has). Before: both ran the
tools in the current directory, and ``dsh resume`` rejected the flags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh_host._loader import Row, open_host
from dsh_host._session.events import event_to_builtins

from .cli_helpers import copy_fixture_root, dsh


def script(path: Path, *responses: dict[str, Any]) -> str:
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


PWD = {
    "tool_calls": [
        {"id": "call-pwd", "name": "bash",
         "arguments": {"command": "pwd > where.txt", "description": "say where"}}
    ]
}


def first_session(tmp_path: Path, workspace: Path, root: Path) -> str:
    model = script(tmp_path / "first.json", {"text": "First answer."})
    done = dsh("run", "--root", str(root), "--workspace", str(workspace), "--model", model,
               "--json", "first question", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    session_id: str = json.loads(done.stdout.splitlines()[-1])["sessionId"]
    return session_id


def test_run_session_continues_in_the_recorded_workspace(tmp_path: Path) -> None:
    root, first_ws, elsewhere = tmp_path / "sessions", tmp_path / "first-ws", tmp_path / "cwd"
    first_ws.mkdir()
    elsewhere.mkdir()
    session_id = first_session(tmp_path, first_ws, root)
    model = script(tmp_path / "second.json", PWD, {"text": "Noted."})
    done = dsh("run", "--root", str(root), "--session", session_id, "--model", model,
               "--sandbox", "danger-full-access", "--json", "where are you?", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert (first_ws / "where.txt").read_text().strip() == str(first_ws)
    assert not (elsewhere / "where.txt").exists()


def test_resume_takes_workspace_approval_and_sandbox_flags(tmp_path: Path) -> None:
    root, first_ws, other_ws = tmp_path / "sessions", tmp_path / "first-ws", tmp_path / "other"
    first_ws.mkdir()
    other_ws.mkdir()
    session_id = first_session(tmp_path, first_ws, root)
    model = script(tmp_path / "second.json", PWD, {"text": "Noted."})
    done = dsh("resume", session_id, "where now?", "--root", str(root), "--model", model,
               "--workspace", str(other_ws), "--approval", "never",
               "--sandbox", "danger-full-access", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (other_ws / "where.txt").read_text().strip() == str(other_ws)  # the override won
    assert not (first_ws / "where.txt").exists()


def test_a_recorded_workspace_that_is_gone_is_a_clear_error(tmp_path: Path) -> None:
    root, first_ws = tmp_path / "sessions", tmp_path / "first-ws"
    first_ws.mkdir()
    session_id = first_session(tmp_path, first_ws, root)
    first_ws.rmdir()
    model = script(tmp_path / "second.json", {"text": "Noted."})
    done = dsh("run", "--root", str(root), "--session", session_id, "--model", model, "again",
               cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert f"the session's recorded workspace {first_ws}: no such directory" in line
    assert "--workspace DIR" in line
    # A repair alone runs no tool: it does not need the workspace.
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    assert dsh("resume", session_id, "--root", str(root), cwd=elsewhere).returncode == 0


@pytest.mark.anyio
async def test_agent_repairs_are_the_closers_the_resume_appended(tmp_path: Path) -> None:
    """``dsh resume`` prints ``agent.repairs``: exactly the events the resume wrote (before,
    it printed closers from a separate read made before it took ownership)."""
    root = copy_fixture_root(tmp_path)
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-scripted", config={"responses": []}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with open_host(rows) as host:
        resumed = await host.ctx.agent.resume("tool-missing-result")
        stored = await host.ctx.get("sessionPersistence").read_from(
            "tool-missing-result", resumed.repairs[0].seq
        )
        assert [event_to_builtins(e) for e in resumed.repairs] == [
            event_to_builtins(e) for e in stored
        ]
        codes = [e.data.error.code for e in resumed.repairs if e.type == "tool/result"]
        assert codes == ["TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"]
        await resumed.aclose()
    async with open_host(rows) as host:
        again = await host.ctx.agent.resume("tool-missing-result")
        assert again.repairs == ()  # balanced now: nothing more appended
        await again.aclose()


def test_model_flag_keeps_the_configured_openai_compatible_row(tmp_path: Path) -> None:
    """``--model openai-compatible:M`` on a composition with its own ``llm-openai-compatible``
    row uses that row as configured (its endpoint, key variable and route) and replaces only
    the model name. Before, the row was swapped for a bare one aimed at the default endpoint."""

    from llm.sse_server import SseServer, sse, text_events

    from .cli_helpers import REPO

    work = tmp_path / "ws"
    work.mkdir()
    with SseServer([sse(text_events("Hello ", "from my endpoint."))]) as server:
        config = tmp_path / "dsh.yml"
        config.write_text(
            (REPO / "configs" / "default.yml").read_text()
            + "\n- id: my-endpoint\n  name: llm-openai-compatible\n  config:\n"
            f"    base_url: {server.url}\n    api_key_env: MY_KEY\n    provider: my-route\n"
            "    model: configured-model\n"
        )
        done = dsh("run", "hi", "--config", str(config), "--workspace", str(work),
                   "--root", str(tmp_path / "sessions"), "--model", "openai-compatible:chosen",
                   "--json", cwd=tmp_path, env={"MY_KEY": "k", "DEEPSEEK_API_KEY": ""})
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finalText"] == "Hello from my endpoint."
    [request] = requests
    assert request.body["model"] == "chosen"


def test_the_shipped_prompt_names_the_workspace_tools_and_call_id(tmp_path: Path) -> None:
    """A real model is told where it works, what its tools do there and how to key an effect
    (on the call's idempotency key; before: only the one-line harness identity, then a key built
    from the call id, which providers repeat)."""
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    session_id = first_session(tmp_path, workspace, root)
    shown = dsh("sessions", "show", session_id, "--root", str(root), "--view", "model", "--json",
                cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    system = json.loads(shown.stdout.splitlines()[0])
    assert system["role"] == "system"
    text = "".join(block["text"] for block in system["content"])
    assert f"You work in the workspace {workspace}." in text
    assert "read_file, write_file, edit_file, glob" in text
    assert "$DSH_IDEMPOTENCY_KEY" in text and "$DSH_CALL_ID" not in text
