"""OpenAI Responses stream events -> dsh stream chunks.

The API streams *output items* (``output_index``): ``response.output_item.added`` opens one,
deltas extend it, ``response.output_item.done`` carries it whole. Each becomes a dsh block at
the next dsh index, in arrival order:

==================  =================  ============================================================
item                dsh block          deltas
==================  =================  ============================================================
``message``         text               ``response.output_text.delta`` (all its text parts)
``reasoning``       reasoning          ``response.reasoning_summary_text.delta``, or
                                       ``response.reasoning_text.delta`` (open-weight models)
``function_call``   tool-call          ``response.function_call_arguments.delta``
==================  =================  ============================================================

Other item types (built-in tools' calls) are skipped. ``block-end`` is emitted at
``output_item.done`` from the item itself (authoritative: its full text or arguments);
``usage`` and ``finish`` at ``response.completed`` / ``response.incomplete``. A reasoning
item's ``id`` and ``encrypted_content`` go into the finish's replay envelope (one entry per
block): with ``store: false`` they are what the next request must send back.

Usage: the API's ``input_tokens`` includes cached tokens; dsh's counts are disjoint, so the
cached part (``input_tokens_details.cached_tokens``) is taken out of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsh_host.sdk import (
    BlockEndChunk,
    BlockKind,
    BlockStartChunk,
    EventBlock,
    FinishReason,
    LlmError,
    MaxTokensFinish,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextDeltaChunk,
    TokenUsage,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    answer_end,
    disjoint_usage,
    http_error_code,
    stopped,
    token_count,
)

__all__ = ["EventTranslator"]


def _get(value: Any, name: str) -> Any:
    """A field of an SDK object or of a plain mapping (unknown events arrive as either)."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


@dataclass(slots=True)
class _Block(EventBlock):
    item_id: str | None = None
    encrypted: str | None = None

    def replay(self) -> dict[str, str] | None:
        if self.kind == "reasoning" and self.item_id and self.encrypted:
            return {"id": self.item_id, "encrypted_content": self.encrypted}
        return None


def failure_error(error: Any, where: str) -> LlmError:
    """``response.failed``'s ``error`` or an ``error`` event as a classified LlmError.

    A failure reported inside the stream is the server's unless its words say otherwise
    (context overflow, quota, unknown model keep their codes; a rate limit is ``RATE_LIMIT``).
    """
    code, message = _get(error, "code"), _get(error, "message")
    text = message if isinstance(message, str) and message else f"the model API failed ({where})"
    detail = " ".join(part for part in (code, message) if isinstance(part, str))
    dsh_code = http_error_code(400, detail)
    if code == "rate_limit_exceeded":
        dsh_code = "RATE_LIMIT"
    elif dsh_code == "INVALID_REQUEST":
        dsh_code = "SERVER"
    return LlmError(text, dsh_code)


class EventTranslator:
    """Stateful translation of one response's events (feed each event object in order)."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._by_output: dict[int, _Block] = {}
        self._response_id: str | None = None
        self.done = False

    def feed(self, event: Any) -> list[StreamChunk]:
        kind = _get(event, "type")
        if kind in (
            "response.output_text.delta",
            "response.function_call_arguments.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
        ):
            return self._delta(event, kind)
        if kind == "response.output_item.added":
            return self._added(event)
        if kind == "response.output_item.done":
            return self._item_done(event)
        if kind == "response.created":
            response_id = _get(_get(event, "response"), "id")
            self._response_id = response_id if isinstance(response_id, str) else None
            return []
        if kind in ("response.completed", "response.incomplete"):
            return self._finish(_get(event, "response"))
        if kind == "response.failed":
            raise failure_error(_get(_get(event, "response"), "error"), "response.failed")
        if kind == "error":
            raise failure_error(event, "error event")
        return []

    def _added(self, event: Any) -> list[StreamChunk]:
        output_index = _get(event, "output_index")
        item = _get(event, "item")
        item_type = _get(item, "type")
        if type(output_index) is not int:
            raise LlmError(
                f"malformed Responses event without output_index: {event!r}", "MALFORMED_RESPONSE"
            )
        kinds: dict[str, BlockKind] = {
            "message": "text",
            "reasoning": "reasoning",
            "function_call": "tool-call",
        }
        if item_type not in kinds:
            return []
        block = _Block(len(self._blocks), kinds[item_type])
        if block.kind == "tool-call":
            call_id, name = _get(item, "call_id"), _get(item, "name")
            block.call_id = call_id if isinstance(call_id, str) else ""
            block.name = name if isinstance(name, str) else ""
        item_id = _get(item, "id")
        block.item_id = item_id if isinstance(item_id, str) else None
        self._blocks.append(block)
        self._by_output[output_index] = block
        return [BlockStartChunk(index=block.index, block_type=block.kind)]

    def _delta(self, event: Any, kind: str) -> list[StreamChunk]:
        block = self._by_output.get(_get(event, "output_index"))
        delta = _get(event, "delta")
        if block is None or block.closed or not isinstance(delta, str) or not delta:
            return []
        block.parts.append(delta)
        if block.kind == "text":
            return [TextDeltaChunk(index=block.index, text=delta)]
        if block.kind == "reasoning":
            return [ReasoningDeltaChunk(index=block.index, text=delta)]
        return [
            ToolCallDeltaChunk(
                index=block.index, id=block.call_id, name=block.name, arguments_delta=delta
            )
        ]

    def _item_done(self, event: Any) -> list[StreamChunk]:
        block = self._by_output.get(_get(event, "output_index"))
        if block is None or block.closed:
            return []
        item = _get(event, "item")
        if block.kind == "text":
            texts = [
                _get(part, "text")
                for part in (_get(item, "content") or ())
                if _get(part, "type") == "output_text"
            ]
            if texts and all(isinstance(t, str) for t in texts):
                block.parts = ["".join(texts)]
        elif block.kind == "tool-call":
            arguments = _get(item, "arguments")
            if isinstance(arguments, str):
                block.parts = [arguments]
        else:
            encrypted = _get(item, "encrypted_content")
            block.encrypted = encrypted if isinstance(encrypted, str) else None
        block.closed = True
        return [BlockEndChunk(index=block.index, block=block.close())]

    def _usage(self, response: Any) -> TokenUsage | None:
        usage = _get(response, "usage")
        if usage is None:
            return None
        total_input = token_count(_get(usage, "input_tokens")) or 0
        output = token_count(_get(usage, "output_tokens")) or 0
        cached = token_count(_get(_get(usage, "input_tokens_details"), "cached_tokens"))
        reasoning = token_count(_get(_get(usage, "output_tokens_details"), "reasoning_tokens"))
        return disjoint_usage(total_input, output, cached, reasoning)

    def _reason(self, response: Any) -> FinishReason:
        status = _get(response, "status")
        if status == "incomplete":
            why = _get(_get(response, "incomplete_details"), "reason")
            if why in (None, "max_output_tokens"):
                return MaxTokensFinish()
            return stopped(str(why))
        if any(block.kind == "tool-call" for block in self._blocks):
            return ToolCallsFinish()
        return StopFinish()  # with no block, ``answer_end`` makes it EMPTY_RESPONSE

    def _finish(self, response: Any) -> list[StreamChunk]:
        self.done = True
        return answer_end(
            self._blocks, self._usage(response), self._reason(response), self._response_id
        )
