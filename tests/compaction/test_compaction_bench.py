"""Smoke test of ``bench/compaction.py`` (issue 22): it runs on both backends and its structural
facts hold — the compacting run compacts, never fails a compaction, keeps every request under the
declared window, and ends far smaller than the run without compaction. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compaction.py"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_compaction_bench(tmp_path: Path, backend: str) -> None:
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--small", "--steps", "200", "--window", "16000",
         "--backend", backend, "--results-dir", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((results / "compaction.json").read_text())
    assert data["small"] is True and data["steps"] == 200
    runs = data["runs"]
    assert runs["without"]["compactions"] == 0
    assert runs["with"]["compactions"] >= 2 and runs["with"]["failed_compactions"] == 0
    assert runs["with"]["summary_requests"] == runs["with"]["compactions"]
    assert data["largest_compacted_tokens"] < data["window"]
    last = data["at"]["200"]
    assert last["with"]["tokens"] * 2 < last["without"]["tokens"]
