"""Fixtures for the tools runtime tests: a real host with the ``tools`` row mounted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dsh_host import Row, open_host
from dsh_host.loader import PluginHost
from dsh_host.tools import ToolRuntime


@pytest.fixture
async def host() -> AsyncIterator[PluginHost]:
    async with open_host([Row(name="tools")]) as booted:
        yield booted


@pytest.fixture
def tools(host: PluginHost) -> ToolRuntime:
    runtime: ToolRuntime = host.ctx.tools
    return runtime
