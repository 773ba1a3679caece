"""The load battery (``bench/serve_load.py``) at a small size, its invariants asserted.

Real ``dsh serve`` processes (one JSONL process; one ``--queue`` worker on PostgreSQL), six
sessions, a follower more per session (from ``?after=-1``), twenty clients that go away
mid-request. No timing is asserted; what must hold is: every log verifies, every accepted
prompt is in its log exactly once, every follower saw exactly the stored log, and once the
clients are gone the servers' memory is back near its baseline and their descriptors are: no
client connection is left, nothing but PostgreSQL connections is open beyond the baseline, and
those are within what the connection pools may keep.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import REPO


@pytest.mark.slow
def test_the_load_battery_holds_its_invariants(tmp_path: Path) -> None:
    pytest.importorskip("procrastinate")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "serve_load.py"), "--small", "--only", "jsonl-1",
         "queue-1", "--results-dir", str(tmp_path / "results"), "--scratch",
         str(tmp_path / "scratch")],
        capture_output=True, text=True, timeout=900, cwd=REPO / "bench",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results" / "serve_load.json").read_text())
    assert set(data["results"]) == {"jsonl-1", "queue-1"}
    for name, result in data["results"].items():
        found = result["invariants"]
        assert found["sessions"] == data["sessions"], name
        assert found["prompts"] == data["sessions"] * data["turns"], name
        assert (found["unverified"], found["wrong_prompts"], found["wrong_streams"]) == (
            [], [], []), (name, found)
        fds = found["fds"]
        for index, (before, after) in enumerate(
                zip(fds["census_baseline"], fds["census_after"], strict=True)):
            # Descriptors by holder: no client connection left, nothing but PostgreSQL
            # connections above the warmed-up baseline, and those within what the pools may
            # keep (docs/decisions.md D40). On failure: every descriptor, described.
            explain = "\n".join([
                f"{name} process {index}: {before} -> {after}, postgres bound "
                f"{fds['postgres_bound']}", "baseline:", *fds["targets_baseline"][index],
                "after:", *fds["targets_after"][index]])
            assert after["http"] == 0, explain
            assert after["other"] <= before["other"], explain
            assert after["postgres"] <= fds["postgres_bound"], explain
        for before, after in zip(found["rss_mb"]["baseline"], found["rss_mb"]["after"],
                                 strict=True):
            assert after <= before * 1.25, (name, found["rss_mb"])
