"""Chat-completions stream payloads -> dsh stream chunks.

One block per content kind: the first non-empty ``reasoning_content`` opens
a reasoning block, the first non-empty ``content`` a text block, and each
``tool_calls[i]`` (by its wire ``index``) its own tool-call block; block indexes
are assigned in first-open order. Deltas are emitted as they arrive.
``block-end`` for every block, ``usage`` and ``finish`` are deferred to
``[DONE]``: usage may come attached to the finish chunk or in a trailing
usage-only chunk, and nothing may follow ``finish``.

Like the SSE decoder this is synchronous: feed it one payload at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from dsh_host.llm import EMPTY_RESPONSE_CODE, LlmError
from dsh_host.llm.wire import http_error_code
from dsh_host.session import (
    BlockEndChunk,
    BlockStartChunk,
    ContentBlock,
    ErrorFinish,
    FinishChunk,
    FinishReason,
    LlmFailure,
    MaxTokensFinish,
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

__all__ = ["DONE", "ChunkTranslator", "map_finish_reason", "map_usage"]

#: The sentinel payload that ends a chat-completions stream.
DONE = "[DONE]"

_decoder = msgspec.json.Decoder()


def map_finish_reason(reason: str) -> FinishReason:
    """``stop``/``tool_calls``/``length`` map to stop/tool-calls/max-tokens; anything else
    (``content_filter``, ``insufficient_system_resource``...) is an error finish."""
    if reason == "stop":
        return StopFinish()
    if reason == "tool_calls":
        return ToolCallsFinish()
    if reason == "length":
        return MaxTokensFinish()
    return ErrorFinish(
        failure=LlmFailure(message=f"model stopped: {reason}", code=reason.upper() or "UNKNOWN")
    )


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise LlmError(
            f"malformed usage in model response: {what} is {value!r}, not a token count",
            "MALFORMED_RESPONSE",
        )
    return value


def map_usage(usage: Any) -> TokenUsage:
    """Wire usage -> disjoint counts: cached prompt tokens are taken out of ``input_tokens``.

    The cached count is ``prompt_tokens_details.cached_tokens`` (OpenAI) or
    ``prompt_cache_hit_tokens`` (DeepSeek); reasoning tokens come from
    ``completion_tokens_details.reasoning_tokens``.
    """
    if not isinstance(usage, dict):
        raise LlmError(
            f"malformed usage in model response: {usage!r}", "MALFORMED_RESPONSE"
        )
    prompt = _count(usage.get("prompt_tokens"), "prompt_tokens") or 0
    completion = _count(usage.get("completion_tokens"), "completion_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = None
    if isinstance(details, dict):
        cached = _count(details.get("cached_tokens"), "prompt_tokens_details.cached_tokens")
    if cached is None:
        cached = _count(usage.get("prompt_cache_hit_tokens"), "prompt_cache_hit_tokens")
    completion_details = usage.get("completion_tokens_details")
    reasoning = None
    if isinstance(completion_details, dict):
        reasoning = _count(
            completion_details.get("reasoning_tokens"),
            "completion_tokens_details.reasoning_tokens",
        )
    extra: dict[str, int] = {}
    if cached is not None:
        extra["cache_read_tokens"] = cached
    if reasoning is not None:
        extra["reasoning_tokens"] = reasoning
    return TokenUsage(
        input_tokens=max(prompt - (cached or 0), 0), output_tokens=completion, **extra
    )


@dataclass(slots=True)
class _Block:
    index: int
    kind: Literal["text", "reasoning", "tool-call"]
    parts: list[str] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None

    def close(self) -> ContentBlock:
        text = "".join(self.parts)
        if self.kind == "text":
            return TextBlock(text=text)
        if self.kind == "reasoning":
            return ReasoningBlock(text=text)
        return ToolCallBlock(id=self.call_id or "", name=self.name or "", arguments=text)


class ChunkTranslator:
    """Stateful translation of one response's payloads."""

    def __init__(self) -> None:
        self._order: list[_Block] = []
        self._text: _Block | None = None
        self._reasoning: _Block | None = None
        self._tools: dict[int, _Block] = {}
        self._finish: FinishReason | None = None
        self._usage: TokenUsage | None = None
        self.done = False

    def _open(self, kind: Literal["text", "reasoning", "tool-call"]) -> _Block:
        block = _Block(len(self._order), kind)
        self._order.append(block)
        return block

    def feed(self, payload: str) -> list[StreamChunk]:
        """Translate one SSE data payload (``[DONE]`` included)."""
        if self.done:
            return []
        if payload == DONE:
            return self._finish_chunks()
        try:
            chunk = _decoder.decode(payload)
        except msgspec.DecodeError:
            raise LlmError(
                f"malformed SSE payload: {payload[:120]}", "MALFORMED_RESPONSE"
            ) from None
        if not isinstance(chunk, dict):
            raise LlmError(
                f"malformed SSE payload (not a JSON object): {payload[:120]}",
                "MALFORMED_RESPONSE",
            )
        error = chunk.get("error")
        if error is not None and not chunk.get("choices"):
            raise _stream_error(error)
        out: list[StreamChunk] = []
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise LlmError(
                f"malformed SSE payload (choices is not a list): {payload[:120]}",
                "MALFORMED_RESPONSE",
            )
        for choice in choices:
            if not isinstance(choice, dict):
                raise LlmError(
                    f"malformed SSE payload (a choice is not an object): {payload[:120]}",
                    "MALFORMED_RESPONSE",
                )
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out, payload)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self._finish = map_finish_reason(reason)
        usage = chunk.get("usage")
        if usage is not None:
            self._usage = map_usage(usage)
        return out

    def _delta(self, delta: dict[str, Any], out: list[StreamChunk], payload: str) -> None:
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            if self._reasoning is None:
                self._reasoning = self._open("reasoning")
                out.append(BlockStartChunk(index=self._reasoning.index, block_type="reasoning"))
            self._reasoning.parts.append(reasoning)
            out.append(ReasoningDeltaChunk(index=self._reasoning.index, text=reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self._text is None:
                self._text = self._open("text")
                out.append(BlockStartChunk(index=self._text.index, block_type="text"))
            self._text.parts.append(content)
            out.append(TextDeltaChunk(index=self._text.index, text=content))
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            raise LlmError(
                f"malformed SSE payload (tool_calls is not a list): {payload[:120]}",
                "MALFORMED_RESPONSE",
            )
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                raise LlmError(
                    f"malformed SSE payload (a tool call is not an object): {payload[:120]}",
                    "MALFORMED_RESPONSE",
                )
            wire_index = call.get("index")
            key = wire_index if type(wire_index) is int else position
            block = self._tools.get(key)
            if block is None:
                block = self._open("tool-call")
                self._tools[key] = block
                out.append(BlockStartChunk(index=block.index, block_type="tool-call"))
            call_id = call.get("id")
            if isinstance(call_id, str) and call_id:
                block.call_id = call_id
            function = call.get("function")
            fragment = ""
            if isinstance(function, dict):
                name = function.get("name")
                if isinstance(name, str) and name:
                    block.name = name
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    fragment = arguments
            block.parts.append(fragment)
            if block.name is None:
                out.append(
                    ToolCallDeltaChunk(
                        index=block.index, id=block.call_id or "", arguments_delta=fragment
                    )
                )
            else:
                out.append(
                    ToolCallDeltaChunk(
                        index=block.index,
                        id=block.call_id or "",
                        name=block.name,
                        arguments_delta=fragment,
                    )
                )

    def _finish_chunks(self) -> list[StreamChunk]:
        self.done = True
        out: list[StreamChunk] = [
            BlockEndChunk(index=block.index, block=block.close()) for block in self._order
        ]
        if self._usage is not None:
            out.append(UsageChunk(usage=self._usage))
        reason = self._finish if self._finish is not None else StopFinish()
        if isinstance(reason, StopFinish) and not self._order:
            reason = ErrorFinish(
                failure=LlmFailure(
                    message="model returned a completed response with no content",
                    code=EMPTY_RESPONSE_CODE,
                )
            )
        out.append(FinishChunk(reason=reason))
        return out


def _stream_error(error: Any) -> LlmError:
    """An ``{"error": ...}`` payload in the middle of a stream (some gateways send one)."""
    message = "model API reported an error mid-stream"
    detail = ""
    status: int | None = None
    if isinstance(error, dict):
        text = error.get("message")
        if isinstance(text, str) and text:
            message = text
        parts = [error.get("code"), error.get("type"), error.get("message")]
        detail = " ".join(str(part) for part in parts if isinstance(part, (str, int)))
        code = error.get("code")
        if type(code) is int and 100 <= code <= 599:
            status = code
    elif isinstance(error, str) and error:
        message = error
        detail = error
    code_name = http_error_code(status, detail) if status is not None else "SERVER"
    return LlmError(message, code_name, status=status)
