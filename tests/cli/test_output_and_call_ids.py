"""Printing never steers a turn, and a real HTTP provider's empty ids are owned by the harness.

Real ``dsh`` processes: ``dsh run`` whose standard output is a pipe nobody reads any more
(the ``dsh run | head -1`` case, made deterministic by closing the read end before the run
starts), and ``dsh run`` against a loopback OpenAI-compatible server that sends tool calls
without ids. Judged from the exit code, stderr, the workspace and the stored log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from llm.sse_server import SseServer, sse, text_events, tool_call_events

from .cli_helpers import REPO, dsh

# slow: real dsh processes running sandboxed bash calls
pytestmark = pytest.mark.slow


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command, "description": command}}


def stored_events(tmp_path: Path, root: Path, session_id: str) -> list[dict[str, Any]]:
    shown = dsh("sessions", "show", session_id, "--root", str(root), "--view", "events",
                "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


def test_a_closed_stdout_stops_the_printing_not_the_turn(tmp_path: Path) -> None:
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Let me leave a mark.", "tool_calls": [bash("touch marked")]},
        {"text": "Marked."},
    ]}))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write is EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dsh_host", "run", "mark it", "--workspace", str(workspace),
             "--root", str(root), "--model", f"scripted:{script}"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.PIPE,
            text=True, timeout=120, check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    notices = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(notices) == 1 and "standard output is gone" in notices[0], proc.stderr
    assert (workspace / "marked").exists()  # the tool ran

    listing = dsh("sessions", "list", "--root", str(root), "--json", cwd=tmp_path)
    [session_id] = [json.loads(line)["sessionId"] for line in listing.stdout.splitlines()]
    events = stored_events(tmp_path, root, session_id)
    assert events[-1]["type"] == "turn/end"
    assert events[-1]["data"]["reason"] == {"kind": "completed"}
    [result] = [e for e in events if e["type"] == "tool/result"]
    assert "error" not in result["data"]
    verify = dsh("sessions", "verify", session_id, "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _stored_turn_end(tmp_path: Path, root: Path) -> dict[str, Any] | None:
    """The last ``turn/end`` of the one stored session, read from disk by another ``dsh``
    process (None: no session or no turn end stored yet)."""
    listing = dsh("sessions", "list", "--root", str(root), "--json", cwd=tmp_path)
    ids = [json.loads(line)["sessionId"] for line in listing.stdout.splitlines() if line.strip()]
    if not ids:
        return None
    ends = [e for e in stored_events(tmp_path, root, ids[0]) if e["type"] == "turn/end"]
    return ends[-1] if ends else None


def test_a_stdout_nobody_reads_does_not_hold_the_turn_up(tmp_path: Path) -> None:
    """`dsh run ... | slow-consumer`: the transcript used to be written inside the turn, so once
    the pipe's buffer was full (64 KiB) the turn stopped where it stood -- no tool body, no
    model request, no turn/end -- until the reader read. Now printing only queues while the
    turn runs: with a pipe nobody reads, the turn runs to its end and is on disk; the streamed
    text past the queue's bound is dropped with a marker, and the final report is complete
    once the reader reads."""
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    long_text = ("z" * 1999 + " ") * 200  # 400 kB in 200 deltas (the script streams words)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": long_text, "tool_calls": [bash("touch body-ran")]},
        {"text": long_text},
    ]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "run", "talk a lot", "--workspace", str(workspace),
         "--root", str(root), "--model", f"scripted:{script}"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("DSH_SESSION_ROOT", "DSH_CONFIG")},
    )
    try:
        # Nobody reads stdout while the turn runs: judged from the log on disk. The only
        # deadline is a generous one for a stuck turn (it takes seconds when it is not).
        deadline = time.monotonic() + 240
        ended = _stored_turn_end(tmp_path, root)
        while ended is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            ended = _stored_turn_end(tmp_path, root)
        assert ended is not None, "the turn did not end while nobody read stdout"
        assert ended["data"]["reason"] == {"kind": "completed"}
        assert (workspace / "body-ran").exists()  # the tool body ran meanwhile
        out, err = proc.communicate(timeout=240)  # now the reader reads: the rest comes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "characters of output dropped here" in stdout  # said, not silently cut
    assert len(stdout) < len(long_text) * 2  # bounded: the queue did not hold everything
    lines = stdout.rstrip("\n").splitlines()
    assert lines[-2].startswith("session ") and " events · " in lines[-2], lines[-3:]
    assert lines[-1].startswith("  inspect: ")


def test_dsh_run_piped_into_head_completes_the_turn(tmp_path: Path) -> None:
    """The shell's ``dsh run ... | head -1``: the reader reads one line and goes away while the
    turn streams; dsh says so once, exits 0 with no traceback, and the log on disk is the whole
    turn (its tool ran, it ended completed, verify passes)."""
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    long_text = ("y" * 999 + " ") * 300
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": long_text, "tool_calls": [bash("touch body-ran")]},
        {"text": long_text},
    ]}))
    command = (
        f"{sys.executable} -m dsh_host run 'go on' --workspace {workspace} --root {root} "
        f"--model scripted:{script} 2>{tmp_path / 'stderr'} | head -1; "
        'echo "${PIPESTATUS[0]}" > ' + str(tmp_path / "status")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_SESSION_ROOT", "DSH_CONFIG")}
    shell = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=300, check=False)
    assert len(shell.stdout.splitlines()) == 1, shell.stdout[:200]
    stderr = (tmp_path / "stderr").read_text()
    assert (tmp_path / "status").read_text().strip() == "0", stderr
    assert "Traceback" not in stderr
    assert stderr.count("standard output is gone") == 1, stderr
    assert (workspace / "body-ran").exists()
    ended = _stored_turn_end(tmp_path, root)
    assert ended is not None and ended["data"]["reason"] == {"kind": "completed"}
    listing = dsh("sessions", "list", "--root", str(root), "--json", cwd=tmp_path)
    [session_id] = [json.loads(line)["sessionId"] for line in listing.stdout.splitlines()]
    verify = dsh("sessions", "verify", session_id, "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_provider_that_sends_no_call_ids(tmp_path: Path) -> None:
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    write = '{"command": "printf \\"%s\\\\n\\" \\"$DSH_CALL_ID\\" >> ledger", "description": "x"}'
    with SseServer([
        sse(tool_call_events([("", "bash", write)], fragment=16)),
        sse(tool_call_events([("", "bash", write)], fragment=16)),
        sse(text_events("Done.")),
    ]) as server:
        config = tmp_path / "dsh.yml"
        config.write_text(
            (REPO / "configs" / "default.yml").read_text()
            + "\n- id: my-endpoint\n  name: llm-openai-compatible\n  config:\n"
            f"    base_url: {server.url}\n    api_key_env: MY_KEY\n    provider: my-route\n"
            "    model: configured-model\n"
        )
        done = dsh("run", "hi", "--config", str(config), "--workspace", str(workspace),
                   "--root", str(root), "--model", "openai-compatible:configured-model",
                   "--json", cwd=tmp_path, env={"MY_KEY": "k", "DEEPSEEK_API_KEY": ""})
        requests = [request.body for request in server.requests]
    assert done.returncode == 0, done.stdout + done.stderr
    session_id = json.loads(done.stdout)["sessionId"]
    assert json.loads(done.stdout)["turnEnd"] == {"kind": "completed"}

    # What went back to the provider: each call and its result under one minted id.
    last = requests[-1]["messages"]
    sent_calls = [call["id"] for m in last if m["role"] == "assistant"
                  for call in m.get("tool_calls") or ()]
    sent_results = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert len(sent_calls) == 2 and all(sent_calls) and len(set(sent_calls)) == 2
    assert sent_results == sent_calls

    events = stored_events(tmp_path, root, session_id)
    blocks = [b for e in events if e["type"] == "assistant/message"
              for b in e["data"]["message"]["content"] if b["type"] == "tool-call"]
    assert [b["id"] for b in blocks] == sent_calls
    assert [b["providerId"] for b in blocks] == ["", ""]  # the wire said: no id
    assert (workspace / "ledger").read_text().split() == sent_calls
    verify = dsh("sessions", "verify", session_id, "--root", str(root), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def rewrite_log(path: Path, edit: Any) -> None:
    """Rewrite a stored zstd log as an older writer could have left it: ``edit`` gets the
    event rows (dicts) and changes them in place; the header frame is kept as it was."""
    import zstandard

    plain = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    lines = plain.decompress(path.read_bytes()).decode().splitlines()
    header, rows = lines[0], [json.loads(line) for line in lines[1:]]
    edit(rows)
    squeeze = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    body = "\n".join(json.dumps(row, separators=(",", ":")) for row in rows) + "\n"
    path.write_bytes(squeeze.compress((header + "\n").encode()) + squeeze.compress(body.encode()))


def verify_of(tmp_path: Path, root: Path, session_id: str) -> subprocess.CompletedProcess[str]:
    return dsh("sessions", "verify", session_id, "--root", str(root), cwd=tmp_path)


def test_verify_reports_calls_an_older_writer_left_unpaired(tmp_path: Path) -> None:
    """Logs written before the harness owned call ids can hold two calls under one id, or a
    call with an empty id whose result the log refused (its turn then ended without it).
    ``verify`` said "intact" for both; it must say the calls cannot be paired (exit 2)."""
    root, workspace = tmp_path / "sessions", tmp_path / "ws"
    workspace.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [bash("true"), bash("true")]},
        {"text": "done"},
    ]}))
    run = dsh("run", "go", "--workspace", str(workspace), "--root", str(root), "--model",
              f"scripted:{script}", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout)["sessionId"]
    [log] = root.rglob("session.v3.jsonl.zstd")
    assert verify_of(tmp_path, root, session_id).returncode == 0
    original = log.read_bytes()

    def same_id(rows: list[dict[str, Any]]) -> None:
        text = json.dumps(rows).replace('"call_1_2"', '"call_1_1"')
        rows[:] = json.loads(text)

    rewrite_log(log, same_id)
    twice = verify_of(tmp_path, root, session_id)
    assert twice.returncode == 2, twice.stdout + twice.stderr
    assert "UNBALANCED CALLS" in twice.stderr and '"call_1_1" was already used' in twice.stderr
    assert "Traceback" not in twice.stderr

    log.write_bytes(original)

    def empty_id_result_refused(rows: list[dict[str, Any]]) -> None:
        for seq, row in enumerate(rows):
            data = row["data"]
            if row["type"] == "assistant/message":
                for block in data["message"]["content"]:
                    if block.get("id") == "call_1_2":
                        block["id"] = ""
            elif row["type"] == "tool/call" and data["callId"] == "call_1_2":
                data["callId"] = ""
            elif row["type"] == "tool/result" and data["message"]["source"]["callId"] == "call_1_2":
                # What the log refused never reached it: an ignorable row keeps seqs contiguous.
                rows[seq] = {"type": "x/refused", "seq": seq, "time": 0, "data": {},
                             "ignorable": True}

    rewrite_log(log, empty_id_result_refused)
    empty = verify_of(tmp_path, root, session_id)
    assert empty.returncode == 2, empty.stdout + empty.stderr
    assert "has no id" in empty.stderr and "Traceback" not in empty.stderr
    report = dsh("sessions", "verify", session_id, "--root", str(root), "--json", cwd=tmp_path)
    assert report.returncode == 2
    problems = json.loads(report.stdout)["callProblems"]
    assert any("a tool call (bash) has no id" in p for p in problems)
    assert any("a tool/call (bash) has no call id" in p for p in problems)
