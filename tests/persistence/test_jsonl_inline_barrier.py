"""The JSONL row's ``inline_barrier_ms``: where a barrier's write + fsync runs, judged by the
thread that made the fsync (``os.fsync`` watched), and the bytes that reached the disk."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host.errors import ConfigError

pytestmark = pytest.mark.anyio


async def flush_and_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]
) -> list[int]:
    """Three barriers of one live session; the thread of every fsync of its log."""
    real_fsync = os.fsync
    threads: list[int] = []
    log_fds: set[int] = set()

    def watched(fd: int) -> None:
        if fd in log_fds:
            threads.append(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watched)
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(tmp_path), **config}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx
        session = ctx.sessions.create("lane", meta={"cwd": "/p"})
        session.append("turn/start", {"turn": 1})
        await ctx.sessions.flush(session)  # publishes the log (its own fsyncs, not watched)
        lease = ctx.sessionPersistence.owner("lane").lease
        for turn in (2, 3, 4):
            session.append("turn/start", {"turn": turn})
            log_fds.add(lease.log_fd())
            await ctx.sessions.flush(session)
    load = await _read(tmp_path, "lane")
    assert [e.data.turn for e in load.events] == [1, 2, 3, 4]  # every barrier reached the log
    return threads


async def _read(root: Path, session_id: str) -> Any:
    from dsh_session_persistence_jsonl import JsonlSessionPersistence

    backend = JsonlSessionPersistence(str(root))
    return await (await backend.open(session_id, "read")).read()


async def test_a_lone_session_within_the_budget_fsyncs_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget no fsync of this machine exceeds: the verdict must not depend on disk weather.
    threads = await flush_and_watch(tmp_path, monkeypatch, {"inline_barrier_ms": 1000})
    assert threads == [threading.get_ident()] * 3


@pytest.mark.parametrize("key", ["inline_barrier_ms", "inlineBarrierMs"])
async def test_zero_keeps_every_fsync_on_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    threads = await flush_and_watch(tmp_path, monkeypatch, {key: 0})
    assert len(threads) == 3 and threading.get_ident() not in threads


async def test_a_negative_budget_fails_the_row(tmp_path: Path) -> None:
    rows = [
        Row(name="sessions"),
        Row(
            name="session-persistence-jsonl",
            config={"root": str(tmp_path), "inline_barrier_ms": -1},
        ),
    ]
    with pytest.raises(ConfigError, match=r"config\.inline_barrier_ms: expected float >= 0\.0"):
        async with open_host(rows):
            pass
