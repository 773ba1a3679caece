"""``dsh run``: the model's reasoning is shown (a dim line once it is done; a terminal also
shows its latest words in the status line while it streams), by ``--reasoning``, and showing it
never changes the turn: the log of a run is the same whatever is shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .cli_helpers import REPO, dsh, json_lines

REASONING = ("The user asks for the sum of two and three. Adding them gives five, "
             "which I can state directly.\nSecond thought: no tool is needed.")


def _run(tmp_path: Path, name: str, *flags: str) -> tuple[str, list[dict[str, Any]]]:
    """(stdout of a piped run, the logged events) for one scripted reasoning answer."""
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps({"responses": [{"reasoning": REASONING, "text": "It is 5."}]}))
    work = tmp_path / "ws"
    work.mkdir(exist_ok=True)
    root = tmp_path / name
    done = dsh("run", "what is 2+3?", "--model", f"scripted:{script}", "--workspace", str(work),
               "--config", str(REPO / "configs" / "default.yml"), "--root", str(root), *flags,
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [session] = [p.parent.name for p in root.rglob("session.*.jsonl*")]
    events = json_lines(dsh("sessions", "show", session, "--view", "events", "--json",
                            "--root", str(root), cwd=tmp_path).stdout)  # fmt: skip
    assert events, "the run logged nothing readable"
    return done.stdout, events


def _shape(events: list[dict[str, Any]]) -> list[Any]:
    """What a run logged, without ids and times."""
    return [(e["type"], e["data"].get("message", {}).get("content") if isinstance(e["data"], dict)
             else None) for e in events]  # fmt: skip


@pytest.mark.slow
def test_reasoning_is_one_summary_line_before_the_answer_and_never_changes_the_turn(
    tmp_path: Path,
) -> None:
    summary, logged = _run(tmp_path, "summary")
    [line] = [line for line in summary.splitlines() if "✻ thought:" in line]
    assert line.startswith("✻ thought: The user asks for the sum of two and three.")
    assert line.endswith("… (25 words)")
    assert summary.index("✻ thought:") < summary.index("It is 5.")
    assert "Second thought" not in summary

    full, _ = _run(tmp_path, "full", "--reasoning", "full")
    assert "✻ thought: The user asks" in full and "Second thought: no tool is needed." in full

    off, silent = _run(tmp_path, "off", "--reasoning", "off")
    assert "thought" not in off and "It is 5." in off
    # the turn is the same whatever is shown: the log holds the reasoning either way
    assert _shape(logged) == _shape(silent)
    reasoning = [b for e in logged if e["type"] == "assistant/message"
                 for b in e["data"]["message"]["content"] if b["type"] == "reasoning"]  # fmt: skip
    assert [b["text"] for b in reasoning] == [REASONING]
