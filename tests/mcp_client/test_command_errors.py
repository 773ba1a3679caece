"""A stdio server's ``command`` that names no executable is refused at load, naming it.

It used to fail at the first connection as one line from inside the sandbox that named no
command ("landlock-run: exec failed: No such file or directory"), and ``dsh run`` went on
without the server's tools and exited 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dsh_host.errors import BootError

from .mcp_helpers import dsh, mcp_host

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("pytohn3", 'did you mean "python3"?'),
        ("no-such-mcp-server-anywhere", "install it or give its full path"),
        ("./bin/server.py", "does not exist"),
    ],
)
async def test_a_command_that_names_no_executable_fails_the_row(
    command: str, expected: str, tmp_path: Path
) -> None:
    assert shutil.which("python3") is not None
    config = {"serverName": "x", "transport": "stdio", "command": command,
              "workspace": str(tmp_path)}
    with pytest.raises(BootError) as raised:
        async with mcp_host(config):
            pass
    message = str(raised.value)
    assert f"mcp-client(x): command {command!r}" in message and expected in message, message


async def test_a_file_without_the_execute_bit_is_named(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text("#!/bin/sh\nexit 3\n")
    config = {"serverName": "x", "transport": "stdio", "command": "./server.py",
              "workspace": str(tmp_path)}
    with pytest.raises(BootError, match="is not executable"):
        async with mcp_host(config):
            pass
    script.chmod(0o755)  # the control: the same row passes the check (the server then fails
    # its handshake, which is the connection's business and leaves the row running)
    async with mcp_host(config):
        pass


def test_dsh_run_exits_2_naming_the_command(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    default = (Path(__file__).parents[2] / "configs" / "default.yml").read_text()
    config.write_text(default + (
        "- name: mcp-client\n  id: mcp-x\n  config:\n    serverName: x\n"
        "    transport: stdio\n    command: pytohn3\n    args: [stdio]\n"))
    ran = dsh("run", "--config", str(config), "--model", "demo", "hi", cwd=tmp_path)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    assert "command 'pytohn3'" in ran.stderr and 'did you mean "python3"?' in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not os.path.exists(tmp_path / ".dsh" / "demo-workspace" / "notes.txt")
