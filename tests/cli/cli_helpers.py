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
