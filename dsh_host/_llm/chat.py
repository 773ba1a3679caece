"""The chat-completions wire shared by ``llm-openai-compatible`` and ``llm-litellm`` (LiteLLM
normalises every provider to it): the conversation as chat messages
(:func:`serialize_messages`) and stream payloads -> dsh stream chunks (:class:`ChunkTranslator`).

Messages: an assistant message sends ``content`` = its concatenated text (``""``, never null:
some gateways reject null, and a null in a logged message would break every later request of
that session), ``reasoning_content`` when it carried reasoning, and ``tool_calls`` with the raw
argument strings; a user message sends its text as ``{role: "user"}`` when it has text or no
tool results (with its images as ``image_url`` data URIs and PDFs as ``file`` parts, the
text first), then each ``tool-result`` block becomes its own ``{role: "tool", tool_call_id,
content}`` (``(no output)`` when empty).

Chunks:

One block per content kind: the first non-empty ``reasoning_content`` opens
a reasoning block, the first non-empty ``content`` a text block, and each tool
call its own tool-call block; block indexes are assigned in first-open order.
Deltas are emitted as they arrive. ``block-end`` for every block, ``usage`` and
``finish`` are deferred to the end of the answer (``[DONE]``, or a clean end of
the body after a ``finish_reason``): usage may come attached to the finish
chunk or in a trailing usage-only chunk, and nothing may follow ``finish``.

Which call a ``tool_calls`` element continues is decided by :meth:`ChunkTranslator._call_block`.
The wire ``index`` is the key, but real servers do not all send a usable one:
some number every call ``0``, some send none. A new ``id`` under an index that
already has a different id starts a new call (it is never glued onto the
previous call's arguments); without an index the ``id`` is the key, and without
either, an element continues the last call unless it comes second in the same
delta. An element without an id that names a tool starts a new call when the
call it would continue already names another tool, or names one but has no id
(fragments that repeat their call's name next to its id still continue it). Ids are reported as the
server sent them (missing ids stay ``""``, duplicates stay duplicates): the
harness, not the adapter, owns call identity.

Text is JSON-decoded one payload at a time, so a character outside the BMP whose
UTF-16 surrogate pair the server split across two deltas (``"\\ud83d"`` then
``"\\ude00"``) arrives as two halves. The fast decoder refuses a lone
surrogate; such a payload is decoded again leniently and the halves are joined
per block (a half that never finds its partner becomes U+FFFD), so no string
with a lone surrogate ever reaches the log, which must stay valid UTF-8.

``arguments`` sent as a JSON object instead of a string (some servers do) are
re-encoded as the JSON text they denote.

Like the SSE decoder this is synchronous: feed it one payload at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from dsh_host._jsonsafe import thaw_json
from dsh_host._llm.attachments import Attachment, attached, tool_result_images
from dsh_host._llm.convert import (
    completed_reason,
    disjoint_usage,
    refuse_images,
    stopped,
    text_of,
    tool_result_text,
)
from dsh_host._llm.errors import LlmError
from dsh_host._llm.wire import http_error_code
from dsh_host._session import (
    AssistantMessage,
    BlockEndChunk,
    BlockStartChunk,
    ContentBlock,
    FinishChunk,
    FinishReason,
    MaxTokensFinish,
    Message,
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
from dsh_host._session.messages import SystemMessage, ToolResultBlock, ToolSchema

__all__ = [
    "DONE",
    "ChunkTranslator",
    "chat_tools",
    "map_finish_reason",
    "map_usage",
    "serialize_messages",
]

#: The sentinel payload that ends a chat-completions stream.
DONE = "[DONE]"

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _lenient_decode(payload: str) -> Any:
    """Decode a payload the fast decoder refused, accepting lone UTF-16 surrogate escapes.

    Only a payload that is valid JSON apart from unpaired surrogates is accepted; anything else
    stays ``MALFORMED_RESPONSE``.
    """
    try:
        return json.loads(payload)
    except ValueError:
        raise LlmError(f"malformed SSE payload: {payload[:120]}", "MALFORMED_RESPONSE") from None


def _is_high_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


def _pair_surrogates(text: str) -> str:
    """Join adjacent surrogate halves into their character; a lone half becomes U+FFFD."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _arguments_text(arguments: Any) -> str:
    """A call's ``arguments`` as raw JSON text: a string as sent, an object re-encoded."""
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict | list):
        return _encoder.encode(arguments).decode()
    return ""


