"""``dsh chat`` (and ``dsh`` alone) on a real pseudo-terminal, as a person uses it.

Each test forks ``dsh`` onto a pty, waits for what a person would wait for
(the ``dsh>`` prompt, the approval question, a tool call line) and types keys:
Enter is ``\\r`` (the line editor reads raw keys), Ctrl-C is ``\\x03`` (at the
prompt a key, during a turn the terminal's SIGINT), Ctrl-D is ``\\x04``. The
outcome is judged from the stored log (``dsh sessions show --view events``)
and the files the tools wrote, not from the screen alone.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

DSH = [sys.executable, "-m", "dsh_host"]
ROOT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yml"
PROMPT = b"dsh>"  # the line editor draws the space after it as a cursor move
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")


class Terminal:
    """``dsh`` on a pty: :meth:`expect` what it shows, :meth:`type` keys, :meth:`close`."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> None:
        child_env = dict(os.environ)
        child_env.pop("DSH_SESSION_ROOT", None)
        child_env.update(
            {"TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "DSH_INTERRUPT_GRACE_S": "60"}
        )
        child_env.update(env or {})
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.chdir(cwd)
                os.execve(sys.executable, [sys.executable, *argv[1:]], child_env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.seen = bytearray()
        self._mark = 0  # expect() searches what arrived after the last match
        self.exit_code: int | None = None

    @property
    def text(self) -> str:
        """Everything shown so far, escape sequences removed."""
        return _ANSI.sub(b"", bytes(self.seen)).decode("utf-8", "replace")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            raise EOFError
        self.seen += chunk
        return True

    def expect(self, wanted: bytes, timeout: float = 120) -> None:
        while True:
            plain = _ANSI.sub(b"", bytes(self.seen[self._mark :]))
            at = plain.find(wanted)
            if at >= 0:
                # Move the mark past the match in the raw buffer (escape sequences included).
                raw = bytes(self.seen)
                for end in range(self._mark, len(raw) + 1):
                    if wanted in _ANSI.sub(b"", raw[self._mark : end]):
                        self._mark = end
                        return
            try:
                got = self._read(timeout)
            except EOFError:
                raise AssertionError(f"dsh exited before showing {wanted!r}:\n{self.text}") from None
            assert got, f"no {wanted!r} within {timeout} s; the terminal shows:\n{self.text}"

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def close(self, timeout: float = 120) -> int:
        """Read to the end of output and reap the process; its exit code."""
        try:
            while self._read(timeout):
                pass
        except EOFError:
            pass
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code


def write_script(path: Path, responses: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"responses": responses}))
    return path


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "tool_calls": [
            {"id": call_id, "name": "bash",
             "arguments": {"command": command, "description": "a test command"}}
        ]
    }


def compose(tmp_path: Path, *, ask_bash: bool = False, compaction: bool = True) -> Path:
    """The shipped default composition; ``compaction=False`` leaves out its token-meter and
    compaction rows."""
    config = tmp_path / "dsh.yml"
    text = ROOT_CONFIG.read_text()
    if not compaction:
        for name in ("token-meter", "compaction-tool-result-pruner", "compaction-basic"):
            row = f"- id: {name}\n  name: {name}\n"
            assert row in text, name
            text = text.replace(row, "")
    if ask_bash:
        text += (
            "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
            "      - {tool: bash, decision: ask, reason: shell commands need a human}\n"
        )
    config.write_text(text)
    return config


