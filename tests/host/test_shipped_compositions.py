"""The shipped compositions differ only where they say they do.

``sqlite.yml`` once dropped compaction, the token meter, AGENTS.md and the persona without a word:
each durable composition is "default.yml with another storage row", so the test compares every
row, config included, and finds new compositions by listing ``configs/`` rather than naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_host._loader import parse_rows

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STORAGE_ROW = "session-persistence"
#: Compositions that are not "default.yml with another store", and the rows they leave out.
WITHOUT_DURABILITY = {"memory.yml": {STORAGE_ROW, "session-checkpoints"}}


def _rows(path: Path) -> dict[str | None, Any]:
    return {
        located.row.id: (located.row.name, located.row.config, located.row.disabled)
        for located in parse_rows(path.read_text(encoding="utf-8"), path.name)
    }


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS.glob("*.yml") if p.name != "default.yml")
)
def test_a_durable_composition_is_the_default_with_another_store(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_POSTGRES_SCHEMA", "dsh")
    default = _rows(CONFIGS / "default.yml")
    rows = _rows(CONFIGS / name)
    if name in WITHOUT_DURABILITY:
        left_out = WITHOUT_DURABILITY[name]
        assert set(default) - set(rows) == left_out
        default = {k: v for k, v in default.items() if k not in left_out}
    else:
        assert rows[STORAGE_ROW][0] != default[STORAGE_ROW][0]
        rows.pop(STORAGE_ROW)
        default.pop(STORAGE_ROW)
    assert list(rows) == list(default), f"{name}: rows differ from default.yml"
    different = [row for row in default if rows[row] != default[row]]
    assert different == [], f"{name}: these rows differ from default.yml: {different}"
