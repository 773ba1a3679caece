"""More of what a newcomer trips over (issue 18), each through the real ``dsh``.

Sessions listed despite a damaged neighbour, a second writer refused before it
prints anything, ``--session`` that only continues, honest ``--approval never``
texts, a richer ``run --json``, and ``sessions list`` for pipes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dsh_session_persistence_jsonl._lock import lock_holder

from .cli_helpers import REPO, dsh, json_lines


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


def test_a_second_writer_is_refused_before_it_shows_any_repair(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    root = tmp_path / "sessions"
    script = tmp_path / "script.json"
    call = {"name": "bash", "id": "c-sleep",
            "arguments": {"command": "sleep 120", "description": "hold the session"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "done"}]}))
    common = ("--root", str(root), "--model", f"scripted:{script}")
    writer = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "go", "--session", "held", "--new", *common],
        cwd=workspace, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # The writer holds the lock once its tool call is on disk (the call is flushed first).
        deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
        while lock_holder_of(root, "held") != writer.pid:
            assert writer.poll() is None and time.monotonic() < deadline, "writer never held it"
            time.sleep(0.1)
        held = f"held by a live writer (pid {writer.pid})"
        for args in (("resume", "held"), ("run", "again", "--session", "held")):
            second = dsh(*args, *common, cwd=workspace)
            assert second.returncode == 3, second.stderr
            assert "repair" not in second.stdout, second.stdout  # nothing it did not do
            assert held in second.stderr and "Traceback" not in second.stderr
        verify = dsh("sessions", "verify", "held", "--root", str(root), cwd=workspace)
        assert verify.returncode == 3, verify.stdout + verify.stderr
        assert held in verify.stdout and "dsh resume" not in verify.stdout
        as_json = dsh("sessions", "verify", "held", "--root", str(root), "--json", cwd=workspace)
        assert json.loads(as_json.stdout)["heldBy"] == held
    finally:
        writer.kill()
        writer.wait(timeout=60)
    # The control: with the writer gone the same session is recoverable and resume repairs it.
    verify = dsh("sessions", "verify", "held", "--root", str(root), cwd=workspace)
    assert verify.returncode == 1 and "dsh resume held" in verify.stdout, verify.stdout
    resumed = dsh("resume", "held", "--root", str(root), cwd=workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert "repair: c-sleep OUTCOME_UNKNOWN" in resumed.stdout


def lock_holder_of(root: Path, session_id: str) -> int | None:
    locks = list(root.glob(f"*/{session_id}/session.lock"))
    return lock_holder(str(locks[0])) if locks else None


def test_session_flag_continues_and_only_new_creates(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    common = ("--root", str(root), "--json")
    typo = dsh("run", "--session", "my-wrok", *common, cwd=tmp_path)
    assert typo.returncode == 2 and "Traceback" not in typo.stderr, typo.stderr
    assert "--session my-wrok: no stored session has this id" in typo.stderr
    assert "pass --new" in typo.stderr
    assert not root.exists() or not list(root.glob("*/my-wrok"))  # nothing was created
    lone = dsh("run", "--new", *common, cwd=tmp_path)
    assert lone.returncode == 2 and "--new needs --session ID" in lone.stderr, lone.stderr
    made = dsh("run", "--session", "my-work", "--new", *common, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["sessionId"] == "my-work"
    again = dsh("run", "--session", "my-work", "--new", *common, cwd=tmp_path)
    assert again.returncode == 2 and "already stored; drop --new" in again.stderr, again.stderr
    # the demo never continues a session: continuing it names a model (logged as an override)
    demo = dsh("run", "--session", "my-work", *common, cwd=tmp_path)
    assert demo.returncode == 2 and "built-in demo script" in demo.stderr, demo.stderr
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "continued"}]}))
    continued = dsh("run", "--session", "my-work", "go on", "--model", f"scripted:{script}",
                    *common, cwd=tmp_path)
    assert continued.returncode == 0, continued.stderr
    assert json.loads(continued.stdout)["events"] > json.loads(made.stdout)["events"]


def test_approval_never_says_the_policy_refused_not_a_person(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "composition.yml"
    config.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
        + "      - {tool: write_file, decision: ask, reason: writes need a human}\n"
    )
    script = tmp_path / "script.json"
    call = {"name": "write_file", "id": "c-w", "arguments": {"path": "x.txt", "content": "x"}}
    script.write_text(json.dumps({"responses": [{"tool_calls": [call]}, {"text": "done"}]}))
    result = dsh(
        "run", "go", "--model", f"scripted:{script}", "--root", str(tmp_path / "s"),
        "--config", str(config), "--approval", "never", cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "? approval rejected by the approval policy never (no one was asked)" in result.stdout
    assert not (workspace / "x.txt").exists()
    helped = dsh("run", "--help", cwd=tmp_path)
    assert "never: nobody is asked" in " ".join(helped.stdout.split())


def test_run_json_carries_the_error_usage_final_text_and_closers(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    cwd = tmp_path / "ws"  # beside the session root, not above it (D15)
    cwd.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "first answer"}]}))
    made = dsh("run", "hi", "--model", f"scripted:{script}", "--root", str(root), "--json",
               cwd=cwd)  # fmt: skip
    assert made.returncode == 0, made.stderr
    payload = json.loads(made.stdout)
    assert {"sessionId", "turnEnd", "events"} <= set(payload)  # the old keys stay
    assert payload["finalText"] == "first answer"
    turn, total = payload["usage"]["turn"], payload["usage"]["total"]
    assert turn["inputTokens"] > 0 and turn["outputTokens"] > 0 and "cacheReadTokens" in turn
    assert total == turn
    # A failing turn on the same session: its code and message, usage summed, closers listed.
    failed = dsh(
        "run", "again", "--session", payload["sessionId"], "--model", "openai-compatible:x",
        "--root", str(root), "--json", cwd=cwd, env={"DEEPSEEK_API_KEY": ""},
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    second = json.loads(failed.stdout)
    assert second["turnEnd"]["kind"] == "error"
    assert second["turnEnd"]["code"] == "INVALID_CREDENTIAL"  # an empty key
    assert "DEEPSEEK_API_KEY" in second["turnEnd"]["message"]
    assert second["finalText"] is None and second["closers"] == []
    assert second["usage"]["total"] == total


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