def events_of(config: Path, root: Path, session_id: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [*DSH, "sessions", "show", session_id, "--config", str(config), "--root", str(root),
         "--view", "events", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def session_ids(text: str) -> list[str]:
    return re.findall(r"^session (\S+?)\r?$", text, flags=re.MULTILINE)


def chat(tmp_path: Path, config: Path, script: Path, *extra: str) -> tuple[Terminal, Path]:
    """``dsh chat`` started in ``tmp_path``; without a ``--workspace`` in ``extra`` the tools
    work in ``tmp_path/ws`` (beside the session root, never above it)."""
    root = tmp_path / "sessions"
    if "--workspace" not in extra:
        (tmp_path / "ws").mkdir(exist_ok=True)
        extra = ("--workspace", str(tmp_path / "ws"), *extra)
    argv = [*DSH, "chat", "--config", str(config), "--root", str(root),
            "--model", f"scripted:{script}", "--sandbox", "danger-full-access", *extra]
    return Terminal(argv, cwd=tmp_path), root


def test_a_turn_with_an_approval_asked_inline_then_ctrl_d(tmp_path: Path) -> None:
    """The prompt, one turn whose tool call is approved inline, /usage, /compact without a
    compaction plugin, /help, Ctrl-D: exit 0, the prompt kept in the history file."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = workspace / "marker"
    config = compose(tmp_path, ask_bash=True, compaction=False)
    script = write_script(
        tmp_path / "script.json",
        [bash_call("call-touch", f"touch {marker}"), {"text": "The marker is there."}],
    )
    term, root = chat(tmp_path, config, script, "--workspace", str(workspace))
    term.expect(b"/help for commands")
    term.expect(PROMPT)
    term.type(b"make the marker\r")
    term.expect(b"allow once? [y/N]")
    term.type(b"y\n")
    term.expect(b"(allowed once)")
    term.expect(b"The marker is there.")
    term.expect(b"turn 1 ended: completed")
    term.expect(PROMPT)
    term.type(b"/usage\r")
    term.expect(b"cost: unknown: no price for scripted")
    term.expect(PROMPT)
    term.type(b"/compact\r")
    term.expect(b"no compaction plugin is loaded; add compaction-basic to the composition")
    term.expect(PROMPT)
    term.type(b"/help\r")
    term.expect(b"/resume ID")
    term.expect(PROMPT)
    term.type(b"\x04")  # Ctrl-D
    assert term.close() == 0, term.text
    assert "Traceback" not in term.text
    assert marker.exists()
    [session_id] = session_ids(term.text)
    events = events_of(config, root, session_id)
    decided = [e["data"]["outcome"] for e in events if e["type"] == "approval/decided"]
    assert decided == ["allowed-once"]
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert ends == ["completed"]
    history = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "chat-history"
    assert "make the marker" in history.read_text()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600  # every prompt typed: owner only


def test_ctrl_c_mid_turn_cancels_the_turn_and_the_prompt_returns(tmp_path: Path) -> None:
    """Ctrl-C while a tool runs: the turn ends aborted with its call closed in the log, the
    program stays, the next prompt runs a second turn on the same session."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = compose(tmp_path)
    script = write_script(
        tmp_path / "script.json",
        [bash_call("call-sleep", "echo started > started; sleep 120"),
         {"text": "Second turn answer."}],
    )
    term, root = chat(tmp_path, config, script, "--workspace", str(workspace))
    term.expect(PROMPT)
    term.type(b"wait a while\r")
    term.expect(b"bash [call-sleep]")
    started = workspace / "started"
    for _ in range(600):  # the body is running (the shell wrote its file)
        if started.exists():
            break
        select.select([], [], [], 0.1)
    assert started.exists(), term.text
    term.type(b"\x03")  # Ctrl-C: the terminal sends SIGINT to dsh
    term.expect(b"cancelling the turn")
    term.expect(b"turn 1 ended: aborted")
    term.expect(PROMPT)
    term.type(b"go on\r")
    term.expect(b"Second turn answer.")
    term.expect(b"turn 2 ended: completed")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    assert "Traceback" not in term.text
    [session_id] = session_ids(term.text)
    events = events_of(config, root, session_id)
    ends = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert ends == ["aborted", "completed"]
    results = [e["data"] for e in events if e["type"] == "tool/result"]
    assert [r["message"]["content"][0]["toolCallId"] for r in results] == ["call-sleep"]
    assert results[0]["message"]["content"][0]["isError"] is True


def test_ctrl_c_at_the_prompt_clears_the_line(tmp_path: Path) -> None:
    """Ctrl-C with no turn running does not exit; what was typed is dropped."""
    config = compose(tmp_path)
    script = write_script(tmp_path / "script.json", [{"text": "Only answer."}])
    term, root = chat(tmp_path, config, script)
    term.expect(PROMPT)
    term.type(b"half a thought")
    term.expect(b"half a thought")
    term.type(b"\x03")
    term.expect(PROMPT)
    term.type(b"hello\r")
    term.expect(b"Only answer.")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    [session_id] = session_ids(term.text)
    prompts = [
        e["data"]["content"][0]["text"] for e in events_of(config, root, session_id)
        if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"
    ]
    assert prompts == ["hello"]  # the dropped line was never sent


def test_resume_continues_a_stored_session_in_its_recorded_workspace(tmp_path: Path) -> None:
    """/sessions lists a session made by `dsh run`; /resume ID continues it, and its tools
    work in the workspace the session recorded, not the chat's directory."""
    first_ws = tmp_path / "first-ws"
    first_ws.mkdir()
    config = compose(tmp_path)
    root = tmp_path / "sessions"
    first = write_script(tmp_path / "first.json", [{"text": "First answer."}])
    run = subprocess.run(
        [*DSH, "run", "--config", str(config), "--root", str(root), "--workspace",
         str(first_ws), "--model", f"scripted:{first}", "--json", "first question"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout.splitlines()[-1])["sessionId"]

    chat_dir = tmp_path / "elsewhere"
    chat_dir.mkdir()
    script = write_script(
        tmp_path / "second.json",
        [bash_call("call-pwd", "pwd > where.txt"), {"text": "Noted where I am."}],
    )
    argv = [*DSH, "chat", "--config", str(config), "--root", str(root),
            "--model", f"scripted:{script}", "--sandbox", "danger-full-access"]
    term = Terminal(argv, cwd=chat_dir)
    term.expect(PROMPT)
    term.type(b"/sessions\r")
    term.expect(session_id.encode())
    term.expect(PROMPT)
    term.type(f"/resume {session_id}\r".encode())
    term.expect(b"restarting the tools there")
    term.expect(f"session {session_id} · turn 1 so far".encode())
    term.expect(PROMPT)
    term.type(b"where are you\r")
    term.expect(b"Noted where I am.")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    assert (first_ws / "where.txt").read_text().strip() == str(first_ws)
    assert not (chat_dir / "where.txt").exists()
    events = events_of(config, root, session_id)
    prompts = [
        e["data"]["content"][0]["text"] for e in events
        if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"
    ]
    assert prompts == ["first question", "where are you"]
    # the chat's explicit flags changed the session's terms, and that is logged before the turn
    created, override = [e["data"] for e in events if e["type"] == "run/terms"]
    assert created["sandbox"]["mode"] == "workspace-write" and created["by"] == "dsh run"
    assert override["reason"] == "override" and override["by"] == "dsh chat /resume"
    assert override["changed"] == ["model", "sandbox"]
    assert override["sandbox"]["mode"] == "danger-full-access"
    assert override["workspace"] == str(first_ws)


def test_dsh_alone_opens_the_chat_on_a_terminal(tmp_path: Path) -> None:
    """`dsh` with no subcommand on a terminal is the chat (off a terminal: help, exit 2). The
    chat needs a model (the demo script runs only for a new `dsh run`): here the composition
    names one."""
    config = compose(tmp_path)
    config.write_text(
        config.read_text().replace(
            "- id: agent\n  name: agent\n  config:\n",
            "- id: agent\n  name: agent\n  config:\n    provider: scripted\n"
            "    model: scripted\n",
        )
        + "\n- id: model\n  name: llm-scripted\n  config:\n    responses: [{text: hi}]\n"
    )
    env = {"DSH_CONFIG": str(config), "DSH_SESSION_ROOT": str(tmp_path / "sessions")}
    home = tmp_path / "home"
    home.mkdir()
    term = Terminal([*DSH], cwd=home, env=env)
    term.expect(b"dsh chat \xc2\xb7 workspace")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    piped = subprocess.run(
        DSH, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env}, cwd=home, check=False,
    )
    assert piped.returncode == 2
    assert "usage: dsh" in piped.stdout + piped.stderr


def test_ctrl_c_at_the_approval_prompt_cancels_the_turn_not_the_chat(tmp_path: Path) -> None:
    """Ctrl-C at ``allow once?`` cancels the ask and the turn (D18), the chat goes on; /new
    then starts a second session."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = workspace / "marker"
    config = compose(tmp_path, ask_bash=True)
    script = write_script(
        tmp_path / "script.json",
        [bash_call("call-touch", f"touch {marker}"), {"text": "Fresh start."}],
    )
    term, root = chat(tmp_path, config, script, "--workspace", str(workspace))
    term.expect(PROMPT)
    term.type(b"make the marker\r")
    term.expect(b"allow once? [y/N]")
    term.type(b"\x03")
    term.expect(b"(cancelled)")
    term.expect(b"turn 1 ended: aborted")
    term.expect(PROMPT)
    term.type(b"/new\r")
    term.expect(b"a new session starts with your next prompt")
    term.expect(PROMPT)
    term.type(b"hello again\r")
    term.expect(b"Fresh start.")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    assert not marker.exists()
    first, second = session_ids(term.text)
    assert first != second
    events = events_of(config, root, first)
    assert [e["data"]["outcome"] for e in events if e["type"] == "approval/decided"] == [
        "cancelled"
    ]
    results = [e["data"] for e in events if e["type"] == "tool/result"]
    assert [r["error"]["code"] for r in results] == ["ABORTED_BEFORE_DISPATCH"]
    assert [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"] == [
        "aborted"
    ]


def test_compact_and_usage_use_the_composed_plugins(tmp_path: Path) -> None:
    """With the shipped composition (token-meter, compaction-basic), /compact calls the real
    ``compaction`` service on the current session and answers with DSH's text, and /usage prints
    the token meter's usage and context lines."""
    config = compose(tmp_path)
    # The second answer is the summary: the summarization request takes the script's next entry.
    script = write_script(
        tmp_path / "script.json",
        [{"text": "Noted."}, {"text": "The user listed items 0 to 149."}],
    )
    root = tmp_path / "sessions"
    (tmp_path / "ws").mkdir()
    argv = [*DSH, "chat", "--config", str(config), "--root", str(root), "--workspace",
            str(tmp_path / "ws"), "--model", f"scripted:{script}"]
    term = Terminal(argv, cwd=tmp_path)
    term.expect(PROMPT)
    term.type(b"/compact\r")
    term.expect(b"no session yet: nothing to compact")
    term.expect(PROMPT)
    # Long enough that the summary (framed) is smaller than what it replaces.
    words = " ".join(f"item{i}" for i in range(150))
    term.type(f"remember these: {words}\r".encode())
    term.expect(b"Noted.")
    term.expect(PROMPT)
    term.type(b"/compact\r")
    term.expect(b"Compacted ")  # DSH's text: "Compacted N history items (~T tokens)."
    term.expect(b" history items (~")
    term.expect(PROMPT)
    term.type(b"/usage\r")
    term.expect(b"context: ~")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    # The summary request is maintenance, not the assistant speaking: not streamed live.
    assert "The user listed items" not in term.text


def test_sessions_lists_this_workspace_first_with_titles_and_resume_recaps(
    tmp_path: Path,
) -> None:
    """/sessions puts this workspace's sessions first, each with its title (first prompt);
    /resume prints a recap of the last turns; a typed prompt is shown once (as typed), not
    echoed again as ``you: ...``."""
    config = compose(tmp_path)
    root = tmp_path / "sessions"
    ids = {}
    for name in ("here", "there"):  # "there" is newer: only the workspace puts "here" first
        (tmp_path / name).mkdir()
        script = write_script(tmp_path / f"{name}.json", [{"text": f"Answer in {name}."}])
        run = subprocess.run(
            [*DSH, "run", "--config", str(config), "--root", str(root), "--workspace",
             str(tmp_path / name), "--model", f"scripted:{script}", "--json",
             f"question from {name}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
        )
        assert run.returncode == 0, run.stderr
        ids[name] = json.loads(run.stdout.splitlines()[-1])["sessionId"]
    script = write_script(tmp_path / "chat.json", [{"text": "Resumed answer."}])
    term, _ = chat(tmp_path, config, script, "--workspace", str(tmp_path / "here"))
    term.expect(PROMPT)
    term.type(b"/sessions\r")
    term.expect(b"other workspaces:")
    term.expect(PROMPT)
    listed = term.text.splitlines()
    rows = [line for line in listed if ids["here"] in line or ids["there"] in line]
    assert len(rows) == 2 and ids["here"] in rows[0], term.text
    assert "question from here" in rows[0] and "question from there" in rows[1], term.text
    assert any(line.startswith("this workspace (") for line in listed), term.text
    term.type(f"/resume {ids['here']}\r".encode())
    term.expect(f"session {ids['here']} · turn 1 so far".encode())
    term.expect(b"you: question from here")
    term.expect(b"Answer in here.")
    term.expect(b"turn 1 ended: completed")
    term.expect(PROMPT)
    term.type(b"once only\r")
    term.expect(b"Resumed answer.")
    term.expect(PROMPT)
    term.type(b"\x04")
    assert term.close() == 0, term.text
    # not echoed back as a transcript line (the line editor may redraw the typed line itself:
    # under load the raw stream can hold the prompt and the typed text twice, which is not an echo)
    assert "once only" in term.text and "you: once only" not in term.text, term.text
    # The recap is the conversation, not the system prompt or runtime-context snapshots.
    assert "system:" not in term.text and "dsh-system-prompt" not in term.text, term.text
    assert "you: once only" not in term.text, term.text
