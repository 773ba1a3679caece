"""A stdio MCP server cannot touch what the agent's own tools cannot (issue 21).

Attacks are judged from the host: the fixture server (ours, since no reference server writes
arbitrary paths on request) tries to create a file outside the workspace. Confined, the file
never appears; the control run under ``danger-full-access`` proves the same attempt works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh_mcp_client import McpStartupError

from dsh_host import Row, open_host

from .mcp_helpers import FIXTURE, bridge_of, call, fixture_stdio, mcp_host, text_of

pytestmark = pytest.mark.both_backends


@pytest.fixture
def places() -> Iterator[tuple[Path, Path]]:
    """A workspace and a directory beside it, outside /tmp (Landlock's isolated calls get a
    private /tmp, which would hide a write rather than refuse it)."""
    base = Path(tempfile.mkdtemp(prefix="dsh-mcp-", dir="/var/tmp"))
    workspace, outside = base / "ws", base / "outside"
    workspace.mkdir()
    outside.mkdir()
    try:
        yield workspace, outside
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


async def attempt(workspace: Path, target: Path, mode: str) -> str:
    config = fixture_stdio(sandbox=mode, workspace=str(workspace))
    async with mcp_host(config) as host:
        result = await call(host, "mcp__fixture__write_file", {"path": str(target)})
    return text_of(result)


async def test_read_only_server_cannot_write_outside_the_workspace(
    anyio_backend: str, places: tuple[Path, Path]
) -> None:
    workspace, outside = places
    target = outside / "escaped.txt"
    text = await attempt(workspace, target, "read-only")
    assert text.startswith("refused: "), text
    assert not target.exists()
    # nor inside it: read-only means no writes at all
    inside = workspace / "inside.txt"
    assert (await attempt(workspace, inside, "read-only")).startswith("refused: ")
    assert not inside.exists()


async def test_workspace_write_server_writes_only_the_workspace(
    anyio_backend: str, places: tuple[Path, Path]
) -> None:
    workspace, outside = places
    inside, target = workspace / "inside.txt", outside / "escaped.txt"
    assert await attempt(workspace, inside, "workspace-write") == "written"
    assert inside.read_text() == "written by the fixture MCP server\n"
    assert (await attempt(workspace, target, "workspace-write")).startswith("refused: ")
    assert not target.exists()


async def test_control_unconfined_server_does_write_outside(
    anyio_backend: str, places: tuple[Path, Path]
) -> None:
    workspace, outside = places
    target = outside / "escaped.txt"
    assert await attempt(workspace, target, "danger-full-access") == "written"
    assert target.exists()


async def test_without_a_sandbox_the_server_is_not_started(
    anyio_backend: str, places: tuple[Path, Path]
) -> None:
    workspace, outside = places
    marker = outside / "started"
    # the "server" leaves a marker the moment it runs: it must never run unconfined
    config = fixture_stdio(
        command="/bin/sh",
        args=["-c", f'touch "{marker}"; exec "{sys.executable}" "{FIXTURE}"'],
        workspace=str(workspace),
        failOnStartupError=True,
    )
    rows = [Row(name="tools"), Row(name="mcp-client", config=config)]  # no sandbox row
    async with open_host(rows) as host:
        with pytest.raises(McpStartupError) as raised:
            await bridge_of(host, "fixture").wait_started()
        assert not [n for n in host.ctx.tools.names() if n.startswith("mcp__")]
    assert 'sandbox mode "read-only" is requested but no sandbox backend is usable' in str(
        raised.value
    )
    assert not marker.exists()


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _group_gone(pgid: int) -> bool:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    members = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(pid)
    return not members


async def test_unloading_the_row_reaps_the_server(anyio_backend: str) -> None:
    # --linger: the server ignores its closed stdin, so only the group kill can end it
    async with mcp_host(fixture_stdio(args=[FIXTURE, "--linger"])) as host:
        bridge = bridge_of(host, "fixture")
        pid = bridge.server_pid
        assert pid is not None and not _gone(pid)
        row = next(f.id for f in host.fibers if f.plugin_name == "mcp-client")
        await host.unload(row)
        assert _group_gone(pid)  # closed, SIGTERM/SIGKILL'd as a group, and waited for
        assert not [n for n in host.ctx.tools.names() if n.startswith("mcp__")]


_HARNESS = textwrap.dedent(
    """
    import sys, anyio
    from dsh_host import Row, open_host
    sys.path.insert(0, {tests!r})
    from mcp_client.mcp_helpers import FIXTURE, bridge_of, fixture_stdio

    async def main():
        rows = [Row(name="tools"), Row(name="sandbox-local", config={{"network": "deny"}}),
                Row(name="mcp-client", config=fixture_stdio(sandbox={mode!r}, args=[FIXTURE, "--linger"]))]
        async with open_host(rows) as host:
            bridge = bridge_of(host, "fixture")
            await bridge.wait_started()
            print(bridge.server_pid, flush=True)
            await anyio.sleep(3600)

    anyio.run(main, backend={backend!r})
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["read-only", "danger-full-access"])
def test_the_server_dies_with_a_killed_harness(mode: str, anyio_backend: str) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    code = _HARNESS.format(tests=tests, mode=mode, backend=anyio_backend)
    harness = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert harness.stdout is not None
        pid = int(harness.stdout.readline())
        assert not _gone(pid)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + 60  # a bound on a slow machine, not a timing assertion
        while not _group_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group_gone(pid), f"the MCP server group {pid} outlived its harness"
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()


async def test_a_workspace_write_server_may_not_reach_the_session_log(
    anyio_backend: str, places: tuple[Path, Path]
) -> None:
    from dsh_host.errors import BootError

    workspace, _outside = places
    root = workspace / "sessions"
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(root)}),
        Row(name="tools"),
        Row(name="sandbox-local", config={"network": "deny"}),
        Row(name="mcp-client", config=fixture_stdio(sandbox="workspace-write",
                                                     workspace=str(workspace))),
    ]
    with pytest.raises(BootError, match=r"mcp-client\(fixture\): the session root .* overlaps"):
        async with open_host(rows):
            pass
    # read-only writes nothing: the same layout is fine
    rows[-1] = Row(name="mcp-client", config=fixture_stdio(workspace=str(workspace)))
    async with open_host(rows) as host:
        await bridge_of(host, "fixture").wait_started()
