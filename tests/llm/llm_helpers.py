"""Shared helpers of the LLM tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

from dsh_host import PluginHost, Row, open_host
from dsh_host._llm import LlmRequest
from dsh_host._session import (
    AbortedFinish,
    ErrorFinish,
    FinishChunk,
    LlmCallConfig,
    LlmFailure,
    StreamChunk,
    TextBlock,
)
from dsh_host._session.messages import UserMessage, UserSource, new_message_id

#: The key variable and the provider route of the llm-openai-compatible tests' row.
KEY_ENV = "DSH_TEST_OPENAI_KEY"
PROVIDER = "deepseek-official"


@asynccontextmanager
async def adapter_host(base_url: str, **config: Any) -> AsyncIterator[PluginHost]:
    """A host with one llm-openai-compatible row pointed at ``base_url``."""
    row_config = {"base_url": base_url, "api_key_env": KEY_ENV, **config}
    async with open_host(
        [Row(name="llm"), Row(id="model", name="llm-openai-compatible", config=row_config)]
    ) as host:
        yield host


async def collect(stream: AsyncIterator[StreamChunk]) -> list[StreamChunk]:
    out: list[StreamChunk] = []
    async with aclosing(_gen(stream)) as chunks:
        async for chunk in chunks:
            out.append(chunk)
    return out


async def _gen(stream: AsyncIterator[StreamChunk]) -> AsyncGenerator[StreamChunk, None]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def user(text: str) -> UserMessage:
    return UserMessage(id=new_message_id(), content=(TextBlock(text=text),), source=UserSource())


def request(
    provider: str = "scripted",
    model: str = "scripted",
    messages: Sequence[Any] = (),
    **kwargs: Any,
) -> LlmRequest:
    config_fields = {
        key: kwargs.pop(key)
        for key in ("reasoning_effort", "temperature", "max_tokens", "stop")
        if key in kwargs
    }
    return LlmRequest(
        config=LlmCallConfig(provider=provider, model=model, **config_fields),
        messages=tuple(messages) or (user("hi"),),
        **kwargs,
    )


def terminal_failure(chunks: Sequence[StreamChunk]) -> tuple[str, LlmFailure]:
    """(``error``|``aborted``, failure) of a stream that ended in a failure finish."""
    last = chunks[-1]
    assert isinstance(last, FinishChunk), chunks
    reason = last.reason
    if isinstance(reason, ErrorFinish):
        return "error", reason.failure
    assert isinstance(reason, AbortedFinish), reason
    return "aborted", reason.failure


def finish_count(chunks: Sequence[StreamChunk]) -> int:
    return sum(isinstance(chunk, FinishChunk) for chunk in chunks)
