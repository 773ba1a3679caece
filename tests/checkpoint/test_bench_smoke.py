"""Smoke test of ``bench/checkpoint_overhead.py``: it runs, and its structural facts hold.

No timing is asserted. What must hold for the figures to mean anything: with the
policy every tool step makes exactly three fsyncs, one per barrier, and every
barrier really was seen; without it a step waits for none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_checkpoint_overhead_bench(tmp_path: Path, backend: str) -> None:
    results = tmp_path / "results"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "checkpoint_overhead.py"),
            "--small",
            "--steps",
            "6",
            "--repeats",
            "1",
            "--backend",
            backend,
            "--results-dir",
            str(results),
            "--scratch",
            str(tmp_path / "scratch"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((results / "checkpoint_overhead.json").read_text())
    assert data["benchmark"] == "checkpoint_overhead"
    assert data["backend"] == backend
    assert data["with_policy"]["fsyncs_per_step_median"] == 3
    assert data["without_policy"]["fsyncs_per_step_median"] == 0
    for barrier in ("pre-step", "llm", "tool"):
        entry = data["barriers"][barrier]
        assert entry["flush"]["n"] == 5  # steps 2..6, one checkpoint each
        assert entry["fsyncs_per_call_median"] == 1
    assert not any((tmp_path / "scratch").iterdir())
