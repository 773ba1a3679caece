"""The README's code is part of the product: run its examples as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def block_starting_with(marker: str) -> str:
    for block in python_blocks():
        if block.lstrip().startswith(marker) or marker in block.splitlines()[0]:
            return str(block)
    raise AssertionError(f"README has no python block starting with {marker!r}")


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_plugin_example_runs_around_a_real_tool_call(tmp_path: Path) -> None:
    (tmp_path / "tool_audit.py").write_text(block_starting_with("# tool_audit.py"))
    (tmp_path / "hello.txt").write_text("hi\n")
    driver = textwrap.dedent("""
        import anyio
        from dsh_host import Row, open_host

        ROWS = [
            Row(name="sessions"),
            Row(name="llm"),
            Row(name="llm-scripted", config={"responses": [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "hello.txt"}}]},
                {"text": "read it"},
            ]}),
            Row(name="tools"),
            Row(name="builtin-tools", config={"workspace": ".", "sandbox": "read-only"}),
            Row(name="tool_audit:ToolAudit", config={"path": "audit.log"}),
            Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
        ]

        async def main():
            async with open_host(ROWS) as host:
                agent = host.ctx.agent.create()
                await agent.run_turn("read hello.txt")
                await agent.aclose()

        anyio.run(main, backend="trio")
    """)
    result = subprocess.run(
        [sys.executable, "-c", driver], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "audit.log").read_text() == "call_1_1 read_file error=False\n"


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_embedding_example_runs_on_both_backends(tmp_path: Path, backend: str) -> None:
    code = block_starting_with("import anyio")
    assert 'backend="trio"' in code
    code = code.replace('anyio.run(main, backend="trio")', f'anyio.run(main, backend="{backend}")')
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    session_id, reason = result.stdout.split()
    assert reason == "CompletedReason"
    # The default root is the user's data directory (the autouse fixture points it at a
    # private XDG_DATA_HOME), grouped by project: the embedding's cwd.
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    stored = list(root.rglob("session.v3.jsonl.zstd"))
    assert not (tmp_path / ".dsh").exists()
    assert len(stored) == 1 and session_id in str(stored[0])


def test_embedding_example_runs_twice_in_the_same_directory(tmp_path: Path) -> None:
    # Library ids used to be "session-1", "session-2", ... per process: the second run in the
    # same directory collided with the first run's stored session (SessionAlreadyExistsError,
    # reported as an LLM failure UNKNOWN). Ids are now time + random, unique across runs.
    code = block_starting_with("import anyio")
    first = run_python(code, tmp_path)
    second = run_python(code, tmp_path)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[1] == "CompletedReason"
    assert first.stdout.split()[0] != second.stdout.split()[0]
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    assert len(list(root.rglob("session.v3.jsonl.zstd"))) == 2
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_python_front_door_example_runs(tmp_path: Path, backend: str) -> None:
    text = README.read_text(encoding="utf-8")
    (script,) = [b for b in YAML_BLOCK.findall(text) if b.startswith("# script.yml")]
    code = block_starting_with("# agent.py")
    assert code.rstrip().endswith("anyio.run(main)")
    (tmp_path / "script.yml").write_text(script)
    code = code.rstrip().removesuffix("anyio.run(main)") + f'anyio.run(main, backend="{backend}")\n'
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    first, *events = result.stdout.splitlines()
    output, session_id, reason = first.split()
    assert (output, reason) == ("5", "CompletedReason")
    assert events.count("TextDelta") == 2  # "Charged " "cus_1."
    assert [e for i, e in enumerate(events) if e != "TextDelta" or events[i - 1] != e] == [
        "ToolCallStarted", "ApprovalAsked", "ApprovalDecided", "ToolCallFinished",
        "TextDelta", "TurnEnd",
    ]
    # the CLI's default store (D15): the private XDG_DATA_HOME of the autouse fixture
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    stored = [p for p in root.rglob("session.v3.jsonl.zstd") if session_id in str(p)]
    assert len(stored) == 1
