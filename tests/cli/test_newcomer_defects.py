"""More of what a newcomer trips over (issue 18), each through the real ``dsh``.

Sessions listed despite a damaged neighbour, a second writer refused before it
prints anything, ``--session`` that only continues, honest ``--approval never``
texts, a richer ``run --json``, and ``sessions list`` for pipes.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import dsh, json_lines


def _demo_session(tmp: Path, root: Path) -> str:
    result = dsh("run", "--root", str(root), "--json", cwd=tmp)
    assert result.returncode == 0, result.stderr
    session_id: str = json.loads(result.stdout)["sessionId"]
    return session_id


def _log_of(root: Path, session_id: str) -> Path:
    (path,) = root.glob(f"*/{session_id}/session.v3.jsonl.zstd")
    return path


def test_one_damaged_log_does_not_hide_the_others(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    good = _demo_session(tmp_path, root)
    bad = _demo_session(tmp_path, root)
    log = _log_of(root, bad)
    data = bytearray(log.read_bytes())
    data[20] ^= 0xFF  # inside the header frame: its checksum no longer matches
    log.write_bytes(bytes(data))

    listed = dsh("sessions", "list", "--root", str(root), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["sessionId"]: row for row in json_lines(listed.stdout)}
    assert set(rows) == {good, bad}
    assert rows[good]["problem"] is None and rows[good]["events"]
    assert "header frame failed validation" in rows[bad]["problem"]
    assert rows[bad]["createdAt"] is None

    human = dsh("sessions", "list", "--root", str(root), cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "Traceback" not in human.stderr
    assert "completed" in human.stdout  # the intact session's row
    assert f"unreadable {bad}: corrupt" in human.stdout
    assert log.read_bytes() == bytes(data)  # listing wrote nothing
