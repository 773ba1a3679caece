"""Shared helpers of the mcp-client tests: where the servers are, and a host with one row."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cli.cli_helpers import dsh as run_dsh
from dsh_mcp_client import ServerBridge

from dsh_host import CancelToken, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolExecutionInput, ToolExecutionResult

HERE = Path(__file__).resolve().parent


def visible_to_confined_servers(source: Path) -> Path:
    """``source`` where a confined server can read it. The sandbox gives a confined process an
    empty private ``/tmp``, so a checkout under ``/tmp`` (a fresh CI clone) is invisible to a
    ``read-only`` server: such a source is copied once under ``/var/tmp`` (keyed by its path and
    modification time; a concurrent worker's copy wins the rename) and the copy is used."""
    if not (str(source) + "/").startswith("/tmp/"):
        return source
    stamp = f"{source}:{source.stat().st_mtime_ns}".encode()
    target = Path("/var/tmp") / f"dsh-mcp-test-{hashlib.sha256(stamp).hexdigest()[:16]}"
    if not target.exists():
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir="/var/tmp"))
        if source.is_dir():
            shutil.copytree(source, staging / source.name, symlinks=True)
        else:
            shutil.copy2(source, staging / source.name)
        try:
            staging.rename(target)
        except OSError:  # another worker got there first: its copy is the same
            shutil.rmtree(staging, ignore_errors=True)
    return target / source.name


FIXTURE = str(visible_to_confined_servers(HERE / "fixture_server.py"))


def install_reference_servers() -> Path:
    """The pinned npm reference servers under ``tests/mcp_client/node``, installed on first use.

    The README's one test command must pass on a fresh checkout, so the suite runs ``npm ci``
    itself (pinned by ``package-lock.json``) instead of leaving it to ``.ci/run``; xdist workers
    serialise on a lock file and the first one installs. Without npm this fails with one line
    saying what to install: node is on the machine, so the tests that need the server must run.
    """
    node_dir = HERE / "node"
    entry = node_dir / "node_modules" / "@modelcontextprotocol" / "server-everything"
    entry = entry / "dist" / "index.js"
    if entry.is_file():
        return node_dir
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            f"{entry} is missing and npm is not on PATH: install npm (Debian: apt install npm), "
            f"or run `npm ci` in {node_dir} with another npm",
            pytrace=False,
        )
    with open(node_dir / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.is_file():
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=node_dir,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0 or not entry.is_file():
                why = (done.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.fail(
                    f"`npm ci` in {node_dir} failed (exit {done.returncode}): {why}",
                    pytrace=False,
                )
    return node_dir


@functools.cache
def everything_js() -> Path:
    """server-everything's entry point, installed on first use (:func:`install_reference_servers`)
    and copied when the checkout is under /tmp (32 MB of node_modules, so not at import time)."""
    node = visible_to_confined_servers(install_reference_servers())
    return (
        node / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    )


needs_everything = pytest.mark.skipif(
    shutil.which("node") is None,
    reason="server-everything needs node (not installed here; CI has it)",
)


def require_everything() -> None:
    """With node present the reference server must be there: installed, or one clear failure."""
    if not everything_js().is_file():
        pytest.fail(f"{everything_js()} is missing after `npm ci`", pytrace=False)


def everything_stdio(**extra: Any) -> dict[str, Any]:
    require_everything()
    return {
        "serverName": "everything",
        "transport": "stdio",
        "command": "node",
        "args": [str(everything_js()), "stdio"],
        **extra,
    }


def fixture_stdio(**extra: Any) -> dict[str, Any]:
    return {
        "serverName": "fixture",
        "transport": "stdio",
        "command": sys.executable,
        "args": [FIXTURE],
        **extra,
    }


def time_stdio(**extra: Any) -> dict[str, Any]:
    return {
        "serverName": "time",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        **extra,
    }


def bridge_of(host: PluginHost, server_name: str) -> ServerBridge:
    for fiber in host.fibers:
        bridge = getattr(fiber.instance, "bridge", None)
        if isinstance(bridge, ServerBridge) and bridge.server_name == server_name:
            return bridge
    raise AssertionError(f"no mcp-client row for {server_name!r}")


@asynccontextmanager
async def mcp_host(
    *configs: dict[str, Any], sandbox: bool = True, extra_rows: tuple[Row, ...] = ()
) -> AsyncIterator[PluginHost]:
    """A host with ``tools`` (+ ``sandbox-local``) and one ``mcp-client`` row per config,
    returned once every server's first connection settled."""
    rows = [Row(name="tools")]
    if sandbox:
        rows.append(Row(name="sandbox-local", config={"network": "deny"}))
    rows.extend(extra_rows)
    rows.extend(Row(name="mcp-client", config=config) for config in configs)
    async with open_host(rows) as host:
        for config in configs:
            await bridge_of(host, config["serverName"]).wait_started()
        yield host


async def call(
    host: PluginHost, name: str, arguments: Any, *, call_id: str = "call-1", **extra: Any
) -> ToolExecutionResult:
    result: ToolExecutionResult = await host.ctx.tools.execute(
        ToolExecutionInput(
            call_id=call_id, name=name, arguments=arguments, signal=CancelToken(), **extra
        )
    )
    return result


def text_of(result: ToolExecutionResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def dsh(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run the real ``dsh`` command as a user would (no inherited session root); MCP servers
    start slowly, hence the longer timeout."""
    return run_dsh(*args, cwd=cwd, timeout=timeout)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class EverythingHttp:
    """``server-everything`` in its Streamable HTTP mode on a loopback port, started and
    stopped by the test (``stop`` kills it; ``start`` again reuses the port)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        require_everything()
        env = {**os.environ, "PORT": str(self.port)}
        self.process = subprocess.Popen(
            ["node", str(everything_js()), "streamableHttp"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:  # it says so once it listens
            if "listening on port" in line:
                return
        raise AssertionError("server-everything (streamableHttp) exited before listening")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
