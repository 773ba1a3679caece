"""The scripted model adapter: deterministic, realistic chunk streams from a script.

Each model request consumes the next response of the script and streams it
the way a real provider would: a block per content kind (reasoning, text,
then one per tool call), text split into word deltas, each tool call's
argument JSON split in two deltas (the first carrying the name), block-ends,
usage, then finish. The same script gives the same chunks every time, so it
is the workhorse of tests and demos.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import anyio
import msgspec

from dsh_host.sdk import (
    AbortError,
    BlockEndChunk,
    BlockStartChunk,
    CancelToken,
    FinishChunk,
    FinishReason,
    LlmAdapter,
    LlmError,
    LlmRequest,
    MaxTokensFinish,
    ModelInfo,
    ProviderInfo,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    UsageChunk,
)

from .script import ScriptedResponse, ScriptedToolCall

__all__ = ["ScriptedAdapter", "response_chunks", "split_text", "tool_call_id"]

_WORDS = re.compile(r"\S+\s*|\s+")
#: where a tool call's argument JSON is split (the first delta carries the name)
_ARGS_SPLIT = 5


def split_text(text: str) -> list[str]:
    """Word-sized deltas (each word keeps its trailing whitespace); joined they give ``text``."""
    return _WORDS.findall(text)


def tool_call_id(response_number: int, call_number: int) -> str:
    """The default id of call ``call_number`` of response ``response_number`` (both 1-based)."""
    return f"call_{response_number}_{call_number}"


def _arguments(call: ScriptedToolCall) -> str:
    if isinstance(call.arguments, str):
        return call.arguments
    return msgspec.json.encode(call.arguments).decode()


def response_chunks(
    response: ScriptedResponse, response_number: int
) -> tuple[list[StreamChunk], list[StreamChunk]]:
    """The chunks of one response: (opening chunks: starts + deltas, closing chunks:
    block-ends, usage, finish). Split so a hanging response streams only the first part."""
    opening: list[StreamChunk] = []
    closing: list[StreamChunk] = []
    index = 0
    produced = 0
    if response.reasoning:
        opening.append(BlockStartChunk(index=index, block_type="reasoning"))
        opening.extend(
            ReasoningDeltaChunk(index=index, text=part) for part in split_text(response.reasoning)
        )
        closing.append(BlockEndChunk(index=index, block=ReasoningBlock(text=response.reasoning)))
        produced += len(response.reasoning)
        index += 1
    if response.text:
        opening.append(BlockStartChunk(index=index, block_type="text"))
        opening.extend(TextDeltaChunk(index=index, text=part) for part in split_text(response.text))
        closing.append(BlockEndChunk(index=index, block=TextBlock(text=response.text)))
        produced += len(response.text)
        index += 1
    for number, call in enumerate(response.tool_calls, start=1):
        call_id = call.id or tool_call_id(response_number, number)
        arguments = _arguments(call)
        opening.append(BlockStartChunk(index=index, block_type="tool-call"))
        opening.append(
            ToolCallDeltaChunk(
                index=index, id=call_id, name=call.name, arguments_delta=arguments[:_ARGS_SPLIT]
            )
        )
        opening.append(
            ToolCallDeltaChunk(index=index, id=call_id, arguments_delta=arguments[_ARGS_SPLIT:])
        )
        closing.append(
            BlockEndChunk(
                index=index, block=ToolCallBlock(id=call_id, name=call.name, arguments=arguments)
            )
        )
        produced += len(arguments)
        index += 1
    closing.append(UsageChunk(usage=_usage(response, produced)))
    closing.append(FinishChunk(reason=_finish(response)))
    return opening, closing


def _usage(response: ScriptedResponse, produced: int) -> TokenUsage:
    usage = response.usage
    if usage is None:
        return TokenUsage(input_tokens=10, output_tokens=produced)
    extra: dict[str, Any] = {}
    if usage.cache_read_tokens is not None:
        extra["cache_read_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens is not None:
        extra["cache_write_tokens"] = usage.cache_write_tokens
    if usage.reasoning_tokens is not None:
        extra["reasoning_tokens"] = usage.reasoning_tokens
    return TokenUsage(
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, **extra
    )


def _finish(response: ScriptedResponse) -> FinishReason:
    if response.finish == "max-tokens":
        return MaxTokensFinish()
    if response.finish == "tool-calls" or (response.finish is None and response.tool_calls):
        return ToolCallsFinish()
    return StopFinish()


class ScriptedAdapter(LlmAdapter):
    """Serves the responses of a script in order, one per request.

    ``requests`` records every request received (tests assert on it). An
    exhausted script fails the request with ``SCRIPT_EXHAUSTED``, which the
    runtime turns into an error finish, so the turn ends with an error whose
    message says the script ran out.
    """

    def __init__(
        self,
        responses: Sequence[ScriptedResponse],
        *,
        source: str,
        model: str = "scripted",
        reasoning_efforts: Sequence[str] | None = None,
        context_window: int | None = None,
        vision: bool = True,
        compaction_responses: Sequence[ScriptedResponse] | None = None,
    ) -> None:
        self._responses = list(responses)
        self._context_window = context_window
        self._vision = vision
        self._compaction = list(compaction_responses) if compaction_responses is not None else None
        self._compaction_next = 0
        self._source = source
        self._model = model
        self._efforts = tuple(reasoning_efforts) if reasoning_efforts is not None else None
        self._next = 0
        self.requests: list[LlmRequest] = []

    @property
    def remaining(self) -> int:
        """Responses not yet served."""
        return len(self._responses) - self._next

    def provider_info(self, provider: str) -> ProviderInfo:
        return ProviderInfo(id=provider, name="Scripted model", default_model=self._model)

    async def resolve_model(
        self, provider: str, model: str, signal: CancelToken | None = None
    ) -> ModelInfo:
        return ModelInfo(
            provider=provider,
            id=model,
            name=model,
            reasoning_efforts=self._efforts,
            context_window=self._context_window,
            vision=self._vision,
        )

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        self.requests.append(request)
        if request.purpose == "compaction" and self._compaction is not None:
            if self._compaction_next >= len(self._compaction):
                raise LlmError(
                    f"scripted model: compaction script exhausted: all {len(self._compaction)} "
                    f"compaction_responses of {self._source} were used by earlier summary "
                    "requests; add entries under `compaction_responses:`",
                    "SCRIPT_EXHAUSTED",
                )
            response = self._compaction[self._compaction_next]
            self._compaction_next += 1
            number = self._compaction_next
        else:
            response, number = self._take()
        async with aclosing(self._serve(request, response, number)) as chunks:
            async for chunk in chunks:
                yield chunk

    def _take(self) -> tuple[ScriptedResponse, int]:
        if self._next >= len(self._responses):
            raise LlmError(
                f"scripted model: script exhausted: all {len(self._responses)} responses of "
                f"{self._source} were used by earlier requests; add entries under `responses:`",
                "SCRIPT_EXHAUSTED",
            )
        response = self._responses[self._next]
        self._next += 1
        return response, self._next

    async def _serve(
        self, request: LlmRequest, response: ScriptedResponse, number: int
    ) -> AsyncGenerator[StreamChunk, None]:
        signal = request.signal
        if response.delay_ms:
            await _sleep(response.delay_ms, signal)
        opening, closing = response_chunks(response, number)
        first = True
        for chunk in opening:
            if response.chunk_delay_ms and not first:
                await _sleep(response.chunk_delay_ms, signal)
            first = False
            _check(signal)
            yield chunk
        if response.hang:
            if signal is None:
                raise LlmError(
                    f"scripted model: response {number} of {self._source} hangs until the "
                    "request is cancelled, but the request has no cancel signal",
                    "SCRIPT_HANG_WITHOUT_SIGNAL",
                )
            await signal.wait()
            raise AbortError(signal.reason)
        if response.error is not None:
            _check(signal)
            if response.usage is not None:  # a billed failure: its usage, then the error
                yield UsageChunk(usage=_usage(response, 0))
            error = response.error
            raise LlmError(
                error.message,
                error.code,
                status=error.status,
                provider_retry_after_ms=error.retry_after_ms,
            )
        for chunk in closing:
            if response.chunk_delay_ms and not first:
                await _sleep(response.chunk_delay_ms, signal)
            first = False
            _check(signal)
            yield chunk


def _check(signal: CancelToken | None) -> None:
    if signal is not None:
        signal.throw_if_aborted()


async def _sleep(delay_ms: int, signal: CancelToken | None) -> None:
    """Sleep, cut short by the request's cancellation (which then raises AbortError)."""
    if signal is None:
        await anyio.sleep(delay_ms / 1000)
        return
    with signal.linked_scope():
        await anyio.sleep(delay_ms / 1000)
    signal.throw_if_aborted()
