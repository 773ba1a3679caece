"""The live-binding contract: a persistence plugin in a real host persists ``ctx.sessions``.

The binder is shared (``dsh_host._persistence.binding``); these tests run it over
each backend's plugin. A backend's plugin test module provides a
``live_backend`` fixture (an object satisfying :class:`LiveBackend`) and
star-imports the tests from here::

    from .live_contract import *  # noqa: F403

Real hosts, real storage; assertions are on what is stored, read back by a
fresh backend instance. No test asserts on timing.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import pytest

from dsh_host import Row, open_host
from dsh_host._persistence.persistence import SessionAlreadyExistsError, SessionPersistence
from dsh_host._session.events import event_to_builtins
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._session.session import Session

from .helpers import plain

__all__ = [
    "LiveBackend",
    "flushed_turn",
    "one_turn",
    "test_a_detached_session_can_be_opened_for_writing_at_once",
    "test_a_new_session_reusing_a_stored_id_fails_at_its_flush",
    "test_a_release_racing_shutdown_writes_every_event_once",
    "test_a_session_detached_before_it_was_bound_is_written_at_shutdown",
    "test_live_session_is_durable_after_sessions_flush",
    "test_resume_adopts_the_resumers_write_handle",
    "test_unflushed_events_are_drained_when_the_host_closes",
    "wire",
]

pytestmark = pytest.mark.anyio


class LiveBackend(Protocol):
    """How the contract boots a host with the backend's plugin and reads what it stored."""

    def rows(self) -> list[Row]:
        """``sessions`` plus the persistence plugin's row over this test's store."""
        ...

    async def stored(self, session_id: str) -> list[Any]:
        """The stored events of ``session_id`` in wire form, read by a fresh backend."""
        ...


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def one_turn(session: Session, *, turn: int = 1, close: bool = True) -> None:
    """Append one small turn (closed unless ``close`` is False: the process "crashes" in it)."""
    session.append("turn/start", {"turn": turn})
    session.append(
        "user/message",
        {
            "id": f"u{turn}",
            "role": "user",
            "content": [{"type": "text", "text": "hi"}],
            "source": {"kind": "user"},
        },
        surface_op="append",
    )
    session.append("step/start", {"turn": turn, "step": 1})
    if close:
        session.append("step/end", {"turn": turn, "step": 1})
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


async def flushed_turn(live_backend: LiveBackend, session_id: str, *, close: bool = True) -> None:
    """An earlier process: one turn of ``session_id``, flushed, then the host exits."""
    async with open_host(live_backend.rows()) as host:
        session = host.ctx.sessions.create(session_id, meta={"cwd": "/p"})
        one_turn(session, close=close)
        await host.ctx.sessions.flush(session)


async def test_live_session_is_durable_after_sessions_flush(live_backend: LiveBackend) -> None:
    async with open_host(live_backend.rows()) as host:
        ctx = host.ctx
        assert isinstance(ctx.sessionPersistence, SessionPersistence)
        session = ctx.sessions.create("live-1", meta={"cwd": "/work/project"})
        one_turn(session)
        assert await ctx.sessions.flush(session) is True
        assert await live_backend.stored("live-1") == wire(session.events)


async def test_unflushed_events_are_drained_when_the_host_closes(
    live_backend: LiveBackend,
) -> None:
    async with open_host(live_backend.rows()) as host:
        session = host.ctx.sessions.create("drain", meta={"cwd": "/p"})
        one_turn(session)
        expected = wire(session.events)
    assert await live_backend.stored("drain") == expected


async def test_a_session_detached_before_it_was_bound_is_written_at_shutdown(
    live_backend: LiveBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: binding ran as a task that only starts when the host yields. Detaching
    and exiting before that cancelled it at shutdown, so release found no handle and the
    events were silently never written. Now release and disposal bind first."""
    with caplog.at_level(logging.WARNING):
        async with open_host(live_backend.rows()) as host:
            session = host.ctx.sessions.create("early", meta={"cwd": "/p"})
            one_turn(session)
            host.ctx.sessions.detach(session)  # no yield: the binding task has not started
            expected = wire(session.events)
    assert await live_backend.stored("early") == expected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 5])
async def test_a_release_racing_shutdown_writes_every_event_once(
    live_backend: LiveBackend, caplog: pytest.LogCaptureFixture, yields: int
) -> None:
    """Regression: the release task and the backend's own teardown closed the same handle
    concurrently; one released the lock under the other's write ("lock already released")
    and the buffered batch was lost. Now a second closer waits for the first. ``yields``
    lets the release get that far into its drain before the host exits."""
    with caplog.at_level(logging.WARNING):
        async with open_host(live_backend.rows()) as host:
            session = host.ctx.sessions.create("race", meta={"cwd": "/p"})
            one_turn(session)
            await host.ctx.sessions.flush(session)
            one_turn(session, turn=2)  # buffered only
            host.ctx.sessions.detach(session)
            for _ in range(yields):
                await anyio.lowlevel.checkpoint()
            expected = wire(session.events)
    assert await live_backend.stored("race") == expected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_detached_session_can_be_opened_for_writing_at_once(
    live_backend: LiveBackend,
) -> None:
    """Regression: a session's handle is released by a task after the session leaves the
    store, so an ``open(id, "write")`` right after (a sub-agent's child resumed to decide its
    approval) found the handle still owning the id and was refused. Now the opener finishes
    that release first; the events buffered before the detach are stored once, before its
    read."""
    async with open_host(live_backend.rows()) as host:
        ctx = host.ctx
        session = ctx.sessions.create("again", meta={"cwd": "/p"})
        one_turn(session)
        await ctx.sessions.flush(session)
        one_turn(session, turn=2)  # buffered only
        expected = wire(session.events)
        ctx.sessions.detach(session)  # no yield: the release task has not run
        handle = await ctx.sessionPersistence.open("again", "write")
        try:
            assert wire((await handle.read()).events) == expected
        finally:
            await handle.close()
    assert await live_backend.stored("again") == expected


async def test_resume_adopts_the_resumers_write_handle(live_backend: LiveBackend) -> None:
    await flushed_turn(live_backend, "resume", close=False)  # it "crashes" inside turn 1
    async with open_host(live_backend.rows()) as host:
        ctx = host.ctx
        handle = await ctx.sessionPersistence.open("resume", "write")
        load = await handle.read()
        closers = interrupted_turn_closers(load.events)
        assert [c.type for c in closers] == ["step/end", "turn/end"]
        handle.append(closers)
        await handle.flush()
        restored = Session.restore(load.header, list(load.events) + closers)
        ctx.sessions.attach(restored)  # session/created: the plugin adopts `handle`
        restored.append("turn/start", {"turn": 2})
        await ctx.sessions.flush(restored)
        assert handle.bound is restored
        events = await live_backend.stored("resume")
        assert events == wire(restored.events)
        assert [e["type"] for e in events[3:]] == [
            "step/end",
            "turn/end",
            "session/end-seed",
            "turn/start",
        ]


async def test_a_new_session_reusing_a_stored_id_fails_at_its_flush(
    live_backend: LiveBackend,
) -> None:
    await flushed_turn(live_backend, "taken")
    async with open_host(live_backend.rows()) as host:
        impostor = host.ctx.sessions.create("taken", meta={"cwd": "/p"})
        impostor.append("turn/start", {"turn": 1})
        with pytest.raises(SessionAlreadyExistsError, match="id collision"):
            await host.ctx.sessions.flush(impostor)
    assert len(await live_backend.stored("taken")) == 5  # the stored log is untouched
