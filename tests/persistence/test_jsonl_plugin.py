"""The plugin in a real host: live sessions are persisted through the session store's events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence
from dsh_session_persistence_jsonl import _backend as backend_module

from dsh_host import Row, open_host
from dsh_host.session.events import event_to_builtins
from dsh_host.session.persistence import SessionAlreadyExistsError, SessionPersistence
from dsh_host.session.repair import interrupted_turn_closers
from dsh_host.session.session import Session

from .helpers import plain
from .test_jsonl_failures import _until

pytestmark = pytest.mark.anyio


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def rows(root: Path, **config: Any) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(root), **config}),
    ]


def one_turn(session: Session, *, close: bool = True) -> None:
    session.append("turn/start", {"turn": 1})
    session.append(
        "user/message",
        {
            "id": "u1",
            "role": "user",
            "content": [{"type": "text", "text": "hi"}],
            "source": {"kind": "user"},
        },
        surface_op="append",
    )
    session.append("step/start", {"turn": 1, "step": 1})
    if close:
        session.append("step/end", {"turn": 1, "step": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


async def stored(root: Path, sid: str, compression: str = "zstd") -> list[Any]:
    backend = JsonlSessionPersistence(str(root), compression)  # type: ignore[arg-type]
    return wire((await (await backend.open(sid, "read")).read()).events)


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_live_session_is_durable_after_sessions_flush(
    tmp_path: Path, compression: str
) -> None:
    async with open_host(rows(tmp_path, compression=compression)) as host:
        ctx = host.ctx
        assert isinstance(ctx.sessionPersistence, SessionPersistence)
        session = ctx.sessions.create("live-1", meta={"cwd": "/work/project"})
        one_turn(session)
        assert await ctx.sessions.flush(session) is True
        assert await stored(tmp_path, "live-1", compression) == wire(session.events)
        path = ctx.sessionPersistence.locate(session.header).path
        assert path.startswith(str(tmp_path / "--work-project--" / "live-1"))


async def test_unflushed_events_are_drained_when_the_host_closes(tmp_path: Path) -> None:
    async with open_host(rows(tmp_path)) as host:
        session = host.ctx.sessions.create("drain", meta={"cwd": "/p"})
        one_turn(session)
        expected = wire(session.events)
    assert await stored(tmp_path, "drain") == expected


async def test_the_window_writes_without_an_explicit_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = anyio.Event()

    async def window() -> None:
        await released.wait()

    monkeypatch.setattr(backend_module, "_sleep_window", window)
    async with open_host(rows(tmp_path)) as host:
        session = host.ctx.sessions.create("window", meta={"cwd": "/p"})
        one_turn(session)
        backend = host.ctx.sessionPersistence
        await _until(lambda: backend.owner("window") is not None)
        handle = backend.owner("window")
        assert handle.durable_seq == 0
        released.set()
        await _until(lambda: handle.durable_seq == len(session.events))
        assert await stored(tmp_path, "window") == wire(session.events)


async def test_resume_adopts_the_resumers_write_handle(tmp_path: Path) -> None:
    async with open_host(rows(tmp_path)) as host:
        session = host.ctx.sessions.create("resume", meta={"cwd": "/p"})
        one_turn(session, close=False)  # the process "crashes" inside turn 1
        await host.ctx.sessions.flush(session)
    async with open_host(rows(tmp_path)) as host:
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
        events = await stored(tmp_path, "resume")
        assert events == wire(restored.events)
        assert [e["type"] for e in events[3:]] == [
            "step/end",
            "turn/end",
            "session/end-seed",
            "turn/start",
        ]


async def test_a_new_session_reusing_a_stored_id_fails_at_its_flush(tmp_path: Path) -> None:
    async with open_host(rows(tmp_path)) as host:
        first = host.ctx.sessions.create("taken", meta={"cwd": "/p"})
        one_turn(first)
        await host.ctx.sessions.flush(first)
    async with open_host(rows(tmp_path)) as host:
        impostor = host.ctx.sessions.create("taken", meta={"cwd": "/p"})
        impostor.append("turn/start", {"turn": 1})
        with pytest.raises(SessionAlreadyExistsError, match="id collision"):
            await host.ctx.sessions.flush(impostor)
    assert len(await stored(tmp_path, "taken")) == 5  # the stored log is untouched
