"""``dsh --help`` and ``dsh sessions list`` do not import what they do not use.

Start-up time is measured in ``bench/startup.py`` (never asserted here); these tests pin the
cause: the modules a real ``dsh`` process has loaded when it exits. Before, ``dsh
--help`` imported the loader, the agent loop, rich and anyio (every subcommand's module), and
``dsh sessions list`` imported trio; later (issue 25) it still imported every row's plugin (the
agent loop, the tools, the sandbox) to tell the persistence rows apart, and rich, portalocker and
the entry-point scan (``importlib.metadata``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsh_host._cli.main import COMMANDS, build_parser

from .cli_helpers import copy_fixture_root, json_lines

#: Runs ``python -m dsh_host ARGS`` (sys.argv[1:]) and writes, at exit, the name of every module
#: then loaded and how many objects the exit's garbage collections skip (``gc.freeze``) to
#: $DSH_TEST_MODULES; registered first, this atexit handler runs after dsh's. ``sys.modules``
#: rather than ``-X importtime``: a module loaded with ``importlib.import_module`` (a plugin, a
#: command's module) is missing from the importtime report.
_DRIVER = """
import atexit, gc, json, os, runpy, sys
def record():
    with open(os.environ["DSH_TEST_MODULES"], "w") as out:
        json.dump({"modules": sorted(sys.modules), "frozen": gc.get_freeze_count()}, out)
atexit.register(record)
sys.argv[0] = "dsh"
runpy.run_module("dsh_host", run_name="__main__", alter_sys=True)
"""


def at_exit(*args: str, cwd: Path) -> tuple[dict[str, Any], str]:
    """What a real ``dsh ARGS`` process had at exit (see ``_DRIVER``), and its stdout."""
    record = cwd / ".at-exit.json"
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSION_ROOT"}
    env["DSH_TEST_MODULES"] = str(record)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *args], cwd=cwd, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    state: dict[str, Any] = json.loads(record.read_text())
    record.unlink()
    return state, done.stdout


def importing(*args: str, cwd: Path) -> tuple[set[str], str]:
    """Every module a real ``dsh ARGS`` process loaded, and its stdout."""
    state, out = at_exit(*args, cwd=cwd)
    return set(state["modules"]), out


def imported(*args: str, cwd: Path) -> set[str]:
    return importing(*args, cwd=cwd)[0]


def test_help_imports_no_command_module(tmp_path: Path) -> None:
    modules = imported("--help", cwd=tmp_path)
    heavy = {"dsh_host._loader", "dsh_host._agent", "dsh_host._cli.run_cmd", "rich", "anyio",
             "trio", "pluggy", "msgspec", "yaml", "importlib.metadata", "prompt_toolkit"}
    assert not heavy & modules, sorted(heavy & modules)


def test_sessions_list_runs_without_trio(tmp_path: Path) -> None:
    modules = imported("sessions", "list", "--root", str(tmp_path / "sessions"), cwd=tmp_path)
    assert not {"trio", "dsh_host._cli.run_cmd", "dsh_host._cli.chat_cmd",
                "prompt_toolkit"} & modules


def test_run_help_imports_neither_the_agent_nor_the_host(tmp_path: Path) -> None:
    """``dsh run --help`` builds its parser from :mod:`dsh_host._cli.run_args`; the command's own
    module (the agent, the loader, the host) is imported when it runs."""
    modules, out = importing("run", "--help", cwd=tmp_path)
    assert out.startswith("usage: dsh run ") and "--model SPEC" in out
    heavy = {"dsh_host._cli.run_cmd", "dsh_host._agent", "dsh_host._front.agent", "dsh_host._loader",
             "anyio", "msgspec", "yaml", "pluggy", "rich", "trio"}
    assert not heavy & modules, sorted(heavy & modules)


def test_plugins_boots_without_trio(tmp_path: Path) -> None:
    modules, out = importing("plugins", "--json", cwd=tmp_path)
    assert json.loads(out)["origin"] == "shipped"
    assert {"dsh_builtin_tools", "dsh_sandbox_local"} <= modules  # it did boot every row
    assert "trio" not in modules


#: What a listing of the shipped default composition must not import: the plugins of the rows it
#: does not boot (and what they pull in), rich on a pipe and the entry-point scan.
NOT_FOR_A_LISTING = frozenset({
    "dsh_host._agent", "dsh_host._agent.loop", "dsh_host._tools", "dsh_host._llm", "dsh_host._front",
    "dsh_builtin_tools", "dsh_sandbox_local", "dsh_user_approval", "dsh_token_meter",
    "dsh_compaction_basic", "dsh_session_checkpoint_policy", "rich", "importlib.metadata",
    "dsh_host._session.tokens",
})


def test_sessions_list_imports_only_the_rows_it_boots(tmp_path: Path) -> None:
    """The listing boots the ``sessionPersistence`` provider and what it injects (``sessions``);
    the other rows of the default composition are told apart by what their plugins declare, so
    none of them is imported. The listing itself is whole: every stored session, read."""
    root = copy_fixture_root(tmp_path)
    stored = sorted(p.name for p in (root / "--home-dev-project--").iterdir())
    modules, out = importing("sessions", "list", "--json", "--root", str(root), cwd=tmp_path)
    assert sorted(entry["sessionId"] for entry in json_lines(out)) == stored
    assert {"dsh_session_persistence_jsonl._backend", "dsh_host._session.plugin"} <= modules
    assert not NOT_FOR_A_LISTING & modules, sorted(NOT_FOR_A_LISTING & modules)
    # Piped without --json: the tab-separated rows, still without rich.
    modules, out = importing("sessions", "list", "--root", str(root), cwd=tmp_path)
    assert out.splitlines()[0].startswith("id\tcreated\t")
    assert {line.split("\t")[0] for line in out.splitlines()[1:len(stored) + 1]} == set(stored)
    assert not NOT_FOR_A_LISTING & modules, sorted(NOT_FOR_A_LISTING & modules)
    # An empty root says so, without rich either.
    modules, out = importing("sessions", "list", "--root", str(tmp_path / "none"), cwd=tmp_path)
    assert out == "no stored sessions\n"
    assert not NOT_FOR_A_LISTING & modules, sorted(NOT_FOR_A_LISTING & modules)


def test_the_exit_skips_collecting_what_the_imports_made(tmp_path: Path) -> None:
    """The process's last garbage collections would walk every class and function the imports
    made; ``dsh`` freezes them at exit (after its output is flushed), so they are skipped."""
    state, out = at_exit("sessions", "list", "--root", str(tmp_path / "none"), cwd=tmp_path)
    assert out == "no stored sessions\n"
    assert state["frozen"] > 10_000, state["frozen"]


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
