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
def _private_user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the real ``~/.config/dsh`` or ``~/.local/share/dsh``.

    The XDG directories (the default session root, the user's composition and trust store) move
    to a fresh directory per test, a sibling of ``tmp_path`` (never inside it: a test's workspace
    is often ``tmp_path``, and a session root inside the workspace is refused at boot).
    Subprocesses inherit them.
    """
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.delenv("DSH_SESSION_ROOT", raising=False)
    monkeypatch.delenv("DSH_CONFIG", raising=False)


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A private directory outside ``/tmp`` (under ``/var/tmp``), removed afterwards.

    For session roots under Landlock: in ``workspace-write`` Landlock grants the host ``/tmp``,
    so a root under it (as ``tmp_path`` is) is refused at boot (DECISIONS D15).
    """
    path = Path(tempfile.mkdtemp(prefix="dsh-test-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
