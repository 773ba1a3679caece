"""The backend and live-binding contracts run against the in-memory storage.

A contract "store" is one :class:`MemoryStorage` instance: every service built over it
shares its logs, as backend instances over one JSONL root share files. The cross-process
cases skip: an in-memory store is not shared between processes. The live contract runs
the ``session-persistence-memory`` row, whose ``store`` names a process-wide storage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from dsh_session_persistence_memory import shared_store

from dsh_host import Row, open_host
from dsh_host._persistence.backend import PersistenceService
from dsh_host._persistence.persistence import SessionAppendRejectedError
from dsh_host._persistence.storage import MemoryStorage

from .contract import *  # noqa: F403
from .live_contract import *  # noqa: F403
from .live_contract import one_turn, wire

pytestmark = pytest.mark.anyio


class MemoryFactory:
    def __init__(self) -> None:
        self.stores: dict[str, MemoryStorage] = {}

    def make(self, store: str, spawn: Callable[..., Any] | None) -> PersistenceService[Any]:
        return PersistenceService(self.stores.setdefault(store, MemoryStorage()), spawn=spawn)

    def child_source(self, store: str) -> str:
        pytest.skip("an in-memory store is not shared between processes")


class MemoryLive:
    def __init__(self) -> None:
        self.store = f"test-{uuid.uuid4().hex}"

    def rows(self) -> list[Row]:
        config = {"store": self.store}
        return [Row(name="sessions"), Row(name="session-persistence-memory", config=config)]

    async def stored(self, session_id: str) -> list[Any]:
        backend = PersistenceService(shared_store(self.store))
        return wire((await (await backend.open(session_id, "read")).read()).events)


@pytest.fixture
def backend_factory() -> MemoryFactory:
    return MemoryFactory()


@pytest.fixture
def live_backend() -> MemoryLive:
    return MemoryLive()


async def test_a_bound_handle_keeps_no_second_copy_of_the_log(live_backend: MemoryLive) -> None:
    """Issue 17: the handle kept every event beside ``Session.events``. Bound to a live
    session, its log is the session's events; it holds counts and the unwritten queue only."""
    async with open_host(live_backend.rows()) as host:
        session = host.ctx.sessions.create("once", meta={"cwd": "/p"})
        one_turn(session)
        await host.ctx.sessions.flush(session)
        handle = host.ctx.sessionPersistence.owner("once")
        assert handle is not None and handle.bound is session
        assert handle._own is None, "the handle holds a list of its own"
        assert handle.next_seq == handle.durable_seq == len(session.events)
        assert all(a is b for a, b in zip(handle.accepted_events(), session.events, strict=True))
        stray = {"type": "turn/start", "seq": handle.next_seq, "time": 1, "data": {"turn": 9}}
        with pytest.raises(SessionAppendRejectedError, match="append to the session"):
            handle.append([stray])  # the log is the session's: nothing enters behind its back
        assert handle.next_seq == len(session.events)
    assert await live_backend.stored("once") == wire(session.events)
