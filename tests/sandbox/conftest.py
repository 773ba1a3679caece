"""Sandbox suite fixtures (the helpers live in ``sandbox_harness``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dsh_sandbox_local import clear_probe_cache

from .sandbox_harness import Scene, make_scene


@pytest.fixture
def scene() -> Iterator[Scene]:
    with make_scene() as s:
        yield s


@pytest.fixture
def fresh_probes() -> Iterator[None]:
    """Forget process-wide probe results before and after a test that changes PATH & co."""
    clear_probe_cache()
    yield
    clear_probe_cache()
