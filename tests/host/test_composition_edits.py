"""Composition edits by plugin name have one owner, ``dsh_host._composition_edits``.

``dsh run``, ``dsh serve``, a continued session's recorded terms and the Python ``Agent`` used
to patch rows each in their own loop (issue 33). These pin what every caller now relies on:
only enabled rows of the plugin (by canonical name, DSH aliases included) change, nothing else about a row does, the
input of :func:`patched` is left alone, and ``keep_existing`` only fills in.
"""

from __future__ import annotations

import re
from pathlib import Path

from dsh_host._composition_edits import config_of, enabled, merged, patch, patched
from dsh_host._loader import LocatedRow, Row


def _rows() -> list[LocatedRow]:
    return [
        LocatedRow(Row(name="builtin-tools", id="tools-a", config={"x": 1}), "a.yml:1"),
        LocatedRow(Row(name="builtin-tools", id="tools-off", disabled=True), "a.yml:2"),
        LocatedRow(Row(name="agent", id="agent", config={"model": "m1"}), "a.yml:3"),
        LocatedRow(Row(name="@deepseek-ai/dsh-builtin-tools", id="tools-b"), "a.yml:4"),
    ]


def test_patch_changes_only_enabled_rows_of_the_plugin() -> None:
    rows = _rows()
    assert patch(rows, "builtin-tools", {"workspace": "/w"}) == 2
    assert rows[0].row.config == {"x": 1, "workspace": "/w"}
    assert rows[0].row.id == "tools-a" and rows[0].where == "a.yml:1"
    assert rows[1].row.config is None and rows[1].row.disabled  # disabled: untouched
    assert rows[2].row.config == {"model": "m1"}
    assert rows[3].row.config == {"workspace": "/w"}  # a DSH alias matches too
    assert enabled(rows, "builtin-tools") == [0, 3]
    assert patch(rows, "user-approval", {"policy": "ask"}) == 0  # no such row: the caller says


def test_patched_leaves_its_input_alone_and_keep_existing_only_fills_in() -> None:
    rows = _rows()
    out = patched(rows, "agent", {"model": "m2", "provider": "p"})
    assert rows[2].row.config == {"model": "m1"}
    assert config_of(out, "agent") == {"model": "m2", "provider": "p"}
    filled = merged(rows[2].row, {"model": "m2", "provider": "p"}, keep_existing=True)
    assert filled.config == {"model": "m1", "provider": "p"}
    assert config_of(rows, "sandbox-local") is None


#: A row's config copied to be merged into: ``{**(row.config or {}), ...}`` or
#: ``config = dict(row.config or {})`` (the shapes the copies had)
_MERGE = re.compile(r"\{\*\*\(?[\w.]*\.config or \{\}\)?|= dict\([\w.]*\.config or \{\}\)")


def test_no_other_host_module_merges_into_a_row_config() -> None:
    """The one-owner rule, checked: outside ``composition_edits`` no host module copies a
    row's config to merge keys into it (there were eight such places)."""
    root = Path(__file__).resolve().parents[2] / "dsh_host"
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "_composition_edits.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _MERGE.search(line)
    ]
    assert offenders == []
