"""``SpillArea.release``: a session's spill files are deleted, and their bytes go back to the
row's budget, without touching another session's files. Real files in a real directory."""

from __future__ import annotations

import os
from pathlib import Path

from dsh_builtin_tools.spill import SpillArea


def test_release_deletes_one_owners_files_and_returns_their_budget(tmp_path: Path) -> None:
    area = SpillArea(str(tmp_path / "spill"), cap=1_000_000, budget=10_000)
    try:
        a1 = area.save_text("c1", "result.txt", "a" * 3000, "session-a")
        a2 = area.save_text("c2", "result.txt", "b" * 3000, "session-a")
        b1 = area.save_text("c1", "result.txt", "c" * 3000, "session-b")
        assert a1 and a2 and b1
        assert area.spent == 9000
        # The budget is nearly used up: a fourth file is cut.
        assert area.save_text("c3", "result.txt", "d" * 3000, "session-b") is not None
        assert area.exhausted()

        assert area.release("session-a") == 2
        assert not os.path.exists(a1) and not os.path.exists(a2)
        assert os.path.exists(b1)
        assert area.spent == 4000  # session-b's 3000 + the 1000 its cut file was granted
        assert not area.exhausted()
        assert area.release("session-a") == 0  # idempotent
        assert area.release("session-b") == 2
        assert area.path is not None and os.listdir(area.path) == []
    finally:
        area.dispose()
