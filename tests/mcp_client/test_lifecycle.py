"""Connection lifecycle of mcp-client (issue 21): Streamable HTTP, a crashed server and its
supervised reconnect, the reconnect budget, list-changed re-sync as one generation, timeouts.
Every test runs on trio and on asyncio."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from dsh_host import Row

from .mcp_helpers import (
    FIXTURE,
    EverythingHttp,
    bridge_of,
    call,
    everything_stdio,
    fixture_stdio,
    mcp_host,
    needs_everything,
    text_of,
)

pytestmark = pytest.mark.both_backends

FAST_RECONNECT = {"initialDelayMs": 50, "maxDelayMs": 1000, "maxAttempts": 3}


async def eventually(predicate: object, what: str) -> None:
    """Wait for ``predicate()`` (a bound for a slow machine, not a timing assertion)."""
    assert callable(predicate)
    with anyio.fail_after(60):
        while not predicate():  # noqa: ASYNC110 - polls state the test does not own
            await anyio.sleep(0.05)


def code_of(result: object) -> str | None:
    error = getattr(result, "error", None)
    info = getattr(error, "info", None)
    return getattr(info, "code", None)


@pytest.fixture
def http_server() -> Iterator[EverythingHttp]:
    server = EverythingHttp()
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- streamable HTTP


@needs_everything
async def test_streamable_http_discovery_and_call(
    anyio_backend: str, http_server: EverythingHttp
) -> None:
    config = {"serverName": "web", "transport": "streamable-http", "url": http_server.url,
              "headers": {"X-Dsh-Test": "1"}}
    async with mcp_host(config, sandbox=False) as host:
        assert "mcp__web__echo" in host.ctx.tools.names()
        result = await call(host, "mcp__web__echo", {"message": "over http"})
        assert text_of(result) == "Echo: over http"


@needs_everything
async def test_streamable_http_server_restart_is_recovered(
    anyio_backend: str, http_server: EverythingHttp
) -> None:
    config = {"serverName": "web", "transport": "streamable-http", "url": http_server.url,
              "reconnect": FAST_RECONNECT | {"maxAttempts": 100}}
    async with mcp_host(config, sandbox=False) as host:
        bridge = bridge_of(host, "web")
        http_server.stop()
        lost = await call(host, "mcp__web__echo", {"message": "while down"})
        assert code_of(lost) in ("TOOL_OUTCOME_UNKNOWN", "MCP_UNAVAILABLE")
        # the last generation stays registered through the outage
        assert "mcp__web__echo" in host.ctx.tools.names()
        http_server.start()
        await eventually(lambda: bridge.connections >= 2, "a second connection")
        result = await call(host, "mcp__web__echo", {"message": "back"})
        assert text_of(result) == "Echo: back"


# --------------------------------------------------------------------------- crash and reconnect


@needs_everything
async def test_a_killed_third_party_server_is_restarted(anyio_backend: str) -> None:
    async with mcp_host(everything_stdio(reconnect=FAST_RECONNECT)) as host:
        bridge = bridge_of(host, "everything")
        first = bridge.server_pid
        assert first is not None
        names = host.ctx.tools.names()
        os.killpg(first, signal.SIGKILL)
        await eventually(lambda: bridge.connections >= 2, "the restarted server")
        assert bridge.server_pid != first
        assert host.ctx.tools.names() == names  # recovered generation, same names, no duplicates
        result = await call(host, "mcp__everything__echo", {"message": "again"})
        assert text_of(result) == "Echo: again"


async def test_a_crash_mid_call_is_outcome_unknown_then_recovers(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio(reconnect=FAST_RECONNECT)) as host:
        bridge = bridge_of(host, "fixture")
        crashed = await call(host, "mcp__fixture__crash", {})
        assert code_of(crashed) == "TOOL_OUTCOME_UNKNOWN"
        assert "its outcome is unknown" in text_of(crashed)
        await eventually(lambda: bridge.connections >= 2, "the restarted server")
        assert not (await call(host, "mcp__fixture__whoami", {})).is_error


async def test_calls_during_an_outage_are_not_sent(anyio_backend: str) -> None:
    config = fixture_stdio(reconnect={"enabled": False})
    async with mcp_host(config) as host:
        await call(host, "mcp__fixture__crash", {})
        bridge = bridge_of(host, "fixture")
        await eventually(lambda: not bridge.connected, "the loss to be noticed")
        result = await call(host, "mcp__fixture__whoami", {})
        assert code_of(result) == "MCP_UNAVAILABLE"
        assert "the call was not sent" in text_of(result)
        assert "mcp__fixture__whoami" in host.ctx.tools.names()  # manual recovery: kept


async def test_an_exhausted_budget_unregisters_the_tools(
    anyio_backend: str, tmp_path: Path
) -> None:
    once = tmp_path / "started-once"
    # starts once; every restart fails at once
    script = f'[ -e "{once}" ] && exit 3; touch "{once}"; exec "{sys.executable}" "{FIXTURE}"'
    config = fixture_stdio(command="/bin/sh", args=["-c", script], sandbox="danger-full-access",
                           reconnect=FAST_RECONNECT)
    async with mcp_host(config) as host:
        bridge = bridge_of(host, "fixture")
        assert "mcp__fixture__whoami" in host.ctx.tools.names()
        await call(host, "mcp__fixture__crash", {})
        await eventually(lambda: not bridge.tool_names(), "the tools to be unregistered")
        assert not [n for n in host.ctx.tools.names() if n.startswith("mcp__")]
        assert bridge.connections == 1


# --------------------------------------------------------------------------- list changed


async def test_list_changed_resyncs_as_one_generation(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio()) as host:
        bridge = bridge_of(host, "fixture")
        before = set(host.ctx.tools.names())
        generations = bridge.generations
        changes: list[set[str]] = []
        host.ctx.on("tools/change", lambda: changes.append(set(host.ctx.tools.names())))
        added = await call(host, "mcp__fixture__add_tool", {"name": "late_tool"})
        assert text_of(added) == "added late_tool"
        await eventually(lambda: bridge.generations > generations, "the re-sync")
        assert set(host.ctx.tools.names()) == before | {"mcp__fixture__late_tool"}
        assert bridge.generations == generations + 1
        result = await call(host, "mcp__fixture__late_tool", {})
        assert text_of(result) == "late_tool answers"
        # the swap: the old generation out, the new one in; never a mix of the two
        assert changes[-1] == before | {"mcp__fixture__late_tool"}


# --------------------------------------------------------------------------- timeouts


@needs_everything
async def test_a_call_past_tool_call_timeout_is_tool_timeout(anyio_backend: str) -> None:
    config = everything_stdio(toolCallTimeoutMs=300)
    async with mcp_host(config, extra_rows=(Row(name="timeout-policy"),)) as host:
        slow = await call(host, "mcp__everything__trigger-long-running-operation",
                          {"duration": 30, "steps": 3})
        assert code_of(slow) == "TOOL_TIMEOUT"
        assert text_of(slow).startswith("Error: tool call timed out after 300ms")
        # the connection survives the abandoned request
        assert text_of(await call(host, "mcp__everything__echo", {"message": "ok"})) == "Echo: ok"


async def test_without_timeout_policy_the_call_has_its_own_deadline(anyio_backend: str) -> None:
    async with mcp_host(fixture_stdio(toolCallTimeoutMs=200)) as host:  # no timeout-policy row
        slow = await call(host, "mcp__fixture__sleep", {"seconds": 60})
        assert code_of(slow) == "TOOL_TIMEOUT"
        assert text_of(slow) == (
            "Error: MCP server \"fixture\" did not answer tools/call 'sleep' within "
            "toolCallTimeoutMs (200 ms); it was asked to cancel the call. It may have partly "
            "run: its outcome is unknown."
        )
        assert not (await call(host, "mcp__fixture__whoami", {})).is_error


async def test_a_squatted_name_rolls_the_whole_generation_back(anyio_backend: str) -> None:
    from dsh_host._tools import ToolDefinition, text_output

    async def body(_args: object, _exec: object) -> str:
        return "squatter"

    async with mcp_host(fixture_stdio()) as host:
        bridge = bridge_of(host, "fixture")
        squatter = ToolDefinition(name="mcp__fixture__late_tool", description="not the server's",
                                  parameters={"type": "object"}, execute=body,
                                  output=text_output())
        host.ctx.tools.register(squatter)
        await call(host, "mcp__fixture__add_tool", {"name": "late_tool"})
        await eventually(lambda: not bridge.tool_names(), "the rolled-back generation")
        # never a partial set: none of the server's tools, and the foreign one untouched
        assert [n for n in host.ctx.tools.names() if n.startswith("mcp__")] == [
            "mcp__fixture__late_tool"
        ]
        assert text_of(await call(host, "mcp__fixture__late_tool", {})) == "squatter"


async def test_a_connection_that_lived_past_max_delay_resets_the_budget(
    anyio_backend: str,
) -> None:
    # one attempt per outage: without the reset the second crash would exhaust it
    reconnect = {"initialDelayMs": 20, "maxDelayMs": 200, "maxAttempts": 1}
    async with mcp_host(fixture_stdio(reconnect=reconnect)) as host:
        bridge = bridge_of(host, "fixture")
        for round_ in range(1, 4):
            await anyio.sleep(0.3)  # uptime beyond maxDelayMs (longer on a slow machine is fine)
            await call(host, "mcp__fixture__crash", {})
            await eventually(lambda n=round_: bridge.connections > n and bridge.connected, "")
        assert bridge.connections == 4
        assert "mcp__fixture__whoami" in host.ctx.tools.names()
