"""``dsh sessions`` shows the delegation tree: real ``dsh run`` / ``list`` / ``show`` processes."""

from __future__ import annotations

import json
from pathlib import Path

from .test_crash import PARENT, _compose, _dsh, _run_parent


def test_list_marks_children_and_show_links_them(tmp_path: Path) -> None:
    config = _compose(tmp_path, "jsonl", None)
    ran = _run_parent(tmp_path, config)
    assert ran.returncode == 0, ran.stderr
    listed = _dsh(tmp_path, "sessions", "list", "--config", str(config), "--json", "--fresh")
    assert listed.returncode == 0, listed.stderr
    rows = {row["sessionId"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(rows) == {PARENT, f"{PARENT}--d1", f"{PARENT}--d2"}
    assert rows[PARENT]["parentSession"] is None and rows[PARENT]["delegationDepth"] == 0
    for child in ("d1", "d2"):
        row = rows[f"{PARENT}--{child}"]
        assert (row["parentSession"], row["origin"], row["delegationDepth"]) == (
            PARENT,
            "subagent",
            1,
        )
    text = _dsh(tmp_path, "sessions", "list", "--config", str(config))
    assert f"[sub-agent of {PARENT}] do A" in text.stdout

    shown = _dsh(tmp_path, "sessions", "show", PARENT, "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert f"↳ sub-agent (first): child session {PARENT}--d1" in shown.stdout
    assert f"↳ sub-agent (second): child session {PARENT}--d2" in shown.stdout
    assert "answer A" in shown.stdout  # the parent's result
    assert "you: do A" not in shown.stdout, "without --tree the child's transcript is not shown"

    tree = _dsh(tmp_path, "sessions", "show", PARENT, "--config", str(config), "--tree")
    assert tree.returncode == 0, tree.stderr
    assert "  │ you: do A" in tree.stdout and "  │ you: do B" in tree.stdout
