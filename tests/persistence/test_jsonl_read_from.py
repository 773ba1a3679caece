"""``read_from`` over the JSONL storage (which has no suffix read of its own): a log that
cannot hold anything new (its ``current_revision`` is the one the service last read it at, and
the follower is already at its end) is not read again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence, _backend
from dsh_session_persistence_jsonl._reader import read_artifact

from .contract import wire
from .helpers import header, log, plain

pytestmark = pytest.mark.anyio


async def test_a_follower_at_the_end_of_an_unchanged_log_does_not_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = read_artifact  # the function _backend calls by this name

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_backend, "read_artifact", counted)
    events = log(2, tools=1)
    async with anyio.create_task_group() as group:
        backend = JsonlSessionPersistence(str(tmp_path / "root"), "zstd", spawn=group.start_soon)
        handle = await backend.create(header("poll"))
        handle.append(events[:5])
        await handle.flush()

        assert wire(await backend.read_from("poll", 0)) == plain(events[:5])
        assert len(reads) == 1
        for _ in range(3):  # an idle session, polled
            assert await backend.read_from("poll", 5) == ()
        assert len(reads) == 1

        os.utime(reads[0])  # a new revision, the same events: read again, nothing new
        assert await backend.read_from("poll", 5) == ()
        assert len(reads) == 2

        handle.append(events[5:])
        await handle.flush()
        assert wire(await backend.read_from("poll", 5)) == plain(events[5:])
        assert len(reads) == 3
        assert wire(await backend.read_from("poll", 7)) == plain(events[7:])  # before the end
        assert len(reads) == 4

        await handle.close()
        await backend.aclose()
        group.cancel_scope.cancel()

