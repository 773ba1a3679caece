"""Shared test configuration: every async test runs on trio and on asyncio (DECISIONS D2)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(
    params=[
        pytest.param("trio", id="trio"),
        pytest.param("asyncio", id="asyncio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _private_user_dirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test reads or writes the real ``~/.config/dsh`` or ``~/.local/share/dsh``.

    The XDG directories (the default session root, the user's composition and trust store) move
    to a fresh directory per test, removed afterwards. It is under ``/var/tmp``, not ``/tmp``,
    like a real home: a test's workspace is often under ``/tmp``, and Landlock's workspace-write
    grants the host ``/tmp``, while a session root or dsh config directory a tool could write is
    refused at boot (DECISIONS D15, D16). Subprocesses inherit the variables.
    """
    base = Path(tempfile.mkdtemp(prefix="dsh-test-home-", dir="/var/tmp"))
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.delenv("DSH_SESSION_ROOT", raising=False)
    monkeypatch.delenv("DSH_CONFIG", raising=False)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
