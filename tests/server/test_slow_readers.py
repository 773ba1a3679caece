"""A client that stops reading costs ``dsh serve`` a bounded buffer, and stalls nobody.

A real ``dsh serve`` process, a real JSONL session of ~16 MB of NDJSON, real loopback sockets
that send ``GET /sessions/{id}/events`` (or ``/stream?after=-1``) and then never read past the
first bytes. The server's resident memory (``VmRSS`` of ``/proc/PID/status``) is measured
after they have all been answered: a server that builds the whole answer before sending it
holds every stalled reader's ~16 MB; one that reads the store a page at a time, and sends a
page before it reads the next, holds a page each."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from persistence.helpers import header, log, noisy

from .harness import REPO

#: Stalled readers opened at once.
STALLED = 6


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def write_session(root: Path, workspace: Path, session_id: str, turns: int) -> None:
    events = noisy(log(turns, tools=1), 1024)
    async with anyio.create_task_group() as group:
        store = JsonlSessionPersistence(str(root), "zstd", spawn=group.start_soon)
        handle = await store.create(header(session_id, cwd=str(workspace)))
        for start in range(0, len(events), 2000):
            handle.append(events[start : start + 2000])
            await handle.flush()
        await handle.close()
        await store.aclose()
        group.cancel_scope.cancel()


@contextmanager
def serve(tmp_path: Path, root: Path, workspace: Path) -> Iterator[tuple[int, str]]:
    env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
           "DSH_SESSION_ROOT": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config",
         str(REPO / "configs" / "default.yml"), "--model", "demo", "--port", "0",
         "--workspace", str(workspace)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), (line, proc.stderr)
        yield proc.pid, line.split()[4].rstrip("/")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stalled_reader(url: str, path: str) -> socket.socket:
    """A connection that asks for ``path``, reads the status line, and then reads no more
    (a small receive buffer, so the server's sends fill it quickly)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = sock.recv(64)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


@pytest.mark.slow
@pytest.mark.parametrize("route", ["events", "stream?after=-1"])
def test_stalled_readers_hold_a_page_each_and_stall_nobody(tmp_path: Path, route: str) -> None:
    root, workspace = tmp_path / "root", tmp_path / "ws"
    root.mkdir()
    workspace.mkdir()
    anyio.run(write_session, root, workspace, "big", 4000)
    anyio.run(write_session, root, workspace, "small", 5)
    with serve(tmp_path, root, workspace) as (pid, url), httpx.Client(base_url=url) as client:
        # Warm up: the whole answer once, read as it comes (what a reading client costs).
        size = 0
        with client.stream("GET", "/sessions/big/events", timeout=120) as response:
            assert response.status_code == 200
            for chunk in response.iter_bytes():
                size += len(chunk)
        assert size > 12_000_000, size
        baseline = rss(pid)

        sockets = [stalled_reader(url, f"/sessions/big/{route}") for _ in range(STALLED)]
        try:
            # Nobody is stalled by them: another session's answer, the whole big one again,
            # and the health check all come back whole...
            small = client.get("/sessions/small/events", timeout=120)
            assert small.status_code == 200 and len(small.text.splitlines()) == 40
            again = client.get("/sessions/big/events", timeout=120)
            assert len(again.content) == size
            assert client.get("/healthz", timeout=60).status_code == 200
            grown = rss(pid) - baseline
            # ... and a turn on another session runs to its end (after the measurement: a first
            # turn warms up the agent's own machinery).
            created = client.post("/sessions", json={}, timeout=120)
            assert created.status_code == 201, created.text
            other = created.json()["id"]
            started = client.post(f"/sessions/{other}/turns", json={"prompt": "hi"}, timeout=120)
            assert started.status_code == 202, started.text
            while client.get(f"/sessions/{other}", timeout=60).json()["lastTurnEnd"] is None:
                time.sleep(0.05)  # no deadline but the test's own
        finally:
            for sock in sockets:
                sock.close()
    print(f"stalled readers: {STALLED}, answer {size} bytes, server RSS grew {grown} bytes")
    # Holding every stalled answer would be STALLED * size (~100 MB); a page each is a few MB.
    assert grown < STALLED * size // 4, (grown, size)
