"""Run the real ``dsh`` command in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dsh-reference"


def dsh(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: int | None = subprocess.DEVNULL,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("DSH_SESSION_ROOT", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        env=full_env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def copy_fixture_root(tmp: Path, root: str = "root-zstd") -> Path:
    target = tmp / root
    shutil.copytree(FIXTURES / root, target)
    return target


def priced_composition(tmp: Path) -> Path:
    """The default composition with the token-meter pricing the scripted model at $2 per million
    input tokens and $10 per million output (1000 in + 200 out = $0.004)."""
    default = (REPO / "configs" / "default.yml").read_text()
    priced = tmp / "priced.yml"
    priced.write_text(default.replace(
        "- id: token-meter\n  name: token-meter\n",
        "- id: token-meter\n  name: token-meter\n  config:\n    prices:\n"
        "      scripted: {input: 2, output: 10}\n"))  # fmt: skip
    assert "scripted: {input" in priced.read_text()
    return priced
