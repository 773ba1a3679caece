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


def test_every_test_directory_is_a_package() -> None:
    """tests/README.md: helpers are imported relative to their package or from tests/, never by
    a bare name from a directory pytest happened to put on sys.path (which also made mypy see
    one file under two module names)."""
    tests = REPO / "tests"
    missing = sorted(
        str(d.relative_to(REPO))
        for d in tests.rglob("*")
        if d.is_dir()
        and "fixtures" not in d.relative_to(tests).parts
        and d.name != "__pycache__"
        and any(d.glob("*.py"))
        and not (d / "__init__.py").exists()
    )
    assert missing == [], f"add an empty __init__.py to: {', '.join(missing)}"
