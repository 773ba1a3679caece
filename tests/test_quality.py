"""Lint and type checks are part of the test suite, so CI's single test command enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900
    )


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    """The host, the shipped plugins and the tests themselves (tests/README.md)."""
    result = run("mypy", "--strict", "dsh_host", "plugins", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
