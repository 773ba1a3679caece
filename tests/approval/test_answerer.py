"""The terminal answerer: rendering, the no-TTY rule, and real pseudo-terminal sessions."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host._cli.answerer import (
    PROMPT,
    TerminalAnswerer,
    install_terminal_answerer,
    is_interactive,
    render_request,
)
from dsh_host._tools import ApprovalRequest

from .harness import TurnAgent, booted, new_agent

# both backends: a terminal answerer child on each backend (threads, PTY)
pytestmark = pytest.mark.both_backends

CHILD = Path(__file__).with_name("answerer_child.py")
#: Hang guard for reading the child's terminal (not a timing assertion).
GUARD_SECONDS = 120.0


# --------------------------------------------------------------------------- rendering


@pytest.mark.anyio
async def test_render_shows_logged_arguments_escaped() -> None:
    async with booted(rules=None) as (host, _):
        agent = new_agent(host)
        raw = '{"command": "echo hi\\u001b[2J", "path": "a\\u202eb"}'
        agent.session.append(
            "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "bash", "arguments": raw}
        )
        text = render_request(
            ApprovalRequest(agent=agent, tool_name="bash", call_id="c1", reason="why\x1b[31m")
        )
        assert "  tool:      bash\n" in text
        assert "  call id:   c1\n" in text
        assert "  reason:    why\\x1b[31m\n" in text
        assert '"command": "echo hi\\u001b[2J"' in text
        assert '"path": "a\\u202eb"' in text
        assert "\x1b" not in text and "\u202e" not in text


@pytest.mark.anyio
async def test_render_without_a_logged_call_and_long_arguments() -> None:
    async with booted(rules=None) as (host, _):
        agent = new_agent(host)
        text = render_request(ApprovalRequest(agent=agent, tool_name="bash"))
        assert "call id:   (none)" in text and "reason:    (none given)" in text
        assert "arguments: (no tool/call logged for this call id)" in text
        big = json.dumps({"content": "x" * 10_000})
        agent.session.append(
            "tool/call", {"turn": 1, "step": 1, "callId": "big", "name": "w", "arguments": big}
        )
        text = render_request(ApprovalRequest(agent=agent, tool_name="w", call_id="big"))
        assert "more characters not shown" in text
        assert len(text) < 5000


# --------------------------------------------------------------------------- no TTY


@pytest.mark.anyio
async def test_no_tty_registers_nothing_and_requests_are_unavailable() -> None:
    read_end, write_end = os.pipe()
    try:
        assert not is_interactive(read_end)
        assert not is_interactive(9999)  # not an open descriptor
        async with booted(rules=None) as (host, _):
            assert install_terminal_answerer(host.ctx, input_fd=read_end) is None
            assert host.ctx.host.bus.listeners("approval/request") == []
            agent: TurnAgent = new_agent(host)
            outcome = await host.ctx.approval.request(
                ApprovalRequest(agent=agent, tool_name="bash", call_id="c")
            )
            assert outcome == "unavailable"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_answerer_is_a_valid_waterfall_listener() -> None:
    # The bus checks kind and arity at registration; an instance must pass as async (req, next).
    from dsh_host._bus import EventBus

    bus = EventBus()
    bus.add("approval/request", TerminalAnswerer(input_fd=0), None)


def test_closed_stdin_run_has_no_answerer(tmp_path: Path, anyio_backend: str) -> None:
    """The child with stdin closed: nothing installed, request unavailable, audited."""
    result = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(CHILD), anyio_backend, str(result)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=GUARD_SECONDS,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(result.read_text())
    assert data["installed"] is False
    assert data["outcome"] == "unavailable"
    assert [e["data"].get("outcome") for e in data["audit"]] == [None, "unavailable"]
    assert PROMPT.encode() not in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- pseudo-terminal


def _read_until(fd: int, needle: bytes, seen: bytearray) -> None:
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], GUARD_SECONDS)
        if not ready:
            raise AssertionError(f"child never printed {needle!r}; output so far: {bytes(seen)!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            raise AssertionError(f"child exited before {needle!r}; output: {bytes(seen)!r}")
        seen += chunk


def _drain(fd: int, seen: bytearray) -> None:
    while True:
        ready, _, _ = select.select([fd], [], [], GUARD_SECONDS)
        if not ready:
            raise AssertionError(f"child did not finish; output: {bytes(seen)!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return
        if not chunk:
            return
        seen += chunk


def run_on_pty(backend: str, keys: bytes, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Run the child on a fresh pseudo-terminal, type ``keys`` at the prompt, return results."""
    result = tmp_path / "result.json"
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execv(sys.executable, [sys.executable, str(CHILD), backend, str(result)])
        finally:
            os._exit(127)
    seen = bytearray()
    try:
        _read_until(master, PROMPT.strip().encode(), seen)
        os.write(master, keys)
        _drain(master, seen)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(master)
    output = seen.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, output
    return json.loads(result.read_text()), output


