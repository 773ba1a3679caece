"""bench/sqlite_vs_jsonl.py runs with ``--small`` and reports both backends (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_sqlite_vs_jsonl_bench(tmp_path: Path, backend: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "sqlite_vs_jsonl.py"),
            "--small",
            "--backend",
            backend,
            "--results-dir",
            str(tmp_path / "results"),
            "--scratch",
            str(tmp_path / "scratch"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "results" / "sqlite_vs_jsonl.json").read_text())
    assert data["backend"] == backend and data["session"]["events"] == 120
    assert len(data["flush"]) == 2 and len(data["resume"]) == 2
    for figures in data["flush"].values():
        assert figures["one_event"]["n"] == 30 and figures["one_turn_12_events"]["n"] == 10
    assert all(value > 0 for value in data["ratio_sqlite_over_jsonl"].values())
