"""Fixtures of the approval tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .deferred_env import Env, backend_env


@pytest.fixture(params=["jsonl", "postgres"])
def deferred(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """A deferred-approval composition on each persistence backend."""
    yield from backend_env(request, tmp_path)
