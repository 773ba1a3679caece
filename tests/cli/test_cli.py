"""The ``dsh`` command line, driven through real subprocesses: every command, exit code,
JSON shape, and the bad inputs a user will type."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .cli_helpers import FIXTURES, REPO, copy_fixture_root, dsh, json_lines


def key_of(session_id: str, call_id: str) -> str:
    """``$DSH_IDEMPOTENCY_KEY``: a digest of the session id and the call id."""
    scope = f"{len(session_id)}:{session_id}:{call_id}"
    return "dsh-" + hashlib.sha256(scope.encode()).hexdigest()[:32]


def test_demo_run_then_list_show_verify(tmp_path: Path) -> None:
    run = dsh("run", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert set(result) == {"sessionId", "turnEnd", "events", "usage", "finalText"}
    assert result["turnEnd"] == {"kind": "completed"}
    session_id = result["sessionId"]
    # the demo wrote through the sandboxed bash, inside its workspace only
    notes = tmp_path / ".dsh" / "demo-workspace" / "notes.txt"
    assert notes.read_text() == f"note from dsh ({key_of(session_id, 'call_2_1')})\n"
    assert "Traceback" not in run.stderr
    # A second demo run is another session: its note is its own (the call ids are the same
    # in every demo run, so keyed on the call id alone the second run skipped its note).
    again = dsh("run", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)["sessionId"]
    assert notes.read_text().splitlines() == [
        f"note from dsh ({key_of(session_id, 'call_2_1')})",
        f"note from dsh ({key_of(second, 'call_2_1')})",
    ]

    listing = json_lines(dsh("sessions", "list", "--json", cwd=tmp_path).stdout)
    assert [entry["sessionId"] for entry in listing] == [second, session_id]  # newest first
    assert listing[1]["events"] == result["events"]
    assert listing[1]["lastTurnEnd"] == "completed"
    assert listing[1]["size"] > 0

    events = json_lines(
        dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=tmp_path).stdout
    )
    assert [e["seq"] for e in events] == list(range(result["events"]))
    assert events[-1]["type"] == "turn/end"
    types = [e["type"] for e in events]
    assert types.count("tool/call") == 3 and types.count("tool/result") == 3

    transcript = dsh("sessions", "show", session_id, cwd=tmp_path)
    assert transcript.returncode == 0
    assert "refused, as it should be" in transcript.stdout
    model = json_lines(
        dsh("sessions", "show", session_id, "--view", "model", "--json", cwd=tmp_path).stdout
    )
    assert model[0]["role"] == "system"

    verify = dsh("sessions", "verify", session_id, "--json", cwd=tmp_path)
    assert verify.returncode == 0
    assert json.loads(verify.stdout) == {
        "sessionId": session_id,
        "events": result["events"],
        "lastSeq": result["events"] - 1,
        "tornTail": None,
        "closers": [],
        "corrupt": None,
        "heldBy": None,
        "callProblems": [],
    }


def test_human_output_shows_call_ids_and_where_it_is_stored(tmp_path: Path) -> None:
    run = dsh("run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "you: Show me what dsh does" in run.stdout
    assert "Current runtime context" not in run.stdout  # plugin context is not the user's
    assert "⚙ bash [call_1_1]" in run.stdout
    assert "turn 1 ended: completed" in run.stdout
    assert "session.v3.jsonl.zstd" in run.stdout


@pytest.mark.parametrize(
    ("name", "code", "tornTail", "closers"),
    [
        ("clean", 0, None, []),
        ("header-only", 0, None, []),
        ("multi-batch", 0, None, []),
        ("torn-checksum", 1, {"truncateTo": 520, "recovered": 2}, None),
        ("tool-missing-result", 1, None, ["tool/result", "tool/result", "step/end", "turn/end"]),
    ],
)
def test_verify_exit_codes_on_reference_logs(
    tmp_path: Path, name: str, code: int, tornTail: object, closers: object
) -> None:
    root = copy_fixture_root(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = dsh("sessions", "verify", name, "--root", str(root), "--json", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    report = json.loads(result.stdout)
    assert report["corrupt"] is None
    if tornTail is not None:
        assert report["tornTail"] == tornTail
    if closers is not None:
        assert report["closers"] == closers
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert before == after, "verify must not write a byte"


def test_verify_corrupt_names_file_and_offset(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    # The fixture's last frame fails its checksum; alone, that reads as a torn tail here
    # (docs/format.md §5.1). An intact frame after it (a copy of the header frame) proves
    # the damage is committed.
    log = root / "--home-dev-project--" / "corrupt-checksum" / "session.v3.jsonl.zstd"
    data = log.read_bytes()
    log.write_bytes(data + data[:133])
    result = dsh("sessions", "verify", "corrupt-checksum", "--root", str(root), cwd=tmp_path)
    assert result.returncode == 2
    assert "session.v3.jsonl.zstd at byte 524" in result.stderr
    as_json = dsh(
        "sessions", "verify", "corrupt-checksum", "--root", str(root), "--json", cwd=tmp_path
    )
    assert as_json.returncode == 2
    assert "byte 524" in json.loads(as_json.stdout)["corrupt"]


def workdir(tmp_path: Path) -> Path:
    """A cwd (the default workspace) beside the copied session root, not around it: a root
    inside the workspace is refused at boot (D15)."""
    work = tmp_path / "work"
    work.mkdir()
    return work


def test_resume_repairs_and_prints_each_closer_then_continues(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    work = workdir(tmp_path)
    script = tmp_path / "script.yml"
    script.write_text("responses:\n  - text: picked up where we left off\n")
    result = dsh(
        "resume", "tool-missing-result", "--root", str(root), cwd=work,
    )
    assert result.returncode == 0, result.stderr
    assert "OUTCOME_UNKNOWN" in result.stdout or "NOT_STARTED" in result.stdout
    assert dsh("sessions", "verify", "tool-missing-result", "--root", str(root),
               cwd=work).returncode == 0
    again = dsh(
        "resume", "tool-missing-result", "continue please", "--root", str(root),
        "--model", f"scripted:{script}", "--json", "--workspace", str(work), cwd=work,
    )  # the fixture recorded /home/dev/project, which is not here: continue it in `work`
    assert again.returncode == 0, again.stderr
    payload = json.loads(again.stdout)
    assert payload["turnEnd"] == {"kind": "completed"}
    assert payload["closers"] == []


def test_resume_prints_call_ids_with_their_outcome(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    work = workdir(tmp_path)
    expected = json.loads((FIXTURES / "expected.json").read_text())[
        "root-zstd/--home-dev-project--/tool-missing-result/session.v3.jsonl.zstd"
    ]["closers"]
    want = [
        (c["data"]["message"]["source"]["callId"], c["data"]["error"]["code"])
        for c in expected
        if c["type"] == "tool/result"
    ]
    assert [code for _, code in want] == ["TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"]
    result = dsh("resume", "tool-missing-result", "--root", str(root), "--json", cwd=work)
    assert result.returncode == 0, result.stderr
    closers = json.loads(result.stdout)["closers"]
    got = [(c["callId"], c["code"]) for c in closers if c["type"] == "tool/result"]
    assert got == want
    human = dsh("resume", "tool-missing-result", "--root", str(copy_fixture_root(tmp_path / "b")),
                cwd=work)
    assert f"repair: {want[0][0]} OUTCOME_UNKNOWN" in human.stdout
    assert f"repair: {want[1][0]} NOT_STARTED" in human.stdout


def test_locked_session_exits_3(tmp_path: Path) -> None:
    root = copy_fixture_root(tmp_path)
    work = workdir(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, anyio
            from dsh_session_persistence_jsonl import JsonlSessionPersistence
            async def main():
                store = JsonlSessionPersistence({str(root)!r})
                handle = await store.open("clean", "write")
                print("held", flush=True)
                await anyio.sleep(60)
            anyio.run(main)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        result = dsh("resume", "clean", "--root", str(root), cwd=work)
        assert result.returncode == 3
        assert result.stderr.count("\n") == 1, result.stderr
        assert "already open for writing by another process" in result.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder died: the lock is free again
    assert dsh("resume", "clean", "--root", str(root), cwd=work).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sessions", "show", "no-such-session"), 'session "no-such-session" not found'),
        (("sessions", "verify", "no-such-session"), 'session "no-such-session" not found'),
        (("resume", "no-such-session"), 'session "no-such-session" not found'),
        (("run", "--model", "gpt-5"), "is not a model spec"),
        (("run", "--model", "scripted:/nonexistent.yml"), "does not exist"),
        (("run", "--config", "/nonexistent.yml"), "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = dsh(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("dsh: error: ")


def test_unreadable_root(tmp_path: Path) -> None:
    file_root = tmp_path / "not-a-dir"
    file_root.write_text("x")
    result = dsh("sessions", "list", "--root", str(file_root), cwd=tmp_path)
    assert result.returncode == 2
    assert "not a directory" in result.stderr


def test_scripted_model_and_exit_1_when_not_completed(tmp_path: Path) -> None:
    script = tmp_path / "s.yml"
    script.write_text("responses:\n  - text: one answer only\n")
    ok = dsh("run", "hello", "--model", f"scripted:{script}", "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    failing = tmp_path / "f.yml"
    failing.write_text(textwrap.dedent("""
        responses:
          - tool_calls:
              - name: read_file
                arguments: {path: missing.txt}
    """))
    result = dsh("run", "hello", "--model", f"scripted:{failing}", "--json", cwd=tmp_path)
    assert result.returncode == 1
    assert json.loads(result.stdout)["turnEnd"]["kind"] == "error"  # script exhausted


def test_tool_rules_ask_with_stdin_closed_is_unavailable_audited_not_run(tmp_path: Path) -> None:
    composition = tmp_path / "dsh.yml"
    composition.write_text(
        (REPO / "configs" / "default.yml").read_text()
        + textwrap.dedent("""
            - id: rules
              name: tool-rules
              config:
                rules:
                  - {tool: bash, decision: ask}
        """)
    )
    result = dsh("run", "--json", "--config", "dsh.yml", cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    session_id = json.loads(result.stdout)["sessionId"]
    events = json_lines(
        dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=tmp_path).stdout
    )
    decided = [e["data"]["outcome"] for e in events if e["type"] == "approval/decided"]
    asked = [e for e in events if e["type"] == "approval/asked"]
    assert decided == ["unavailable"] * 3 and len(asked) == 3
    assert not (tmp_path / ".dsh" / "demo-workspace" / "notes.txt").exists(), "body must not run"


def test_plugins_command(tmp_path: Path) -> None:
    result = dsh("plugins", "--config", str(REPO / "configs" / "default.yml"), "--json",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    for name, entry_point in {
        "session-persistence-jsonl": "dsh_session_persistence_jsonl:SessionPersistenceJsonl",
        "session-checkpoint-policy": "dsh_session_checkpoint_policy:SessionCheckpointPolicy",
        "user-approval": "dsh_user_approval:UserApproval",
        "sandbox-local": "dsh_sandbox_local:SandboxLocal",
        "llm-retry": "dsh_llm_retry:LlmRetry",
    }.items():
        assert rows[name]["entryPoint"] == entry_point
        assert rows[name]["state"] == "active"
    # the sandbox row says which backend it chose and why (a real probe on this host)
    [line] = rows["sandbox-local"]["status"]
    assert line.startswith("sandbox: bubblewrap: "), line
    assert "trial run passed" in line
    waiting = tmp_path / "waiting.yml"
    waiting.write_text("- id: checkpoints\n  name: session-checkpoint-policy\n")
    result = dsh("plugins", "--config", str(waiting), cwd=tmp_path)
    assert result.returncode == 1
    assert "waiting for services: llm, sessions, tools, sessionPersistence" in result.stdout


def test_openai_compatible_against_loopback_sse(tmp_path: Path) -> None:
    from llm.sse_server import SseServer, sse, text_events

    with SseServer([sse(text_events("Hello ", "from the wire."))]) as server:
        result = dsh(
            "run", "hi", "--model", "openai-compatible:deepseek-chat", "--json", cwd=tmp_path,
            env={"DEEPSEEK_BASE_URL": server.url, "DEEPSEEK_API_KEY": "test-key"},
        )
        assert len(server.requests) == 1
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["turnEnd"] == {"kind": "completed"}


def test_openai_compatible_transient_failures_are_retried(tmp_path: Path) -> None:
    """The shipped composition retries a 429 (Retry-After), a 500 and a cut stream: four
    requests reach the loopback server, the turn completes, and the log shows each retry."""
    from llm.sse_server import SseServer, http_error, sse, text_events

    script = [
        http_error(429, {"error": {"message": "slow down"}}, headers={"retry-after": "1"}),
        http_error(500, {"error": {"message": "upstream broke"}}),
        sse(text_events("discard me", done=False)[:2], close_early=True),
        sse(text_events("Recovered ", "answer.")),
    ]
    with SseServer(script) as server:
        result = dsh(
            "run", "hi", "--model", "openai-compatible:deepseek-chat",
            "--config", str(REPO / "configs" / "default.yml"), cwd=tmp_path,
            env={"DEEPSEEK_BASE_URL": server.url, "DEEPSEEK_API_KEY": "test-key"},
        )
        assert len(server.requests) == 4
    assert result.returncode == 0, result.stderr
    assert "↻ retry 1/5 in 1000ms after RATE_LIMIT: slow down" in result.stdout
    assert "Recovered answer." in result.stdout
    assert "Traceback" not in result.stderr
    [session_id] = [entry["sessionId"] for entry in json_lines(
        dsh("sessions", "list", "--json", cwd=tmp_path).stdout
    )]
    events = json_lines(
        dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=tmp_path).stdout
    )
    retries = [e["data"] for e in events if e["type"] == "llm/retry"]
    assert [(r["retry"], r["maxRetries"], r["failure"]["code"]) for r in retries] == [
        (1, 5, "RATE_LIMIT"), (2, 5, "SERVER"), (3, 5, "TRANSPORT"),
    ]
    assert retries[0]["delayMs"] == 1000 and retries[0]["failure"]["providerRetryAfterMs"] == 1000
    assert len({r["retryId"] for r in retries}) == 1
    started = [e["data"] for e in events if e["type"] == "llm/retry-started"]
    assert [s["retry"] for s in started] == [1, 2, 3]
    messages = [e["data"]["message"] for e in events if e["type"] == "assistant/message"]
    assert [block["text"] for block in messages[0]["content"]] == ["Recovered answer."]
    assert len(messages) == 1
    assert events[-1]["type"] == "turn/end" and events[-1]["data"]["reason"] == {
        "kind": "completed"
    }
    shown = dsh("sessions", "show", session_id, "--view", "events", cwd=tmp_path).stdout
    assert "retry 2/5" in shown and "after SERVER: upstream broke" in shown
    assert "retry 3 started" in shown


def test_run_session_flag_creates_then_continues(tmp_path: Path) -> None:
    script = tmp_path / "s.yml"
    script.write_text("responses:\n  - text: first\n  - text: second\n")
    first = dsh("run", "one", "--session", "my-work", "--new", "--model", f"scripted:{script}", "--json",
                cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["sessionId"] == "my-work"
    # a new process, a new script (the first one is used up): the session continues
    script.write_text("responses:\n  - text: continued\n")
    second = dsh("run", "two", "--session", "my-work", "--model", f"scripted:{script}", "--json",
                 cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    payload = json.loads(second.stdout)
    assert payload["sessionId"] == "my-work"
    assert payload["events"] > json.loads(first.stdout)["events"]
    events = json_lines(
        dsh("sessions", "show", "my-work", "--view", "events", "--json", cwd=tmp_path).stdout
    )
    assert [e["data"]["turn"] for e in events if e["type"] == "turn/end"] == [1, 2]


def test_quick_start_demo_works_without_bubblewrap(tmp_path: Path) -> None:
    """The README promises `dsh run` works with no bubblewrap installed (Landlock is in the
    kernel): hide bwrap from PATH and check the demo still confines its writes."""
    import shutil
    import tempfile

    # Outside /tmp: Landlock's isolated mode (root) gives each call a private /tmp, so a PATH
    # entry under the host /tmp would be invisible to the probe's trial command.
    bin_dir = Path(tempfile.mkdtemp(prefix="dsh-test-bin-", dir="/var/tmp"))
    try:
        for tool in ("bash", "sh", "ls", "cat", "grep", "tail", "touch", "true", "pwd", "env"):
            found = shutil.which(tool)
            assert found, tool
            (bin_dir / tool).symlink_to(found)
        work = tmp_path / "work"
        work.mkdir()
        result = dsh("run", cwd=work, env={"PATH": f"{Path(sys.executable).parent}:{bin_dir}"})
        assert result.returncode == 0, result.stderr
        assert "refused, as it should be" in result.stdout
        assert "SANDBOX_UNAVAILABLE" not in result.stdout
        assert (work / ".dsh" / "demo-workspace" / "notes.txt").exists()
    finally:
        shutil.rmtree(bin_dir)


def test_cli_verify_and_resume_on_a_zero_tailed_reference_log(tmp_path: Path) -> None:
    """The issue's reproduction: 4 zero bytes after a good DSH log. ``verify`` reports a torn
    tail (exit 1, not 2); ``resume`` cuts it and appends the closers; the log verifies clean."""
    root = copy_fixture_root(tmp_path)
    work = tmp_path / "work"  # beside the root: a root inside the workspace is refused (D15)
    work.mkdir()
    path = root / "--home-dev-project--" / "tool-missing-result" / "session.v3.jsonl.zstd"
    good = path.read_bytes()
    path.write_bytes(good + b"\x00" * 4)
    verify = dsh("sessions", "verify", "tool-missing-result", "--root", str(root), "--json",
                 cwd=work)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    report = json_lines(verify.stdout)[0]
    assert report["corrupt"] is None
    assert report["tornTail"] == {"truncateTo": len(good), "recovered": 0}
    assert report["events"] == 5
    resume = dsh("resume", "tool-missing-result", "--root", str(root), cwd=work)
    assert resume.returncode == 0, resume.stderr
    assert "Traceback" not in resume.stderr
    data = path.read_bytes()
    assert data.startswith(good) and b"\x00\x00\x00\x00" not in data[len(good) : len(good) + 4]
    again = dsh("sessions", "verify", "tool-missing-result", "--root", str(root), "--json",
                cwd=work)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json_lines(again.stdout)[0]["events"] >= 9  # the 4 closers were appended
