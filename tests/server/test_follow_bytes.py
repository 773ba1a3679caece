"""A new follower of a JSONL session another process writes costs ``dsh serve`` the bytes
appended since it last read the log, not a read of the log (real Hypercorn on loopback, real
files; bytes counted by the kernel: ``rchar`` of ``/proc/self/io``, the server runs in this
process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from persistence.helpers import header, log, noisy

from .harness import running_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def rchar() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


async def append(root: Path, workspace: Path, events: list[dict[str, Any]], new: bool) -> None:
    """Write ``events`` as another process would: a store instance of its own."""
    async with anyio.create_task_group() as group:
        store = JsonlSessionPersistence(str(root), "zstd", spawn=group.start_soon)
        if new:
            handle = await store.create(header("shared", cwd=str(workspace)))
        else:
            handle = await store.open("shared", "write")
        for start in range(0, len(events), 1000):
            handle.append(events[start : start + 1000])
            await handle.flush()
        await handle.close()
        await store.aclose()
        group.cancel_scope.cancel()


async def test_a_new_follower_reads_only_what_was_appended(tmp_path: Path) -> None:
    events = noisy(log(700, tools=1), 1024)
    first, rest = events[:-16], events[-16:]
    async with running_server(tmp_path, []) as server:
        workspace = server.workspace.resolve()
        await append(server.root, workspace, first, new=True)
        path = next(server.root.rglob("session.v3.jsonl.zstd"))
        size = path.stat().st_size
        assert size > 800_000, size

        async def follow() -> int:
            """Bytes read while a new stream starts (its start is found before the answer)."""
            before = rchar()
            async with server.client.stream("GET", "/sessions/shared/stream") as response:
                assert response.status_code == 200
                return rchar() - before

        await follow()  # the server's first read of this log: the whole of it
        grown = path.stat().st_size
        await append(server.root, workspace, rest, new=False)
        appended = path.stat().st_size - grown
        cost = await follow()
        # A re-read of the log (a summary of it) would be >= size; the appended bytes, a
        # cursor check and the stream's own bytes are far less.
        assert cost < appended + 64 * 1024, (cost, appended, size)
