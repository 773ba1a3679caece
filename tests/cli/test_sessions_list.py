"""``dsh sessions list`` through the real ``dsh``: a damaged log is named without hiding its
neighbours, and piped output is one whole tab-separated row per session with its title."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_helpers import dsh, json_lines


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
    assert good in human.stdout  # the intact session's row
    assert f"unreadable {bad}: corrupt" in human.stdout
    assert log.read_bytes() == bytes(data)  # listing wrote nothing


def test_sessions_list_piped_is_one_whole_row_per_session_with_a_title(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    cwd = tmp_path / "ws"
    cwd.mkdir()
    long_id = "a-rather-long-session-id-that-a-table-would-wrap-" + "x" * 40
    made = dsh("run", "fix\tthe failing   build please", "--session", long_id, "--new",
               "--root", str(root), "--json", cwd=cwd)  # fmt: skip
    assert made.returncode == 0, made.stderr
    other = _demo_session(cwd, root)
    listed = dsh("sessions", "list", "--root", str(root), cwd=cwd)  # stdout is a pipe
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split("\t") == [
        "id", "created", "cwd", "events", "last turn", "size", "tokens", "title"
    ]  # fmt: skip
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert set(rows) == {long_id, other}  # whole ids, one line each
    assert all(len(row) == 8 for row in rows.values())
    assert rows[long_id][7] == "fix the failing build please"
    assert rows[long_id][4] == "completed"
    as_json = {r["sessionId"]: r for r in json_lines(
        dsh("sessions", "list", "--root", str(root), "--json", cwd=cwd).stdout
    )}  # fmt: skip
    assert as_json[long_id]["title"] == "fix the failing build please"
    usage = as_json[long_id]["usage"]  # the session's logged usage, summed
    assert usage["outputTokens"] > 0
    total_in = usage["inputTokens"] + usage["cacheReadTokens"]
    assert rows[long_id][6] == f"{total_in} in, {usage['outputTokens']} out"
