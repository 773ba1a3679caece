"""``read_from`` over the JSONL storage: a follower reads only the bytes appended since its last
read (a cursor per session, validated before use), whatever the compression.

Bytes are counted by the kernel (``rchar`` of ``/proc/self/io``: every byte this process's
``read``/``pread`` calls returned), so a reader that re-reads the log cannot hide it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl._follow import CHUNK_BYTES, MARK_EVERY_BYTES

from dsh_host._persistence.persistence import SessionPersistenceCorruptionError

from .contract import wire
from .helpers import header, log, noisy, plain

pytestmark = pytest.mark.anyio

#: Bytes a read may cost beyond what it must read: the cursor's 32-byte check, a partial
#: chunk, ``find``'s reads; far below the logs' sizes here.
SLACK = 16 * 1024

Compression = Literal["zstd", "none"]


def rchar() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def log_path(root: Path, session_id: str) -> Path:
    (found,) = (p for p in root.rglob("session.v3.jsonl*") if p.parent.name == session_id)
    return found


@asynccontextmanager
async def persistence(root: Path, compression: Compression) -> AsyncIterator[Any]:
    async with anyio.create_task_group() as group:
        backend = JsonlSessionPersistence(str(root), compression, spawn=group.start_soon)
        try:
            yield backend
        finally:
            await backend.aclose()
            group.cancel_scope.cancel()


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_follower_reads_only_what_was_appended(
    tmp_path: Path, compression: Compression
) -> None:
    events = noisy(log(600, tools=1), 2048)
    first, rest = events[: len(events) - 40], events[len(events) - 40 :]
    root = tmp_path / "root"
    async with persistence(root, compression) as writer, persistence(root, compression) as reader:
        handle = await writer.create(header("follow"))
        for start in range(0, len(first), 500):
            handle.append(first[start : start + 500])
            await handle.flush()
        path = log_path(root, "follow")
        size = path.stat().st_size
        assert size > 2 * (MARK_EVERY_BYTES + CHUNK_BYTES), size

        before = rchar()
        assert wire(await reader.read_from("follow", 0)) == plain(first)
        whole = rchar() - before
        assert whole >= size  # the first read reads the log once

        for _ in range(3):  # an idle session, polled: no read but the cursor's check
            before = rchar()
            assert await reader.read_from("follow", len(first)) == ()
            assert rchar() - before < SLACK

        handle.append(rest)
        await handle.flush()
        appended = path.stat().st_size - size
        before = rchar()
        assert wire(await reader.read_from("follow", len(first))) == plain(rest)
        assert rchar() - before < appended + SLACK, (appended, size)

        # An earlier seq starts at the nearest mark before it, not at the header.
        before = rchar()
        tail = await reader.read_from("follow", len(first) - 5)
        assert wire(tail) == plain(events[len(first) - 5 :])
        assert rchar() - before < MARK_EVERY_BYTES + CHUNK_BYTES + appended + SLACK

        # A page: at most ``limit`` events, exactly the ones asked for.
        assert wire(await reader.read_from("follow", 10, limit=7)) == plain(events[10:17])

        # A walk in pages (what `dsh sessions verify` and GET /events do) gives the log exactly
        # and reads it about once: each page goes on from the rows the last one decoded.
        walked: list[Any] = []
        before = rchar()
        while True:
            page = await reader.read_from("follow", len(walked), limit=97)
            walked += page
            if len(page) < 97:
                break
        assert wire(walked) == plain(events)
        total = path.stat().st_size
        assert rchar() - before < total + MARK_EVERY_BYTES + CHUNK_BYTES + SLACK, total
        await handle.close()


async def test_a_truncated_and_rewritten_log_is_read_again_from_a_valid_point(
    tmp_path: Path,
) -> None:
    """A write rolled back (the file cut below the cursor) and other events appended under the
    same seqs: the cursor's check fails and the follower reads what is stored now."""
    events = log(3, tools=1)
    root = tmp_path / "root"
    async with persistence(root, "none") as writer, persistence(root, "none") as reader:
        handle = await writer.create(header("cut"))
        handle.append(events)
        await handle.flush()
        await handle.close()
        assert wire(await reader.read_from("cut", 0)) == plain(events)

        path = log_path(root, "cut")
        lines = path.read_bytes().splitlines(keepends=True)
        keep = len(lines) - 3  # the header and the events before the last three
        path.write_bytes(b"".join(lines[:keep]))
        stored = keep - 1
        replaced = [dict(e) for e in events[stored:]]
        replaced[0] = {**replaced[0], "time": replaced[0]["time"] + 1_000_000}
        handle = await writer.open("cut", "write")
        handle.append(replaced)
        await handle.flush()
        await handle.close()

        got = await reader.read_from("cut", stored)
        assert wire(got) == plain(replaced)
        assert wire(await reader.read_from("cut", 0)) == plain(events[:stored] + replaced)


async def test_damage_is_decided_by_the_full_read(tmp_path: Path) -> None:
    """A follower that meets a damaged committed line does not skip or show it: the whole-log
    rules decide (here: corruption, a closed turn follows the damage)."""
    events = log(3, tools=1)
    root = tmp_path / "root"
    async with persistence(root, "none") as writer, persistence(root, "none") as reader:
        handle = await writer.create(header("bad"))
        handle.append(events[:3])
        await handle.flush()
        await handle.close()
        assert len(await reader.read_from("bad", 0)) == 3
        path = log_path(root, "bad")
        handle = await writer.open("bad", "write")
        handle.append(events[3:])
        await handle.flush()
        await handle.close()
        data = bytearray(path.read_bytes())
        lines = bytes(data).splitlines(keepends=True)
        at = sum(len(line) for line in lines[:5]) + 2  # inside the event at seq 4
        data[at] = ord("#")
        path.write_bytes(bytes(data))
        with pytest.raises(SessionPersistenceCorruptionError):
            await reader.read_from("bad", 3)
        os.truncate(path, sum(len(line) for line in lines[:5]))
        assert wire(await reader.read_from("bad", 3)) == plain(events[3:4])


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_walk_in_pages_of_a_log_of_small_batches_reads_it_about_once(
    tmp_path: Path, compression: Compression
) -> None:
    """A live log is many small batches (a frame each in zstd): a walk in pages still reads
    each byte about once (a page goes on with the bytes and rows the last one read)."""
    events = noisy(log(250, tools=1), 512)
    root = tmp_path / "root"
    async with persistence(root, compression) as writer, persistence(root, compression) as reader:
        handle = await writer.create(header("small"))
        for start in range(0, len(events), 5):
            handle.append(events[start : start + 5])
            await handle.flush()
        await handle.close()
        total = log_path(root, "small").stat().st_size
        walked: list[Any] = []
        before = rchar()
        while True:
            page = await reader.read_from("small", len(walked), limit=97)
            walked += page
            if len(page) < 97:
                break
        assert wire(walked) == plain(events)
        assert rchar() - before < total + CHUNK_BYTES + SLACK, total
