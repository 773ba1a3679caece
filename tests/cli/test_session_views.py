"""``dsh sessions show``: every view (transcript, model, events; text and JSON) of a stored
session holding every event type the loop writes, through the real ``dsh``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .cli_helpers import dsh

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rich_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A stored session with every event type the loop writes: prompt, system message,
    runtime-context snapshot, request header/context, text, tool calls and results, an
    approval asked and decided (unavailable: no terminal), an error result, turn ends."""
    tmp = tmp_path_factory.mktemp("rich")
    workspace = tmp / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    config = tmp / "composition.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        + "      - {tool: write_file, decision: ask, reason: writes need a human}\n"
    )
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Looking.", "tool_calls": [
            {"name": "read_file", "id": "c-read", "arguments": {"path": "notes.txt"}},
            {"name": "bash", "id": "c-bash",
             "arguments": {"command": "echo hi; exit 3", "description": "x"}},
            {"name": "write_file", "id": "c-write",
             "arguments": {"path": "out.txt", "content": "x"}},
        ]},
        {"text": "Done."},
    ]}))  # fmt: skip
    root = tmp / "sessions"
    result = dsh(
        "run", "go", "--model", f"scripted:{script}", "--workspace", str(workspace),
        "--root", str(root), "--config", str(config), "--json", cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp, root, json.loads(result.stdout)["sessionId"]


@pytest.mark.parametrize("view", ["transcript", "model", "events"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_every_view_of_a_session_with_every_event_type(
    rich_session: tuple[Path, Path, str], view: str, as_json: bool
) -> None:
    tmp, root, session_id = rich_session
    args = ["sessions", "show", session_id, "--root", str(root), "--view", view]
    result = dsh(*args, *(["--json"] if as_json else []), cwd=tmp)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    if as_json:
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        assert lines
        if view == "events":
            kinds = {line["type"] for line in lines}
            assert {"approval/asked", "approval/decided", "tool/call", "tool/result",
                    "request/header", "turn/end"} <= kinds  # fmt: skip
    else:
        assert "c-write" in result.stdout or view == "model"