def map_finish_reason(reason: str) -> FinishReason:
    """``stop``/``tool_calls``/``length`` map to stop/tool-calls/max-tokens; anything else
    (``content_filter``, ``insufficient_system_resource``...) is an error finish."""
    if reason == "stop":
        return StopFinish()
    if reason == "tool_calls":
        return ToolCallsFinish()
    if reason == "length":
        return MaxTokensFinish()
    return stopped(reason)


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
        raise LlmError(f"malformed usage in model response: {usage!r}", "MALFORMED_RESPONSE")
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
    return disjoint_usage(prompt, completion, cached, reasoning)


@dataclass(slots=True)
class _Block:
    index: int
    kind: Literal["text", "reasoning", "tool-call"]
    parts: list[str] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    #: a high surrogate held back until the next delta of this block brings its low half
    pending: str = ""

    def text(self, fragment: str, lenient: bool) -> str:
        """``fragment`` with surrogate halves split across deltas joined (see the module doc).

        Free on the fast path: only a payload the lenient decoder read, or a block holding a
        half, is inspected.
        """
        if not lenient and not self.pending:
            return fragment
        fragment = self.pending + fragment
        self.pending = ""
        if fragment and _is_high_surrogate(fragment[-1]):
            self.pending, fragment = fragment[-1], fragment[:-1]
        return _pair_surrogates(fragment)

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
        #: the current call of each wire index, and of each id (calls sent without an index)
        self._by_index: dict[int, _Block] = {}
        self._by_id: dict[str, _Block] = {}
        self._last_call: _Block | None = None
        self._finish: FinishReason | None = None
        self._usage: TokenUsage | None = None
        self._lenient = False
        self.done = False

    @property
    def finished(self) -> bool:
        """True once a choice carried a ``finish_reason``: the answer is complete, even if
        the server then closes the body without ``[DONE]`` (the OpenAI SDK accepts that too)."""
        return self._finish is not None

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
        return self.feed_object(self._decode(payload), payload)

    def completion(self, body: str) -> list[StreamChunk]:
        """A whole chat completion (``application/json``, not streamed) and the end of it.

        Some servers answer a streaming request with the plain completion; it is translated
        through the same path as a stream: each choice's ``message`` as one delta.
        """
        completion = self._decode(body)
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            if isinstance(completion, dict) and completion.get("error") is not None:
                raise _stream_error(completion["error"])
            raise LlmError(
                f"malformed chat completion (no choices list): {body[:120]}", "MALFORMED_RESPONSE"
            )
        chunk: dict[str, Any] = {
            "choices": [
                {"delta": choice.get("message"), "finish_reason": choice.get("finish_reason")}
                if isinstance(choice, dict)
                else choice
                for choice in completion["choices"]
            ],
            "usage": completion.get("usage"),
        }
        return self.feed_object(chunk, body) + self.feed(DONE)

    def _decode(self, payload: str) -> Any:
        try:
            decoded = _decoder.decode(payload)
            self._lenient = False
        except msgspec.DecodeError:
            decoded = _lenient_decode(payload)
            self._lenient = True
        return decoded

    def feed_object(self, chunk: Any, payload: str = "") -> list[StreamChunk]:
        """Translate one decoded chunk (``payload`` is its text, quoted in errors)."""
        if self.done:
            return []
        if not payload:
            payload = repr(chunk)
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
            if self._lenient or self._reasoning.pending:  # the common path skips the call
                reasoning = self._reasoning.text(reasoning, self._lenient)
            if reasoning:
                self._reasoning.parts.append(reasoning)
                out.append(ReasoningDeltaChunk(index=self._reasoning.index, text=reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self._text is None:
                self._text = self._open("text")
                out.append(BlockStartChunk(index=self._text.index, block_type="text"))
            if self._lenient or self._text.pending:
                content = self._text.text(content, self._lenient)
            if content:
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
            function = call.get("function")
            if not isinstance(function, dict):
                function = {}
            call_id = call.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = None
            name = function.get("name")
            if not isinstance(name, str) or not name:
                name = None
            block = self._call_block(call.get("index"), call_id, name, position, out)
            if call_id is not None:
                block.call_id = call_id
            if name is not None:
                block.name = name
            fragment = block.text(_arguments_text(function.get("arguments")), self._lenient)
            block.parts.append(fragment)
            out.append(self._call_delta(block, fragment))

    def _call_block(
        self,
        wire_index: Any,
        call_id: str | None,
        name: str | None,
        position: int,
        out: list[StreamChunk],
    ) -> _Block:
        """The call a ``tool_calls`` element continues, or a new one (rules: module doc)."""
        block: _Block | None
        if type(wire_index) is int:
            block = self._by_index.get(wire_index)
            if block is not None and call_id is not None and block.call_id not in (None, call_id):
                block = None  # a new id under a reused index: a new call, not more arguments
        elif call_id is not None:
            block = self._by_id.get(call_id)
        else:
            block = self._last_call if position == 0 else None
        if block is not None and call_id is None and name is not None and block.name is not None:
            if name != block.name or block.call_id is None:
                block = None  # a header naming another tool, or repeated without ids: a new call
        if block is None:
            block = self._open("tool-call")
            out.append(BlockStartChunk(index=block.index, block_type="tool-call"))
        if type(wire_index) is int:
            self._by_index[wire_index] = block
        if call_id is not None:
            self._by_id[call_id] = block
        self._last_call = block
        return block

    @staticmethod
    def _call_delta(block: _Block, fragment: str) -> ToolCallDeltaChunk:
        if block.name is None:
            return ToolCallDeltaChunk(
                index=block.index, id=block.call_id or "", arguments_delta=fragment
            )
        return ToolCallDeltaChunk(
            index=block.index, id=block.call_id or "", name=block.name, arguments_delta=fragment
        )

    def _finish_chunks(self) -> list[StreamChunk]:
        self.done = True
        out: list[StreamChunk] = []
        for block in self._order:
            if block.pending:  # a high surrogate whose low half never came
                block.pending = ""
                block.parts.append("\ufffd")
                out.append(
                    self._call_delta(block, "\ufffd")
                    if block.kind == "tool-call"
                    else TextDeltaChunk(index=block.index, text="\ufffd")
                    if block.kind == "text"
                    else ReasoningDeltaChunk(index=block.index, text="\ufffd")
                )
        out.extend(BlockEndChunk(index=block.index, block=block.close()) for block in self._order)
        if self._usage is not None:
            out.append(UsageChunk(usage=self._usage))
        reason = self._finish if self._finish is not None else StopFinish()
        out.append(FinishChunk(reason=completed_reason(reason, bool(self._order))))
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


# -- the request side ---------------------------------------------------------------------
def _assistant(message: AssistantMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant", "content": text_of(message.content)}
    reasoning = "".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
    if reasoning:
        wire["reasoning_content"] = reasoning
    calls = [
        {
            "id": block.id,
            "type": "function",
            "function": {"name": block.name, "arguments": block.arguments},
        }
        for block in message.content
        if isinstance(block, ToolCallBlock)
    ]
    if calls:
        wire["tool_calls"] = calls
    return wire


def _part(attachment: Attachment) -> dict[str, Any]:
    """An image as an ``image_url`` part (a data URI), a PDF as a ``file`` part."""
    if attachment.kind == "image":
        return {"type": "image_url", "image_url": {"url": attachment.data_uri}}
    return {
        "type": "file",
        "file": {"filename": attachment.name, "file_data": attachment.data_uri},
    }



def chat_tools(tools: Iterable[ToolSchema]) -> list[dict[str, Any]]:
    """The request's tool schemas in the chat-completions ``tools`` shape."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": thaw_json(tool.parameters),
            },
        }
        for tool in tools
    ]


def serialize_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The conversation in wire form; each tool result becomes its own ``tool`` message.

    A ``tool`` message holds text only, so the images of tool results follow the run of
    ``tool`` messages they belong to as one ``user`` message of ``image_url`` parts, each
    after a text part naming the call (the API wants every call answered by a ``tool``
    message before anything else is said)."""
    wire: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the images of the current run of tool messages

    def flush() -> None:
        if pending:
            wire.append({"role": "user", "content": list(pending)})
            pending.clear()

    for message in messages:
        refuse_images(message.content, message.role, "chat-completions", attachments=True)
        results = [block for block in message.content if isinstance(block, ToolResultBlock)]
        text = text_of(message.content)
        parts = attached(message.content)
        if not results or text or parts:
            flush()
        if isinstance(message, SystemMessage):
            wire.append({"role": "system", "content": text})
            continue
        if isinstance(message, AssistantMessage):
            wire.append(_assistant(message))
            continue
        if parts:
            content = [{"type": "text", "text": text}] if text else []
            wire.append({"role": "user", "content": content + [_part(a) for a in parts]})
        elif text or not results:
            wire.append({"role": "user", "content": text})
        for result in results:
            images = tool_result_images(result)
            note = ""
            if images:
                count = "1 image" if len(images) == 1 else f"{len(images)} images"
                verb = "follows" if len(images) == 1 else "follow"
                note = f"\n[{count} of this result {verb} in the next user message]"
                pending.append(
                    {"type": "text", "text": f"Images of tool call {result.tool_call_id}:"}
                )
                pending.extend(_part(image) for image in images)
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": result.tool_call_id,
                    "content": tool_result_text(result) + note,
                }
            )
    flush()
    return wire
