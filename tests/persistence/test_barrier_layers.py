"""The Python layers of a durable barrier, counted (docs/decisions.md D50).

Each test records which Python functions are entered (``sys.setprofile``'s ``call`` events,
by qualified name; a coroutine resumed counts again) while a live session of the JSONL row
appends one event and is flushed, and checks that a layer which does nothing for the barrier
is not among them. What reaches the disk is checked too: the cuts keep the bytes.
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from dsh_host import Row, open_host

pytestmark = pytest.mark.anyio


async def entered(work: Callable[[], Awaitable[None]]) -> Counter[str]:
    """The qualified names of the Python functions entered while ``work()`` runs; a coroutine
    frame is also counted under ``"coroutine " + name``, once however often it resumes."""
    calls: Counter[str] = Counter()
    coroutines: list[FrameType] = []  # kept alive: no id reused while counting

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            calls[code.co_qualname] += 1
            if code.co_flags & inspect.CO_COROUTINE and not any(
                frame is other for other in coroutines
            ):
                coroutines.append(frame)
                calls["coroutine " + code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        await work()
    finally:
        sys.setprofile(None)
    return calls


async def barrier_calls(tmp_path: Path, *, lines: int = 1) -> Counter[str]:
    """The functions entered by ``lines`` appends and one ``ctx.sessions.flush`` of a live,
    published JSONL session (the third such barrier, so nothing of the first is counted)."""
    rows = [
        Row(name="sessions"),
        Row(name="session-persistence-jsonl", config={"root": str(tmp_path)}),
    ]
    async with open_host(rows) as host:
        ctx = host.ctx
        store = ctx.sessions
        session = store.create("layers", meta={"cwd": "/p"})
        for turn in (1, 2):
            session.append("turn/start", {"turn": turn})
            await store.flush(session)

        async def work() -> None:
            for turn in range(3, 3 + lines):
                session.append("turn/start", {"turn": turn})
            await store.flush(session)

        calls = await entered(work)
    from dsh_session_persistence_jsonl import JsonlSessionPersistence

    load = await (await JsonlSessionPersistence(str(tmp_path)).open("layers", "read")).read()
    assert [e.data.turn for e in load.events] == list(range(1, 3 + lines))
    return calls


async def test_the_store_dispatches_on_the_bus_without_the_context_layer(tmp_path: Path) -> None:
    calls = await barrier_calls(tmp_path)
    # The barrier and the append reach their listeners (the binder) ...
    assert calls["LiveBinder.on_flush"] >= 1 and calls["LiveBinder.on_event"] == 1
    # ... through the bus itself: no Context frame, no keyword check, no listener-list copy.
    assert calls["Context.parallel"] == 0
    assert calls["Context.emit"] == 0
    assert calls["_no_keywords"] == 0
    assert calls["EventBus.listeners"] == 0


async def test_the_handle_hands_the_barrier_to_its_write_behind_without_a_frame(
    tmp_path: Path,
) -> None:
    calls = await barrier_calls(tmp_path)
    assert calls["coroutine WriteBehind.flush"] == 1 and calls["coroutine LiveBinder.on_flush"]
    # The handle checks it is usable (a plain call) and returns the write-behind's barrier.
    assert calls["WriteHandle._check_usable"] == 1
    assert calls["coroutine WriteHandle.flush"] == 0
