"""``PersistenceService.read_from`` over a storage with no suffix read of its own but a
``current_revision``: a follower at the end of an unchanged log is answered by that look-up,
not by a read (the JSONL storage used to be such a storage; it now reads only what was
appended, tests/persistence/test_jsonl_read_from.py)."""

from __future__ import annotations

import anyio
import pytest

from dsh_host._persistence.backend import PersistenceService
from dsh_host._persistence.persistence import SessionLoad
from dsh_host._persistence.storage import MemoryStorage

from .contract import wire
from .helpers import header, log, plain

pytestmark = pytest.mark.anyio


class RevisionStorage(MemoryStorage):
    """The in-memory storage plus ``current_revision`` (a look-up, no read), counting reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load(self, session_id: str) -> SessionLoad:
        self.loads += 1
        return await super().load(session_id)

    async def current_revision(self, session_id: str) -> str | None:
        return (await super().load(session_id)).revision


async def test_a_follower_at_the_end_of_an_unchanged_log_is_not_read_again() -> None:
    events = log(2, tools=1)
    storage = RevisionStorage()
    async with anyio.create_task_group() as group:
        service = PersistenceService(storage, spawn=group.start_soon)
        handle = await service.create(header("poll"))
        handle.append(events[:5])
        await handle.flush()
        assert wire(await service.read_from("poll", 0)) == plain(events[:5])
        assert storage.loads == 1
        for _ in range(3):  # an idle session, polled
            assert await service.read_from("poll", 5) == ()
        assert storage.loads == 1
        handle.append(events[5:])
        await handle.flush()
        assert wire(await service.read_from("poll", 5, limit=2)) == plain(events[5:7])
        assert storage.loads == 2
        await handle.close()
        await service.aclose()
        group.cancel_scope.cancel()
