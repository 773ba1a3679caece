"""The load battery (``bench/serve_load.py``) at a small size, its invariants asserted.

Real ``dsh serve`` processes (one JSONL process; one ``--queue`` worker on PostgreSQL), six
sessions, a follower more per session (from ``?after=-1``), twenty clients that go away
mid-request. No timing is asserted; what must hold is: every log verifies, every accepted
prompt is in its log exactly once, every follower saw exactly the stored log, and the server's
descriptors and memory are back near their baseline once the clients are gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import REPO

#: What a ``--queue`` worker may hold more after a load than after one turn: its connection
#: pools grow to their bounds (the persistence row keeps up to 4 idle connections,
#: procrastinate's pool up to 4) and stay there.
POOL_GROWTH = 8


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
        grow = 0 if name.startswith("jsonl") else POOL_GROWTH
        for before, after in zip(found["fds"]["baseline"], found["fds"]["after"], strict=True):
            assert after <= before + grow, (name, found["fds"])
        for before, after in zip(found["rss_mb"]["baseline"], found["rss_mb"]["after"],
                                 strict=True):
            assert after <= before * 1.25, (name, found["rss_mb"])
