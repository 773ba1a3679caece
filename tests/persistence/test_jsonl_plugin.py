"""The plugin in a real host: live sessions are persisted through the session store's events.

The live-binding contract (live_contract.py) runs here over JSONL in both encodings; what
is JSONL's own (the artifact path, the window in a host) follows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host import Row, open_host
from dsh_host._persistence import write_behind

from .live_contract import *  # noqa: F403
from .live_contract import one_turn, wire
from .test_jsonl_failures import _until

pytestmark = pytest.mark.anyio


class JsonlLive:
    def __init__(self, root: Path, compression: str) -> None:
        self.root = root
        self.compression = compression

    def rows(self) -> list[Row]:
        config = {"root": str(self.root), "compression": self.compression}
        return [Row(name="sessions"), Row(name="session-persistence-jsonl", config=config)]

    async def stored(self, session_id: str) -> list[Any]:
        backend = JsonlSessionPersistence(str(self.root), self.compression)  # type: ignore[arg-type]
        return wire((await (await backend.open(session_id, "read")).read()).events)


@pytest.fixture(params=["zstd", "none"])
def live_backend(request: pytest.FixtureRequest, tmp_path: Path) -> JsonlLive:
    return JsonlLive(tmp_path, request.param)


async def test_the_artifact_lives_under_the_project_directory(tmp_path: Path) -> None:
    live = JsonlLive(tmp_path, "zstd")
    async with open_host(live.rows()) as host:
        session = host.ctx.sessions.create("live-1", meta={"cwd": "/work/project"})
        path = host.ctx.sessionPersistence.locate(session.header).path
        assert path.startswith(str(tmp_path / "--work-project--" / "live-1"))


async def test_the_window_writes_without_an_explicit_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = anyio.Event()

    async def window(deadline: float) -> None:
        await released.wait()

    monkeypatch.setattr(write_behind, "window_sleep_until", window)
    live = JsonlLive(tmp_path, "zstd")
    async with open_host(live.rows()) as host:
        session = host.ctx.sessions.create("window", meta={"cwd": "/p"})
        one_turn(session)
        backend = host.ctx.sessionPersistence
        await _until(lambda: backend.owner("window") is not None)
        handle = backend.owner("window")
        assert handle.durable_seq == 0
        released.set()
        await _until(lambda: handle.durable_seq == len(session.events))
        assert await live.stored("window") == wire(session.events)
