"""``dsh sessions show ID --json``: the session as it happened, one JSON document (turns,
prompts, calls with arguments, approvals, results, times, usage), not the model's messages."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import REPO, dsh

RULE = (
    "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
    "      - {tool: bash, decision: ask, reason: shell commands need a human}\n"
)


def test_show_json_is_the_transcript_as_data(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello\n")
    config = tmp_path / "dsh.yml"
    config.write_text((REPO / "configs" / "default.yml").read_text() + RULE)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Reading.", "tool_calls": [
            {"name": "read_file", "arguments": {"path": "a.txt"}},
            {"name": "bash", "arguments": {"command": "rm a.txt", "description": "remove it"}}]},
        {"text": "All **done**."}]}))  # fmt: skip
    root = ["--root", str(tmp_path / "sessions")]
    ran = dsh("run", "tidy up", "--config", str(config), "--model", f"scripted:{script}",
              "--workspace", str(workspace), "--approval", "never", "--json", *root,
              cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    session = json.loads(ran.stdout)["sessionId"]
    shown = dsh("sessions", "show", session, "--json", *root, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)  # one document
    assert document["sessionId"] == session and document["title"] == "tidy up"
    [turn] = document["turns"]
    assert (turn["turn"], turn["prompt"], turn["answer"], turn["steps"]) == (
        1, "tidy up", "All **done**.", 2)
    assert turn["end"]["kind"] == "completed" and turn["durationMs"] >= 0
    assert turn["endedAt"] - turn["startedAt"] == turn["durationMs"]
    read, bash = turn["calls"]
    assert read["name"] == "read_file" and read["arguments"] == {"path": "a.txt"}
    assert "hello" in read["result"]["text"] and not read["result"]["isError"]
    assert read["approval"] is None and read["durationMs"] >= 0
    assert bash["arguments"]["command"] == "rm a.txt"
    assert bash["approval"]["reason"] == "shell commands need a human"
    assert bash["approval"].get("outcome") == "rejected", bash
    assert bash["result"]["isError"]
    assert (workspace / "a.txt").exists()
    assert document["usage"]["requests"] == 2 and turn["usage"]["requests"] == 2
    # The transcript shows read_file's answer as a person reads it, not the model's tags.
    text = dsh("sessions", "show", session, *root, cwd=tmp_path)
    assert "<content>" not in text.stdout and "<path>" not in text.stdout, text.stdout
    assert "│ a.txt" in text.stdout and "│ 1: hello" in text.stdout, text.stdout
    # The other views are unchanged: the model's messages, the log's events.
    model = dsh("sessions", "show", session, "--view", "model", "--json", *root, cwd=tmp_path)
    assert all("role" in json.loads(line) for line in model.stdout.splitlines())
