"""Fixtures for the tools runtime tests: a real host with the ``tools`` row mounted, and a
``builtin-tools`` row on a fresh workspace (``ws``, which a module may override)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolRuntime

from .tools_helpers import Boot


@pytest.fixture
async def host() -> AsyncIterator[PluginHost]:
    async with open_host([Row(name="tools")]) as booted:
        yield booted


@pytest.fixture
def tools(host: PluginHost) -> ToolRuntime:
    runtime: ToolRuntime = host.ctx.tools
    return runtime


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def boot(ws: Path) -> Boot:
    @asynccontextmanager
    async def booted(**config: Any) -> AsyncIterator[PluginHost]:
        rows = [
            Row(name="tools"),
            Row(name="builtin-tools", config={"workspace": str(ws), **config}),
        ]
        async with open_host(rows) as host:
            yield host

    return booted
