"""Shared test configuration: every async test runs on trio and on asyncio (DECISIONS D2)."""

from __future__ import annotations

import pytest


@pytest.fixture(
    params=[
        pytest.param("trio", id="trio"),
        pytest.param("asyncio", id="asyncio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
