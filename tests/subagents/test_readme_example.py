"""The README's sub-agent example runs as written: the YAML composition, the scripts, the Python."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```(yaml|python)\n(.*?)```", re.DOTALL)


def _files() -> dict[str, str]:
    """``# name`` files of the README's sub-agent section: team.yml, the scripts, delegate.py."""
    files: dict[str, str] = {}
    for _kind, block in BLOCK.findall(README.read_text(encoding="utf-8")):
        first = block.splitlines()[0]
        if first.startswith("# team.yml") or first.startswith("# delegate.py"):
            files[first[2:].split(":")[0].strip()] = block
        elif first.startswith("# lead.yml, reader.yml, critic.yml"):
            name = None
            for line in block.splitlines()[1:]:
                found = re.fullmatch(r"# (\w+\.yml)", line)
                if found:
                    name = found.group(1)
                    files[name] = ""
                elif name is not None:
                    files[name] += line + "\n"
    return files


def test_readme_delegation_example_runs(tmp_path: Path) -> None:
    files = _files()
    assert set(files) == {"team.yml", "lead.yml", "reader.yml", "critic.yml", "delegate.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    ran = subprocess.run(
        [sys.executable, "delegate.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    output, session_id = ran.stdout.splitlines()[-2:]
    assert output == "Plan: ship Friday. Risk: no rollback."
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsh_host",
            "sessions",
            "show",
            session_id,
            "--root",
            "sessions",
            "--config",
            "team.yml",
            "--view",
            "events",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    events = [json.loads(line) for line in shown.stdout.splitlines()]
    results = [
        e["data"]["message"]["content"][0]["content"][0]["text"]
        for e in events
        if e["type"] == "tool/result"
    ]
    assert results == ["Ship on Friday.", "There is no rollback plan."]
    assert len([e for e in events if e["type"] == "subagent/catalog"]) == 2
