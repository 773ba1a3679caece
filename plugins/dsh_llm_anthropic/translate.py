"""Anthropic Messages stream events -> dsh stream chunks.

The API numbers its content blocks itself (``index``), one block at a time:
``content_block_start`` opens it, ``content_block_delta`` extends it,
``content_block_stop`` closes it. Each becomes a dsh block at the next dsh index,
in arrival order:

=========================  ====================  =====================================
API block                  dsh block             deltas
=========================  ====================  =====================================
``text``                   text                  ``text_delta``
``thinking``               reasoning             ``thinking_delta`` (+ ``signature_delta``)
``redacted_thinking``      reasoning (no text)   none: its ``data`` is kept for replay
``tool_use``               tool-call             ``input_json_delta`` (raw JSON text)
=========================  ====================  =====================================

Other block types (server tools' blocks) are not part of dsh's vocabulary and are skipped.
``block-end`` is emitted at ``content_block_stop``; ``usage`` and ``finish`` at
``message_stop``. The finish carries the replay envelope ``{"response": {"id"}, "blocks":
[...]}`` with one entry per dsh block: a thinking block's ``signature``, a redacted block's
``redacted_data``, ``null`` for the others. The API needs them back verbatim with the
thinking of the turn that called tools; the log keeps them in the message's source.

Usage is the message's: ``message_start`` gives input and cache counts, ``message_delta`` the
cumulative output (and, on newer servers, the final input counts). The API's ``input_tokens``
already excludes cached tokens, which is dsh's disjoint convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsh_host.sdk import (
    BlockEndChunk,
    BlockStartChunk,
    ErrorFinish,
    EventBlock,
    FinishReason,
    LlmError,
    LlmFailure,
    MaxTokensFinish,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextDeltaChunk,
    TokenUsage,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    answer_end,
    stopped,
    token_count,
)

__all__ = ["EventTranslator", "map_stop_reason"]


def map_stop_reason(reason: str | None) -> FinishReason:
    """``end_turn`` / ``stop_sequence`` / ``pause_turn`` -> stop, ``tool_use`` -> tool-calls,
    ``max_tokens`` / ``model_context_window_exceeded`` -> max-tokens (the output was cut);
    ``refusal`` and anything else -> an error finish naming it."""
    if reason in (None, "end_turn", "stop_sequence", "pause_turn"):
        return StopFinish()
    if reason == "tool_use":
        return ToolCallsFinish()
    if reason in ("max_tokens", "model_context_window_exceeded"):
        return MaxTokensFinish()
    if reason == "refusal":
        return ErrorFinish(
            failure=LlmFailure(
                message="the model declined to answer (stop_reason refusal)", code="REFUSAL"
            )
        )
    return stopped(reason)


@dataclass(slots=True)
class _Block(EventBlock):
    signature: str | None = None
    redacted: str | None = None

    def replay(self) -> dict[str, str] | None:
        if self.redacted is not None:
            return {"redacted_data": self.redacted}
        if self.signature is not None:
            return {"signature": self.signature}
        return None


class EventTranslator:
    """Stateful translation of one response's events (feed each event object in order)."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._by_wire: dict[int, _Block] = {}
        self._message_id: str | None = None
        self._usage: dict[str, int] = {}
        self._stop_reason: str | None = None
        self.done = False

    def feed(self, event: Any) -> list[StreamChunk]:
        kind = getattr(event, "type", None)
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "content_block_stop":
            block = self._by_wire.get(getattr(event, "index", -1))
            if block is None or block.closed:
                return []
            block.closed = True
            return [BlockEndChunk(index=block.index, block=block.close())]
        if kind == "message_start":
            message = getattr(event, "message", None)
            message_id = getattr(message, "id", None)
            self._message_id = message_id if isinstance(message_id, str) else None
            self._take_usage(getattr(message, "usage", None))
            return []
        if kind == "message_delta":
            delta = getattr(event, "delta", None)
            reason = getattr(delta, "stop_reason", None)
            if isinstance(reason, str):
                self._stop_reason = reason
            self._take_usage(getattr(event, "usage", None))
            return []
        if kind == "message_stop":
            return self._finish()
        return []  # ping, and event types this version does not know

    def _start(self, event: Any) -> list[StreamChunk]:
        wire_index = getattr(event, "index", None)
        content = getattr(event, "content_block", None)
        block_type = getattr(content, "type", None)
        if type(wire_index) is not int:
            raise LlmError(
                f"malformed Anthropic event: content_block_start without an index ({event!r})",
                "MALFORMED_RESPONSE",
            )
        block: _Block
        if block_type == "text":
            block = _Block(len(self._blocks), "text")
            text = getattr(content, "text", "")
            out: list[StreamChunk] = [BlockStartChunk(index=block.index, block_type="text")]
            if isinstance(text, str) and text:
                block.parts.append(text)
                out.append(TextDeltaChunk(index=block.index, text=text))
        elif block_type in ("thinking", "redacted_thinking"):
            block = _Block(len(self._blocks), "reasoning")
            out = [BlockStartChunk(index=block.index, block_type="reasoning")]
            if block_type == "redacted_thinking":
                data = getattr(content, "data", None)
                block.redacted = data if isinstance(data, str) else ""
            else:
                thinking = getattr(content, "thinking", "")
                if isinstance(thinking, str) and thinking:
                    block.parts.append(thinking)
                    out.append(ReasoningDeltaChunk(index=block.index, text=thinking))
                signature = getattr(content, "signature", None)
                if isinstance(signature, str) and signature:
                    block.signature = signature
        elif block_type == "tool_use":
            block = _Block(len(self._blocks), "tool-call")
            call_id, name = getattr(content, "id", ""), getattr(content, "name", "")
            block.call_id = call_id if isinstance(call_id, str) else ""
            block.name = name if isinstance(name, str) else ""
            out = [BlockStartChunk(index=block.index, block_type="tool-call")]
        else:
            return []  # a server tool's block: not dsh content
        self._blocks.append(block)
        self._by_wire[wire_index] = block
        return out

    def _delta(self, event: Any) -> list[StreamChunk]:
        block = self._by_wire.get(getattr(event, "index", -1))
        if block is None or block.closed:
            return []
        delta = getattr(event, "delta", None)
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            text = getattr(delta, "text", "")
            if isinstance(text, str) and text:
                block.parts.append(text)
                return [TextDeltaChunk(index=block.index, text=text)]
        elif kind == "input_json_delta":
            fragment = getattr(delta, "partial_json", "")
            if isinstance(fragment, str) and fragment:
                block.parts.append(fragment)
                return [
                    ToolCallDeltaChunk(
                        index=block.index,
                        id=block.call_id,
                        name=block.name,
                        arguments_delta=fragment,
                    )
                ]
        elif kind == "thinking_delta":
            text = getattr(delta, "thinking", "")
            if isinstance(text, str) and text:
                block.parts.append(text)
                return [ReasoningDeltaChunk(index=block.index, text=text)]
        elif kind == "signature_delta":
            signature = getattr(delta, "signature", None)
            if isinstance(signature, str):
                block.signature = (block.signature or "") + signature
        return []

    def _take_usage(self, usage: Any) -> None:
        if usage is None:
            return
        for wire, ours in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_input_tokens", "cache_read_tokens"),
            ("cache_creation_input_tokens", "cache_write_tokens"),
        ):
            value = token_count(getattr(usage, wire, None))
            if value is not None:
                self._usage[ours] = value

    @property
    def usage(self) -> TokenUsage | None:
        if not self._usage:
            return None
        counts = dict(self._usage)
        return TokenUsage(
            input_tokens=counts.pop("input_tokens", 0),
            output_tokens=counts.pop("output_tokens", 0),
            **counts,
        )

    def _finish(self) -> list[StreamChunk]:
        self.done = True
        return answer_end(
            self._blocks, self.usage, map_stop_reason(self._stop_reason), self._message_id
        )
