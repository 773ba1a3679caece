"""``dsh sessions show`` over a compacted session (issue 22): ``--view model`` shows the compacted
surface (the checkpoint in place of the shadowed span), the transcript shows every original
event and marks where compaction happened, and usage and context pressure are printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .compaction_child import SESSION_ID, SUMMARY, WINDOW

CHILD = Path(__file__).with_name("compaction_child.py")


def dsh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_show_views_of_a_compacted_session(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    made = subprocess.run(
        [sys.executable, str(CHILD), str(root), "none"], capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr

    model = dsh("sessions", "show", SESSION_ID, "--root", str(root), "--view", "model", "--json",
                cwd=tmp_path)  # fmt: skip
    assert model.returncode == 0, model.stderr
    messages = [json.loads(line) for line in model.stdout.splitlines() if line.strip()]
    texts = json.dumps(messages)
    checkpoints = [m for m in messages if m.get("source", {}).get("plugin") == "compact"]
    assert checkpoints and "<compacted-summary>" in json.dumps(checkpoints[0])
    assert json.dumps(SUMMARY)[1:-1] in texts
    assert "chunk 0 " not in texts  # shadowed: the model no longer sees it

    transcript = dsh("sessions", "show", SESSION_ID, "--root", str(root), cwd=tmp_path)
    assert transcript.returncode == 0, transcript.stderr
    out = transcript.stdout
    for i in range(10):
        assert f"chunk {i} " in out  # every original result is still shown
    assert "── compacted:" in out and "summarized for the model by scripted/scripted" in out
    assert "── pruned for the model: tool result" in out
    assert out.index("chunk 0 ") < out.index("── compacted:")
    assert f"of {WINDOW} tokens" in out  # the context line
    assert "usage:" in out

    events = dsh("sessions", "show", SESSION_ID, "--root", str(root), "--view", "events", "--json",
                 cwd=tmp_path)  # fmt: skip
    types = [json.loads(line)["type"] for line in events.stdout.splitlines() if line.strip()]
    assert "compaction/start" in types and "compaction/end" in types
    # Eleven results (ten chunks and the big one), plus one replacement per prune.
    assert types.count("compaction/prune") == 1
    assert types.count("tool/result") == 11 + 1
