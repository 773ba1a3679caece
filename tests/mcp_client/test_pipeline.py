"""MCP calls go through the ordinary tool pipeline (issue 21): the call's idempotency key and id
reach the server, tool rules and approval apply to ``mcp__*`` names, annotations decide
concurrency and approval, and a whole ``dsh run`` drives a real server end to end."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsh_host import Row

from .mcp_helpers import (
    FIXTURE,
    call,
    dsh,
    everything_stdio,
    fixture_stdio,
    mcp_host,
    needs_everything,
    text_of,
)

pytestmark = pytest.mark.both_backends

REPO = Path(__file__).resolve().parents[2]


def key_of(session_id: str, call_id: str) -> str:
    """The call's idempotency key: a digest of its session id (empty outside one) and id."""
    scope = f"{len(session_id)}:{session_id}:{call_id}"
    return "dsh-" + hashlib.sha256(scope.encode()).hexdigest()[:32]


async def test_call_id_reaches_the_server_in_meta(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio()) as host:
        first = await call(host, "mcp__fixture__whoami", {}, call_id="call-abc")
        second = await call(host, "mcp__fixture__whoami", {}, call_id="call-def")
    assert json.loads(text_of(first))["meta"] == {"dsh/callId": "call-abc",
                                                  "dsh/idempotencyKey": key_of("", "call-abc")}
    assert json.loads(text_of(second))["meta"] == {"dsh/callId": "call-def",
                                                   "dsh/idempotencyKey": key_of("", "call-def")}


async def test_tool_rules_apply_to_mcp_names(anyio_backend: str) -> None:
    rules = Row(
        name="tool-rules",
        config={"rules": [{"tool": "mcp__fixture__write_*", "decision": "deny"}]},
    )
    async with mcp_host(fixture_stdio(), extra_rows=(rules,)) as host:
        denied = await call(host, "mcp__fixture__write_file", {"path": "/tmp/never-written"})
        allowed = await call(host, "mcp__fixture__whoami", {})
    assert denied.is_error
    assert text_of(denied) == 'Error: tool "mcp__fixture__write_file" is denied by tool-rules'
    assert not allowed.is_error


async def test_destructive_hint_asks_for_approval(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio()) as host:  # no approval service: an ask fails closed
        asked = await call(host, "mcp__fixture__wipe", {})
        plain = await call(host, "mcp__fixture__whoami", {})
    # the ask's reason, as the runtime refuses an ask it cannot put to anybody
    assert text_of(asked) == 'Error: MCP server "fixture" marks this tool destructive (destructiveHint)'

    assert not plain.is_error


async def test_destructive_approval_can_be_turned_off(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio(askDestructive=False)) as host:
        result = await call(host, "mcp__fixture__wipe", {})
    assert text_of(result) == "wiped"


def composition(tmp_path: Path, workspace: Path, *mcp_rows: dict[str, Any]) -> Path:
    rows = yaml.safe_load((REPO / "configs" / "default.yml").read_text())
    agent = rows.pop()  # keep the agent row last
    assert agent["name"] == "agent"
    for row in rows:
        if row["name"] == "builtin-tools":
            row["config"]["workspace"] = str(workspace)
    for index, config in enumerate(mcp_rows):
        rows.append({"id": f"mcp-{index}", "name": "mcp-client",
                     "config": {"workspace": str(workspace), **config}})
    rows.append(agent)
    path = tmp_path / "dsh-mcp.yml"
    path.write_text(yaml.safe_dump(rows))
    return path


def events_of(tmp_path: Path, root: Path, session_id: str) -> list[dict[str, Any]]:
    shown = dsh("sessions", "show", session_id, "--root", str(root), "--view", "events",
                "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


def tool_results(events: list[dict[str, Any]]) -> dict[str, tuple[str | None, str]]:
    out = {}
    for event in events:
        if event["type"] == "tool/result":
            block = event["data"]["message"]["content"][0]
            text = "".join(part.get("text", "") for part in block["content"])
            out[block["toolCallId"]] = (event["data"].get("error", {}).get("code"), text)
    return out


@needs_everything
@pytest.mark.slow
def test_dsh_run_calls_server_everything_end_to_end(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    root = tmp_path / "sessions"
    everything = everything_stdio(command=shutil.which("node"))
    fixture = {"serverName": "fixture", "transport": "stdio", "command": sys.executable,
               "args": [FIXTURE]}
    config = composition(tmp_path, workspace, everything, fixture)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [
            {"name": "mcp__everything__echo", "arguments": {"message": "hello from the model"}},
            {"name": "mcp__fixture__whoami", "arguments": {}},
            {"name": "mcp__fixture__wipe", "arguments": {}},
        ]},
        {"text": "done"},
    ]}))
    result = dsh("run", "go", "--config", str(config), "--model", f"scripted:{script}",
                 "--workspace", str(workspace), "--root", str(root), "--approval", "never",
                 "--json", cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["finalText"] == "done"
    events = events_of(tmp_path, root, summary["sessionId"])
    types = [e["type"] for e in events]
    # each call is durable before its result (the checkpoint policy flushed it first)
    assert types.index("tool/call") < types.index("tool/result")
    results = tool_results(events)
    assert results["call_1_1"] == (None, "Echo: hello from the model")
    code, text = results["call_1_2"]
    assert code is None
    assert json.loads(text)["meta"] == {
        "dsh/callId": "call_1_2",
        "dsh/sessionId": summary["sessionId"],
        "dsh/idempotencyKey": key_of(summary["sessionId"], "call_1_2"),
    }
    # destructiveHint: asked (audited), and --approval never refuses it
    assert results["call_1_3"] == (None, 'Error: the user rejected tool "mcp__fixture__wipe"')
    asked = [e["data"] for e in events if e["type"] == "approval/asked"]
    assert [(a["toolName"], a["callId"]) for a in asked] == [("mcp__fixture__wipe", "call_1_3")]
    assert asked[0]["reason"] == 'MCP server "fixture" marks this tool destructive (destructiveHint)'



def test_fail_on_startup_error_ends_the_turn_before_the_model_is_asked(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    gone = {"serverName": "gone", "transport": "stdio", "command": "/bin/false",
            "failOnStartupError": True, "reconnect": {"enabled": False}}
    config = composition(tmp_path, workspace, gone)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "never asked"}]}))
    result = dsh("run", "go", "--config", str(config), "--model", f"scripted:{script}",
                 "--workspace", str(workspace), "--root", str(tmp_path / "sessions"), "--json",
                 cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    summary = json.loads(result.stdout)
    assert summary["turnEnd"]["code"] == "MCP_STARTUP_FAILED"
    assert "startup failed and failOnStartupError is set" in summary["turnEnd"]["message"]
    assert summary["finalText"] is None
