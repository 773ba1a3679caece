"""The two transports: a confined stdio child, and the SDK's Streamable HTTP client.

Each is an async context manager yielding a :class:`Link`: the stream pair an
``mcp.ClientSession`` runs on, an event set when the connection is gone for good (the stdio child
exited, or closed its stdout), which is what wakes the reconnect supervisor, and the stdio
child's pid (its process group's id).

The stdio child is not started by the SDK's ``stdio_client`` (``anyio.open_process``) but by
:func:`dsh_host._spawn.open_process`: on the harness's one long-lived spawner thread, so the
parent-death signal of the sandbox runner (bubblewrap's ``--die-with-parent``, the Landlock
launcher) or of the child itself (unconfined) fires exactly when the harness dies, and in its
own process group, which closing kills as a whole and reaps.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from dsh_host.sdk import SpawnedProcess, open_process

__all__ = ["Link", "StderrTail", "http_transport", "stdio_transport"]

log = logging.getLogger("dsh.mcp-client")

#: How long a stdio server may take to exit by itself once its stdin closed (MCP's shutdown).
_EXIT_GRACE_S: Final = 2.0
#: After SIGTERM to its process group, before SIGKILL.
_TERM_GRACE_S: Final = 2.0
_STDERR_TAIL_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class Link:
    """One open connection: the session's streams, the lost event, the stdio child's pid."""

    read: Any
    write: Any
    lost: anyio.Event
    pid: int | None = None


class StderrTail:
    """The last few KiB a stdio server wrote to stderr (for diagnostics of a failed start)."""

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size > _STDERR_TAIL_BYTES and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-_STDERR_TAIL_BYTES:].decode("utf-8", "replace").strip()


def _parse_line(line: bytes) -> SessionMessage | Exception:
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    return SessionMessage(message)


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop(process: SpawnedProcess) -> None:
    """MCP's stdio shutdown: close stdin, wait, SIGTERM the group, wait, SIGKILL; then reap."""
    if process.stdin is not None:
        await process.stdin.aclose()
    with anyio.move_on_after(_EXIT_GRACE_S):
        await process.wait()
    if process.returncode is None:
        _kill_group(process.pid, signal.SIGTERM)
        with anyio.move_on_after(_TERM_GRACE_S):
            await process.wait()
    # The leader may be gone while the group lives on (a server's own children): kill the rest.
    _kill_group(process.pid, signal.SIGKILL)
    await process.wait()
    await process.aclose()


@contextlib.asynccontextmanager
async def stdio_transport(
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    die_with_parent: bool,
    stderr: StderrTail,
) -> AsyncIterator[Link]:
    """Spawn ``argv`` (already confined by the caller) and speak newline-delimited JSON-RPC."""
    process = await open_process(
        argv, cwd=cwd, env=env, stdin_pipe=True, die_with_parent=die_with_parent
    )
    lost = anyio.Event()
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        buffer = b""
        try:
            async with read_send:
                while True:
                    try:
                        chunk = await process.stdout.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()
                    for line in lines:
                        if line.strip():
                            await read_send.send(_parse_line(line))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            lost.set()

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            lost.set()
            await read_send.aclose()

    async def pump_stderr() -> None:
        while True:
            try:
                stderr.feed(await process.stderr.receive())
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            group.start_soon(writer)
            group.start_soon(pump_stderr)
            try:
                yield Link(read_recv, write_send, lost, process.pid)
            finally:
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await write_send.aclose()
            await read_recv.aclose()
            await _stop(process)


@contextlib.asynccontextmanager
async def http_transport(
    url: str, headers: dict[str, str]
) -> AsyncIterator[Link]:
    """The SDK's Streamable HTTP client with the row's extra headers.

    An HTTP connection has no process to watch: a failure surfaces per request (the bridge
    then reports the connection lost, which wakes the supervisor the same way).
    """
    lost = anyio.Event()
    async with (
        create_mcp_http_client(headers=dict(headers) or None) as client,
        streamable_http_client(url, http_client=client) as (read, write),
    ):
        yield Link(read, write, lost)
