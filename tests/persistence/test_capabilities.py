"""The storage seam through ``dsh_host.sdk``: the optional capabilities are named protocols the
persistence service checks with ``isinstance``, and ``wire_storage`` is the one call that turns
a storage into the host's ``sessionPersistence`` service with the live sessions bound to it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlStorage
from dsh_session_persistence_sqlite import SqliteStorage

from dsh_host import Row, open_host
from dsh_host.sdk import (
    SESSION_PERSISTENCE,
    SESSIONS,
    MemoryStorage,
    PersistenceService,
    SessionEvent,
    Spawn,
    SupportsCurrentRevision,
    SupportsHeldBy,
    SupportsReadFrom,
    SupportsRoot,
    SupportsStoredEnds,
    wire_storage,
)

from .helpers import log

pytestmark = pytest.mark.anyio


def capabilities(storage: object) -> set[str]:
    kinds = (
        SupportsReadFrom, SupportsCurrentRevision, SupportsHeldBy, SupportsRoot, SupportsStoredEnds
    )
    return {kind.__name__ for kind in kinds if isinstance(storage, kind)}


def test_the_shipped_storages_declare_what_they_can_do(tmp_path: Path) -> None:
    assert capabilities(MemoryStorage()) == {"SupportsStoredEnds"}  # a look-up each (D47)
    assert capabilities(JsonlStorage(str(tmp_path / "jsonl"))) == {
        "SupportsReadFrom",  # reads only the appended bytes (docs/format.md §5.3)
        "SupportsCurrentRevision",
        "SupportsHeldBy",
        "SupportsRoot",
        "SupportsStoredEnds",  # from the follower's cursor, when the file ends there (D47)
    }
    assert capabilities(SqliteStorage(str(tmp_path / "db.sqlite3"))) == {
        "SupportsReadFrom",
        "SupportsCurrentRevision",
        "SupportsRoot",
        "SupportsStoredEnds",
    }


class SuffixReads(MemoryStorage):
    """The in-memory storage plus its own ``read_from``, which says how often it was used."""

    def __init__(self) -> None:
        super().__init__()
        self.suffix_reads = 0

    async def read_from(self, session_id: str, from_seq: int) -> tuple[SessionEvent, ...]:
        self.suffix_reads += 1
        return tuple((await self.load(session_id)).events[from_seq:])


class NoSuffixReads(SuffixReads):
    """A ``read_from`` set to None is no capability (as a missing one)."""

    read_from = None  # type: ignore[assignment]


async def test_the_service_uses_a_capability_only_when_the_storage_has_it() -> None:
    async with open_host([Row(name="sessions")]) as host:
        for storage, used in ((SuffixReads(), 1), (NoSuffixReads(), 0)):
            backend = PersistenceService(storage, spawn=None)
            session = host.ctx.service(SESSIONS).create(seed=log(1), meta={"cwd": "/w"})
            handle = await backend.create(session.header)
            handle.append(list(session.events))
            await handle.flush()
            assert session.events  # a log to read
            events = await backend.read_from(session.id, 0)
            assert [e.seq for e in events] == [e.seq for e in session.events]
            assert storage.suffix_reads == used
            assert backend.root is None  # no SupportsRoot
            assert await backend.held_by(session.id) is None  # no SupportsHeldBy
            await handle.close()
            await backend.aclose()


async def test_wire_storage_provides_the_service_and_persists_live_sessions() -> None:
    storage = MemoryStorage()
    async with open_host([Row(name="sessions")]) as host:
        store = host.ctx.service(SESSIONS)
        before = store.create(seed=log(1), meta={"cwd": "/w"})  # live before the wiring: bound too
        backend = wire_storage(host.ctx, storage, name="test-storage")
        assert host.ctx.get(SESSION_PERSISTENCE) is backend
        after = store.create(seed=log(1), meta={"cwd": "/w"})
        for session in (before, after):
            assert await store.flush(session)  # the binding took part in the barrier
            assert session.events
            stored = await storage.load(session.id)
            assert [e.seq for e in stored.events] == [e.seq for e in session.events]


async def test_wire_storage_takes_a_storage_or_a_service_factory() -> None:
    built: list[PersistenceService[Any]] = []

    def service(spawn: Spawn, logger: logging.Logger) -> PersistenceService[Any]:
        made = PersistenceService(MemoryStorage(), spawn=spawn, logger=logger)
        built.append(made)
        return made

    async with open_host([Row(name="sessions")]) as host:
        assert wire_storage(host.ctx, name="factory", service=service) is built[0]
        with pytest.raises(TypeError, match="one of them"):
            # the mistake under test: mypy refuses it too
            wire_storage(  # type: ignore[call-overload]
                host.ctx, MemoryStorage(), name="both", service=service
            )
        with pytest.raises(TypeError, match="one of them"):
            wire_storage(host.ctx, name="neither")  # type: ignore[call-overload]
