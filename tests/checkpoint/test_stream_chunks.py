"""The request barrier's stream (docs/decisions.md D50): after the flush, every chunk is the
downstream's own, with no generator of the policy resumed per chunk; closing or throwing into
the stream still closes the downstream, as the relay it replaced did."""

from __future__ import annotations

import inspect
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from dsh_host._llm import LlmRequest
from dsh_host._session import StreamChunk

from .helpers import booted
from .test_barriers import drain, open_step, request_for, with_adapter

pytestmark = pytest.mark.anyio

_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def policy_resumptions() -> tuple[list[str], Callable[[FrameType, str, Any], None]]:
    """A profile function counting each start or resumption of a coroutine or async generator
    frame of the policy's module (the names, in order)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        code = frame.f_code
        if (
            event == "call"
            and code.co_flags & _ASYNC
            and code.co_filename.endswith("dsh_session_checkpoint_policy/__init__.py")
        ):
            seen.append(code.co_qualname)

    return seen, profile


async def test_chunks_after_the_flush_pass_no_generator_of_the_policy(tmp_path: Path) -> None:
    async with booted(tmp_path) as (host, probe):
        probe.install_flush_listener()
        with_adapter(host, probe, tmp_path)
        session = open_step(host, tmp_path)
        stream = host.ctx.llm.stream(request_for(session))
        seen, profile = policy_resumptions()
        sys.setprofile(profile)
        try:
            chunks = await drain(stream)
        finally:
            sys.setprofile(None)
    assert len(chunks) >= 3  # a text reply streams several chunks, then its finish
    assert probe.journal.entries == ["flush:start", "flush:end", "adapter"]
    # The flush's own coroutine, started once (it suspends inside the barrier, so it may be
    # resumed), and the close at the end; nothing per chunk.
    assert set(seen) <= {"_FlushFirst._flush_then_relay", "_FlushFirst.aclose"}
    assert seen.count("_FlushFirst.aclose") == 1
    assert len(seen) < len(chunks)


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
