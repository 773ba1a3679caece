"""Skills and command hooks through ``dsh serve``: real HTTP on loopback, the shipped default
composition (which composes both rows), a scripted model, real sandboxed bash and hooks.

The model reads the skill catalog (runtime context), loads the skill with the ``skill`` tool,
then asks for ``rm -rf``: the user's ``PreToolUse`` hook denies it, the model reads the reason,
and the ledger the call would write stays empty. The control runs the same call without the
hook and the ledger is written. (Python guardrails are objects on a front-door ``Agent``; a
served composition has no way to carry one, so serve cannot exercise them.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .harness import running_server

pytestmark = [pytest.mark.anyio]

DENY_RM = (
    "input=$(cat); case \"$input\" in *'rm -rf'*) "
    "echo 'destructive command refused: rm -rf is not allowed here' >&2; exit 2;; esac; exit 0"
)
RM = "echo ran >> ledger; rm -rf victim"


def _user_hooks(command: str) -> None:
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "dsh" / "hooks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    hook = {"type": "command", "command": command, "timeout": 20}
    path.write_text(json.dumps({"hooks": {"PreToolUse": [{"matcher": "bash", "hooks": [hook]}]}}))


def _skill(workspace: Path) -> None:
    skill = workspace / ".claude" / "skills" / "release-notes"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: release-notes\ndescription: Write release notes from the git log.\n---\n\n"
        "RELEASE-BODY: read the log first.\n"
    )


def _responses() -> list[Any]:
    def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [{"id": call_id, "name": name, "arguments": arguments}]}

    return [
        call("skill-1", "skill", {"name": "release-notes"}),
        call("rm-1", "bash", {"command": RM, "description": "clean up"}),
        {"text": "done"},
    ]


def _results(events: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for event in events:
        if event["type"] == "tool/result":
            message = event["data"]["message"]
            (block,) = message["content"]
            out[message["source"]["callId"]] = json.dumps(block["content"])
    return out


async def test_serve_lists_and_loads_a_skill_and_a_hook_denies_rm_rf(tmp_path: Path) -> None:
    _user_hooks(DENY_RM)
    async with running_server(tmp_path, _responses()) as server:
        _skill(server.workspace)
        (server.workspace / "victim").mkdir()
        session_id = await server.create()
        turn = await server.turn(session_id, "write the release notes, then clean up")
        session = await server.wait_turn_end(session_id, turn)
        assert session["lastTurnEnd"]["kind"] == "completed", session
        events = await server.events(session_id)
    assert server.ledger() == []  # the rm -rf call never ran
    assert (server.workspace / "victim").is_dir()
    results = _results(events)
    assert "RELEASE-BODY" in results["skill-1"]  # loaded whole on request
    assert "rm -rf is not allowed here" in results["rm-1"]  # the model reads why
    catalog = json.dumps(
        [e for e in events if e["type"] == "user/message" and e["data"]["source"]["kind"] != "user"]
    )
    assert "release-notes" in catalog and "Write release notes from the git log." in catalog
    assert "RELEASE-BODY" not in catalog  # the catalog holds the description only
    verdicts = [e["data"] for e in events if e["type"] == "hook/result"]
    assert [v["decision"] for v in verdicts] == ["deny"]


async def test_control_without_the_hook_the_call_runs_through_serve(tmp_path: Path) -> None:
    async with running_server(tmp_path, _responses()) as server:
        _skill(server.workspace)
        (server.workspace / "victim").mkdir()
        session_id = await server.create()
        turn = await server.turn(session_id, "write the release notes, then clean up")
        session = await server.wait_turn_end(session_id, turn)
        # the default serve composition asks before bash: approve it through the API
        assert session["status"] == "awaiting-approval", session
        decided = await server.client.post(
            f"/sessions/{session_id}/approvals/rm-1", json={"decision": "allow"}
        )
        assert decided.status_code == 200, decided.text
        session = await server.wait_turn_end(session_id, decided.json()["turn"])
        assert session["lastTurnEnd"]["kind"] == "completed", session
    assert server.ledger() == ["ran"]
    assert not (server.workspace / "victim").exists()
