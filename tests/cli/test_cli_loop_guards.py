"""Loop guards through the real ``dsh`` command (issue 14 item 4): a looping model ends at the
``agent`` row's ``maxStepsPerTurn`` with exit 1 and the kind named, the timeout and repeat
guards are composed by the shipped configs, and a turn-end kind the CLI does not know is shown,
not a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import msgspec
import yaml
from dsh_repeat_tool_reminder import GENTLE_REMINDER

from dsh_host import Row, open_host
from dsh_host._session.events import register_turn_end_reason

from .cli_helpers import REPO, dsh, json_lines


def composition(tmp_path: Path, agent_config: str) -> None:
    """``dsh.yml`` = the shipped default with ``agent_config`` on the agent row (named with
    ``--config``: a ``./dsh.yml`` is never loaded implicitly, D16)."""
    rows = yaml.safe_load((REPO / "configs" / "default.yml").read_text())
    [agent] = [row for row in rows if row["name"] == "agent"]
    agent.setdefault("config", {}).update(yaml.safe_load(agent_config)["config"])
    (tmp_path / "dsh.yml").write_text(yaml.safe_dump(rows, sort_keys=False))


def looping_script(tmp_path: Path, count: int) -> Path:
    script = tmp_path / "loop.json"
    call = {"name": "read_file", "arguments": {"path": "status.txt"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}] * count}))
    return script


def test_the_shipped_compositions_compose_the_loop_guards(tmp_path: Path) -> None:
    for name in ("default", "memory", "postgres"):
        text = (REPO / "configs" / f"{name}.yml").read_text()
        assert "name: timeout-policy\n" in text and "name: repeat-tool-reminder\n" in text, name
    for name in ("default", "memory"):
        shown = dsh(
            "plugins", "--config", str(REPO / "configs" / f"{name}.yml"), "--json", cwd=tmp_path
        )
        assert shown.returncode == 0, shown.stderr
        rows = {row["name"]: row for row in json.loads(shown.stdout)["rows"]}
        assert rows["timeout-policy"]["state"] == "active"
        assert rows["repeat-tool-reminder"]["state"] == "active"
        assert rows["agent-instructions"]["state"] == "active"


def test_a_looping_model_stops_at_max_steps_per_turn_exit_1(tmp_path: Path) -> None:
    composition(tmp_path, "config:\n  maxStepsPerTurn: 4\n")
    script = looping_script(tmp_path, 50)
    run = dsh(
        "run", "wait for the status file", "--model", f"scripted:{script}", "--json",
        "--config", str(tmp_path / "dsh.yml"), cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    result = json.loads(run.stdout)
    assert result["turnEnd"] == {"kind": "max-turn-requests"}, run.stdout + run.stderr
    session_id = result["sessionId"]

    events = json_lines(
        dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=tmp_path).stdout
    )
    kinds = [e["type"] for e in events]
    assert kinds.count("step/start") == kinds.count("step/end") == 4
    assert kinds.count("tool/call") == kinds.count("tool/result") == 4
    assert events[-1]["data"] == {"turn": 1, "reason": {"kind": "max-turn-requests", "limit": 4}}

    # the shipped repeat-tool-reminder row: the reminder follows the third identical result
    model = json_lines(
        dsh("sessions", "show", session_id, "--view", "model", "--json", cwd=tmp_path).stdout
    )
    texts = [block.get("text") for m in model for block in m["content"]]
    results = [i for i, m in enumerate(model) if m["content"][0]["type"] == "tool-result"]
    [notice] = [i for i, m in enumerate(model) if m["content"][0].get("text") == GENTLE_REMINDER]
    assert results[2] < notice < results[3]
    assert model[notice]["source"] == {
        "kind": "plugin",
        "plugin": "repeat-tool-reminder",
        "form": "notice",
        "summary": "read_file × 3",
    }
    assert texts.count(GENTLE_REMINDER) == 1

    listing = json_lines(dsh("sessions", "list", "--json", cwd=tmp_path).stdout)
    assert listing[0]["lastTurnEnd"] == "max-turn-requests"
    human = dsh(
        "run", "again", "--session", session_id, "--model", f"scripted:{script}",
        "--config", str(tmp_path / "dsh.yml"), cwd=tmp_path,
    )  # fmt: skip
    assert human.returncode == 1, human.stderr
    assert "turn 2 ended: max-turn-requests" in human.stdout
    verify = dsh("sessions", "verify", session_id, "--json", cwd=tmp_path)
    assert verify.returncode == 0 and json.loads(verify.stdout)["closers"] == []


class _PluginKind(
    msgspec.Struct, frozen=True, kw_only=True, tag="awaiting-approval", tag_field="kind"
):
    pending: tuple[str, ...]


def _write_log_with_a_plugin_kind(root: Path, cwd: Path) -> None:
    async def main() -> None:
        rows = [
            Row(name="sessions"),
            Row(name="session-persistence-jsonl", config={"root": str(root)}),
        ]
        async with open_host(rows) as host:
            session = host.ctx.sessions.create("plugin-kind", meta={"cwd": str(cwd)})
            session.append("turn/start", {"turn": 1})
            session.append(
                "turn/end", {"turn": 1, "reason": {"kind": "awaiting-approval", "pending": ["c1"]}}
            )
            await host.ctx.sessions.flush(session)

    dispose = register_turn_end_reason(_PluginKind)
    try:
        anyio.run(main)
    finally:
        dispose()


def test_a_turn_end_kind_the_cli_does_not_know_is_shown(tmp_path: Path) -> None:
    # the default root: the autouse fixture's private XDG_DATA_HOME (D15)
    _write_log_with_a_plugin_kind(Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions", tmp_path)
    listing = dsh("sessions", "list", "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert json_lines(listing.stdout)[0]["lastTurnEnd"] == "awaiting-approval"
    events = dsh("sessions", "show", "plugin-kind", "--view", "events", "--json", cwd=tmp_path)
    assert events.returncode == 0, events.stderr
    end: Any = json_lines(events.stdout)[-1]
    assert end["data"]["reason"] == {"kind": "awaiting-approval", "pending": ["c1"]}
    for view in ("events", "model", "transcript"):
        shown = dsh("sessions", "show", "plugin-kind", "--view", view, cwd=tmp_path)
        assert shown.returncode == 0, (view, shown.stderr)
        assert "Traceback" not in shown.stderr
    assert (
        "turn 1 awaiting-approval"
        in dsh("sessions", "show", "plugin-kind", "--view", "events", cwd=tmp_path).stdout
    )