@pytest.mark.parametrize(
    ("keys", "outcome", "closing"),
    [
        (b"y\n", "allowed-once", "(allowed once)"),
        (b"Yes\n", "allowed-once", "(allowed once)"),
        (b"n\n", "rejected", "(rejected)"),
        (b"\n", "rejected", "(rejected)"),
        (b"sure\n", "rejected", "(rejected)"),
        (b"\x04", "rejected", "(rejected)"),  # Ctrl-D: end of file
        (b"\x03", "cancelled", "(cancelled)"),  # Ctrl-C
    ],
    ids=["y", "yes", "n", "enter", "other", "ctrl-d", "ctrl-c"],
)
def test_pty_answers(
    keys: bytes, outcome: str, closing: str, tmp_path: Path, anyio_backend: str
) -> None:
    data, output = run_on_pty(anyio_backend, keys, tmp_path)
    assert data["installed"] is True
    assert data["outcome"] == outcome
    asked, decided = data["audit"]
    assert asked["type"] == "approval/asked" and decided["type"] == "approval/decided"
    assert asked["data"]["toolName"] == "bash"
    assert asked["data"]["callId"] == "call-42"
    assert asked["data"]["reason"] == "tool-rules: shell needs a human"
    assert decided["data"] == {"id": asked["data"]["id"], "outcome": outcome}
    # What the person saw: tool, call id, reason and the logged arguments (escaped).
    assert "tool:      bash" in output
    assert "call id:   call-42" in output
    assert "reason:    tool-rules: shell needs a human" in output
    assert '"command": "rm -rf build \\u001b[2J"' in output
    assert "\x1b[2J" not in output
    assert PROMPT.strip() in output
    assert closing in output


@pytest.mark.anyio
async def test_arguments_too_long_to_show_in_full_are_rejected_unasked() -> None:
    """Nobody can approve what they cannot see: past the limit the call is refused, not asked."""
    import io

    read_end, write_end = os.pipe()
    try:
        out = io.StringIO()  # not a terminal: no reset sequence is written
        async with booted(rules=None) as (host, _):
            agent = new_agent(host)
            for call_id, size in (("big", 10_000), ("small", 10)):
                raw = json.dumps({"command": "x" * size})
                agent.session.append(
                    "tool/call",
                    {"turn": 1, "step": 1, "callId": call_id, "name": "bash", "arguments": raw},
                )
            host.ctx.on("approval/request", TerminalAnswerer(input_fd=read_end, output=out))
            os.write(write_end, b"y\n")  # an answer is waiting; the big call must not read it
            big = await host.ctx.approval.request(
                ApprovalRequest(agent=agent, tool_name="bash", call_id="big")
            )
            shown_big = out.getvalue()
            # Control: the same answerer, a call that fits, reads the waiting "y" and allows.
            with anyio.fail_after(GUARD_SECONDS):  # hang guard: the old code ate the "y" above
                small = await host.ctx.approval.request(
                    ApprovalRequest(agent=agent, tool_name="bash", call_id="small")
                )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert big == "rejected"
    assert "6019 more characters not shown" in shown_big
    assert shown_big.endswith("(rejected: too long to show in full)\n")
    assert PROMPT not in shown_big and "\x1b" not in shown_big
    assert small == "allowed-once"
