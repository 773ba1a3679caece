"""``dsh --help`` and ``dsh sessions list`` do not import what they do not use.

Start-up time is measured in ``bench/startup.py`` (never asserted here); these tests pin the
cause: ``-X importtime`` lists every module a real ``dsh`` process imported. Before, ``dsh
--help`` imported the loader, the agent loop, rich and anyio (every subcommand's module), and
``dsh sessions list`` imported trio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from dsh_host.cli.main import COMMANDS, build_parser


def imported(*args: str, cwd: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dsh_host", *args], cwd=cwd, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_help_imports_no_command_module(tmp_path: Path) -> None:
    modules = imported("--help", cwd=tmp_path)
    heavy = {"dsh_host.loader", "dsh_host.agent", "dsh_host.cli.run_cmd", "rich", "anyio",
             "trio", "pluggy", "msgspec", "yaml", "importlib.metadata", "prompt_toolkit"}
    assert not heavy & modules, sorted(heavy & modules)


def test_sessions_list_runs_without_trio(tmp_path: Path) -> None:
    modules = imported("sessions", "list", "--root", str(tmp_path / "sessions"), cwd=tmp_path)
    assert not {"trio", "dsh_host.cli.run_cmd", "dsh_host.cli.chat_cmd",
                "prompt_toolkit"} & modules


def test_the_help_lines_are_the_commands_own() -> None:
    """``dsh --help`` lists COMMANDS' lines without importing the modules: they must say what
    each module's own parser says (its ``dsh COMMAND --help``)."""
    parser = build_parser()  # every command in full
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own = {choice.dest: choice.help for choice in sub._choices_actions}
    assert own == {name: line for name, (_module, line) in COMMANDS.items()}


def test_a_boot_error_is_printed_once(tmp_path: Path) -> None:
    """A row that fails to apply is reported once, by the ``dsh: error:`` line (before, the
    host's log line said the same thing first); ``-v`` still shows the log line."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    argv = ["run", "hi", "--workspace", str(workspace), "--root", str(workspace / "sessions")]
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    done = subprocess.run(
        [sys.executable, "-m", "dsh_host", *argv], cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("dsh: error: "), done.stderr
    assert done.stderr.count("overlaps") == 1, done.stderr
    verbose = subprocess.run(
        [sys.executable, "-m", "dsh_host", "-v", *argv], cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )
    assert verbose.stderr.count("overlaps") == 2, verbose.stderr
