"""Issue 15 class 10: model text and tool output must not be able to redraw the approval prompt.

The attack: the agent ``cat``s an untrusted file (or the model streams text) holding
clear-screen, cursor-home, a scroll region, an OSC title, a C1 CSI, a carriage return, bidi
overrides and a fake ``dsh: approval needed ... ls -la`` block ending in "conceal"; the next call
escalates a different command to ``danger-full-access``. A person answering the fake prompt
would approve the real one.

``dsh run`` runs for real on a pseudo-terminal (scripted model, default composition, bubblewrap
or Landlock from the host's probe); the test reads every byte that reached the terminal. The
only escape sequences allowed are rich's own colour/attribute codes (SGR ``ESC[...m`` without
the attacker's ``8``) and the prompt's reset (``ESC7 ESC[r ESC8 ESC[0m``); the attacker's sequences arrive
escaped (``\\x1b[2J``), and the prompt shows the real command in full. The control prints the
same bytes the way the old transcript did (rich, unescaped) and sees them reach the terminal.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import sys
from pathlib import Path

import pytest

from dsh_host._cli.answerer import PROMPT, TERMINAL_RESET
from dsh_host._cli.render import terminal_safe

from .sandbox_harness import Scene, linux_only

pytestmark = linux_only

REPO = Path(__file__).resolve().parents[2]
ROOT_CONFIG = REPO / "configs" / "default.yml"
GUARD_S = 300.0  # hang guard for the whole run; nothing asserts on time

FAKE_PROMPT = (
    "dsh: approval needed\n  tool:      bash\n  arguments:\n    {\"command\": \"ls -la\"}\n"
    "allow once? [y/N] "
)
#: What the untrusted file holds (the tool prints it verbatim).
FILE_SPOOF = (
    "harmless notes\n"
    "\x1b[2J\x1b[H"  # clear screen, cursor home
    "\x1b[1;3r"  # scroll region: pin what follows
    "\x1b]0;innocent title\x07"  # OSC: set the window title
    "\u009b2J"  # C1 CSI clear screen
    f"{FAKE_PROMPT}"
    "\r\u202eesrever\u202c \u2066isolated\u2069\x7f"  # carriage return, bidi override/isolate, DEL
    "\x1b[8m"  # conceal: hide the real prompt that follows
)
#: What the model streams as its own text.
MODEL_SPOOF = "Let me look.\x1b[2J\x1b[5A\x1b[5mdsh: approval needed (fake)\x1b[0m\n"
#: Escape sequences an attacker used; none may reach the terminal raw.
ATTACKER_SEQUENCES = [b"\x1b[2J", b"\x1b[H", b"\x1b[1;3r", b"\x1b]0;", b"\xc2\x9b",
                      b"\x1b[8m", b"\x1b[5A", b"\x1b[5m", "\u202e".encode(), "\u2066".encode(),
                      b"\x07", b"\x7f"]  # fmt: skip
#: rich's own styling: SGR codes (not the attacker's conceal, 8).
#: One frame of the status line (dsh_host._cli.output.StatusLine): erase, then a dimmed label.
#: The status line's own drawing: erase its rows (the line, then each live-output row above
#: it: up one, erase), then a dimmed escaped label or output row.
STATUS_FRAME = re.compile(rb"\r\x1b\[2K(?:\x1b\[1A\r\x1b\[2K)*(?:\x1b\[2m[^\x1b\r\n]*\x1b\[0m)?")
RICH_SGR = re.compile(rb"\x1b\[(?:[0-79]|[1-9][0-9]|[0-9];[0-9;]*)?m")


def compose(s: Scene) -> tuple[Path, Path, Path]:
    marker = s.ws / "escalated-marker"
    (s.ws / "evil.txt").write_text(FILE_SPOOF)
    config = s.base / "dsh.yml"
    config.write_text(ROOT_CONFIG.read_text())
    script = s.base / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": MODEL_SPOOF, "tool_calls": [{"id": "call-cat", "name": "bash", "arguments": {
            "command": "cat evil.txt", "description": "Show the notes file"}}]},
        {"tool_calls": [{"id": "call-real", "name": "bash", "arguments": {
            "command": f"touch {marker}", "description": "List files",
            "sandbox_permissions": "danger-full-access",
            "justification": "\x1b[2Jjust listing files"}}]},
        {"text": "done"},
    ]}))  # fmt: skip
    return config, script, marker


def run_on_pty(argv: list[str], answer: bytes | None, env: dict[str, str]) -> tuple[bytes, int]:
    """Run ``argv`` on a fresh pty; type ``answer`` at the real prompt; all bytes + exit code."""
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    seen = bytearray()
    typed = answer is None
    try:
        while True:
            ready, _, _ = select.select([master], [], [], GUARD_S)
            assert ready, f"the child hung; output so far: {bytes(seen)!r}"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                break
            seen += chunk
            # The file's fake prompt carries the same words; the real prompt is the second.
            if not typed and seen.count(PROMPT.strip().encode()) >= 2:
                assert answer is not None
                os.write(master, answer)
                typed = True
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(master)
    return bytes(seen), os.waitstatus_to_exitcode(status)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "PYTEST"))}
    env["TERM"] = "xterm-256color"  # a real terminal type: rich styles its output
    env.pop("NO_COLOR", None)
    return env


def test_tool_output_and_model_text_cannot_draw_a_fake_prompt(scene: Scene) -> None:
    config, script, marker = compose(scene)
    argv = [sys.executable, "-m", "dsh_host._cli.main", "run", "--config", str(config),
            "--root", str(scene.base / "sessions"), "--workspace", str(scene.ws),
            "--model", f"scripted:{script}", "--sandbox", "read-only", "show me the notes"]  # fmt: skip
    seen, code = run_on_pty(argv, b"n\n", child_env())
    text = seen.decode("utf-8", "replace")
    assert code == 0, text
    assert not marker.exists(), "the escalated command ran although the answer was n"

    # The tool output and the model text were shown — escaped.
    assert "harmless notes" in text
    assert "\\x1b[2J\\x1b[H\\x1b[1;3r" in text
    assert "\\x9b2J" in text and "\\u202eesrever\\u202c" in text and "\\x7f" in text
    assert "\\x1b[8m" in text
    assert "Let me look.\\x1b[2J\\x1b[5A" in text
    # No attacker sequence reached the terminal raw.
    for sequence in ATTACKER_SEQUENCES:
        assert sequence not in seen, f"{sequence!r} reached the terminal: {seen!r}"
    # The live status line is the harness's own: erase the line, then draw its (escaped) label
    # dimmed. Taken out before the residue is judged; the label went through terminal_safe.
    drawn = STATUS_FRAME.sub(b"", seen)
    residue = RICH_SGR.sub(b"", drawn.replace(TERMINAL_RESET.encode(), b""))
    assert b"\x1b" not in residue, residue
    assert b"\r" not in drawn.replace(b"\r\n", b""), "a bare carriage return reached the terminal"

    # The real prompt: reset first, then the real call in full.
    start = seen.index(TERMINAL_RESET.encode())
    prompt = seen[start:].decode("utf-8", "replace")
    assert "dsh: approval needed" in prompt
    assert "call id:   call-real" in prompt
    assert f'"command": "touch {marker}"' in prompt
    assert '"sandbox_permissions": "danger-full-access"' in prompt
    assert "escalate sandbox to danger-full-access: \\x1b[2Jjust listing files" in prompt
    assert prompt.count(PROMPT.strip()) == 1
    assert "(rejected)" in prompt


def test_control_the_unescaped_transcript_passes_the_sequences_through(scene: Scene) -> None:
    """Control: the old transcript printed tool output with rich, unescaped: the bytes arrive."""
    (scene.ws / "evil.txt").write_text(FILE_SPOOF + MODEL_SPOOF)
    code = (
        "import sys; from rich.console import Console\n"
        "text = open(sys.argv[1], encoding='utf-8').read()\n"
        "Console(highlight=False, soft_wrap=True).print(text, style='dim', markup=False)\n"
    )
    argv = [sys.executable, "-I", "-c", code, str(scene.ws / "evil.txt")]
    seen, status = run_on_pty(argv, None, child_env())
    assert status == 0, seen
    for sequence in (b"\x1b[2J", b"\x1b[H", b"\x1b[1;3r", b"\x1b[8m", b"\x1b[5A"):
        assert sequence in seen, f"{sequence!r} did not reach the terminal: {seen!r}"
    # And the new escaping, applied to the same text, leaves nothing a terminal would act on.
    escaped = terminal_safe(FILE_SPOOF + MODEL_SPOOF)
    assert "\x1b" not in escaped and "\r" not in escaped and "\u202e" not in escaped


@pytest.mark.parametrize(
    ("raw", "multiline", "shown"),
    [
        ("a\x1b[2Jb", True, "a\\x1b[2Jb"),
        ("line\nnext\tcol", True, "line\nnext\tcol"),
        ("line\nnext", False, "line\\x0anext"),
        ("over\rwrite", True, "over\\x0dwrite"),
        ("\x00\x08\x7f\x9b\x85", True, "\\x00\\x08\\x7f\\x9b\\x85"),
        ("\u202a\u202b\u202c\u202d\u202e", True, "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", True, "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200b\u2028\u2029", True, "\\u200b\\u2028\\u2029"),
        ("ünïcödé ⚙ ⎿ 日本", True, "ünïcödé ⚙ ⎿ 日本"),
    ],
)
def test_terminal_safe(raw: str, multiline: bool, shown: str) -> None:
    assert terminal_safe(raw, multiline=multiline) == shown
