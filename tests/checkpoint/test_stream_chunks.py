"""The request barrier's stream: closing it, or throwing into it, after its first chunk closes
the downstream (the policy's relay never leaves an adapter's stream open)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from dsh_host._llm import LlmRequest
from dsh_host._session import StreamChunk

from .helpers import booted
from .test_barriers import open_step, request_for, with_adapter

pytestmark = pytest.mark.anyio

def closing_probe(host: Any, events: list[str]) -> None:
    """An ``llm/stream`` listener inside the policy whose stream records its own close."""

    def inner(
        request: LlmRequest, next_: Callable[[], AsyncIterator[StreamChunk]]
    ) -> AsyncIterator[StreamChunk]:
        async def relay() -> AsyncIterator[StreamChunk]:
            try:
                async for chunk in next_():
                    yield chunk
            finally:
                events.append("downstream closed")

        return relay()

    host.ctx.on("llm/stream", inner)


async def test_closing_after_the_first_chunk_closes_the_downstream(tmp_path: Path) -> None:
    events: list[str] = []
    async with booted(tmp_path) as (host, probe):
        with_adapter(host, probe, tmp_path)
        closing_probe(host, events)
        session = open_step(host, tmp_path)
        async with aclosing(host.ctx.llm.stream(request_for(session))) as stream:
            await stream.__anext__()
            assert events == []
        assert events == ["downstream closed"]
        with pytest.raises(StopAsyncIteration):  # a closed stream has ended
            await stream.__anext__()


async def test_throwing_into_the_stream_closes_the_downstream_and_raises(tmp_path: Path) -> None:
    events: list[str] = []
    async with booted(tmp_path) as (host, probe):
        with_adapter(host, probe, tmp_path)
        closing_probe(host, events)
        session = open_step(host, tmp_path)
        stream = host.ctx.llm.stream(request_for(session))
        await stream.__anext__()
        with pytest.raises(KeyError, match="stop"):
            await stream.athrow(KeyError("stop"))
        assert events == ["downstream closed"]
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
