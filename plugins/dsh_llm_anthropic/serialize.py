"""dsh request -> Anthropic Messages API request (the keyword arguments of ``messages.create``).

- ``system`` is one text block; ``tools`` are ``{name, description, input_schema}``;
- a user message becomes a ``user`` turn: its ``tool_result`` blocks first (the API wants them
  at the start of the turn that answers the calls), then its attachments, then its text; a
  tool result with images sends ``content`` as a list: its text, then one ``image`` block
  (base64 source) per image;
- an assistant message becomes an ``assistant`` turn of ``thinking`` / ``redacted_thinking``,
  ``text`` and ``tool_use`` blocks, in stream order. Thinking goes back only with the
  signature the API gave it (kept in the message's replay state, one entry per block): the API
  verifies it, and a reasoning block without one (another provider's, or a stream cut short)
  cannot be sent as thinking, so it is left out;
- consecutive turns of one role are merged into one (the API alternates roles);
- prompt caching: ``cache_control: {type: ephemeral}`` marks the end of the stable prefix in
  two places, the system block (tools + system: the same on every request of a session) and
  the last block of the last turn (so the next request, which repeats this whole conversation,
  reads it from the cache). Two of the API's four breakpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from dsh_host.sdk import (
    AssistantMessage,
    Attachment,
    LlmError,
    LlmRequest,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    attached,
    or_default,
    refuse_images,
    replay_entries,
    text_of,
    thaw_json,
    tool_result_images,
    tool_result_text,
    unsupported_effort,
)

__all__ = [
    "EFFORT_BUDGETS",
    "REASONING_EFFORTS",
    "serialize_messages",
    "serialize_request",
]

#: Extended-thinking budget (``budget_tokens``) per effort; ``off`` sends no ``thinking``.
EFFORT_BUDGETS: dict[str, int] = {"low": 2_048, "medium": 8_192, "high": 24_576}
REASONING_EFFORTS: tuple[str, ...] = ("off", *EFFORT_BUDGETS)
#: The smallest budget the API accepts, and what is kept for the answer after thinking.
_MIN_BUDGET = 1_024

_EPHEMERAL = {"type": "ephemeral"}


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's raw arguments as the ``input`` object the API requires.

    The log keeps what the model wrote; a string that is not a JSON object (a truncated or
    broken call, already answered with an error result) goes back as ``{}``.
    """
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    entries = replay_entries(message)
    out: list[dict[str, Any]] = []
    for position, block in enumerate(message.content):
        entry = entries[position] if entries else None
        entry = entry if isinstance(entry, Mapping) else {}
        if isinstance(block, ReasoningBlock):
            redacted = entry.get("redacted_data")
            signature = entry.get("signature")
            if isinstance(redacted, str) and redacted:
                out.append({"type": "redacted_thinking", "data": redacted})
            elif isinstance(signature, str) and signature:
                out.append({"type": "thinking", "thinking": block.text, "signature": signature})
        elif isinstance(block, TextBlock):
            if block.text:  # the API refuses an empty text block
                out.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock):
            out.append(
                {
                    "type": "tool_use",
                    "id": block.id,
                    "name": block.name,
                    "input": _tool_input(block.arguments),
                }
            )
    return out


def _image(attachment: Attachment) -> dict[str, Any]:
    """An ``image`` (or, for a PDF, ``document``) block of base64 bytes."""
    kind = "image" if attachment.kind == "image" else "document"
    source = {"type": "base64", "media_type": attachment.media_type, "data": attachment.data}
    return {"type": kind, "source": source}


def _user(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            images = tool_result_images(block)
            content: Any = tool_result_text(block)
            if images:  # text, then each image, as blocks of the tool_result
                content = [{"type": "text", "text": content}] + [_image(i) for i in images]
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": block.tool_call_id,
                "content": content,
            }
            if block.is_error is True:
                result["is_error"] = True
            out.append(result)
    for attachment in attached(message.content):  # before the text, as Anthropic advises
        out.append(_image(attachment))
    text = text_of(message.content)
    if text:
        out.append({"type": "text", "text": text})
    return out


def serialize_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The conversation as alternating ``user`` / ``assistant`` turns of content blocks."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        refuse_images(message.content, message.role, "anthropic", attachments=True)
        if isinstance(message, AssistantMessage):
            role, content = "assistant", _assistant(message)
        else:  # user and system-surface messages speak as the user (system is top level)
            role, content = "user", _user(message)
        if not content:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(content)
        else:
            turns.append({"role": role, "content": content})
    if turns:
        last = turns[-1]["content"][-1]
        last["cache_control"] = dict(_EPHEMERAL)
    return turns


def thinking_budget(effort: str | None, max_tokens: int) -> int | None:
    """The ``budget_tokens`` of ``effort`` within ``max_tokens`` (None: no thinking)."""
    if effort is None or effort == "off":
        return None
    budget = EFFORT_BUDGETS.get(effort)
    if budget is None:
        raise unsupported_effort("anthropic", effort, REASONING_EFFORTS)
    if max_tokens < 2 * _MIN_BUDGET:
        raise LlmError(
            f'reasoning effort "{effort}" needs max_tokens of at least {2 * _MIN_BUDGET} '
            f"(extended thinking takes at least {_MIN_BUDGET} of them), not {max_tokens}; "
            'raise max_tokens or use effort "off"',
            "UNSUPPORTED_REASONING_EFFORT",
        )
    return min(budget, max_tokens - _MIN_BUDGET)


def serialize_request(
    request: LlmRequest, *, default_max_tokens: int, default_effort: str | None = None
) -> dict[str, Any]:
    """The keyword arguments of one streaming ``messages.create`` call."""
    config = request.config
    max_tokens = or_default(config.max_tokens, default_max_tokens)
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": max_tokens,
        "messages": serialize_messages(request.messages),
    }
    if request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    if request.tools:
        body["tools"] = [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": thaw_json(tool.parameters),
            }
            for tool in request.tools
        ]
    effort = or_default(config.reasoning_effort, default_effort)
    if request.purpose == "session-title":
        effort = None
    budget = thinking_budget(effort, max_tokens)
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if config.temperature is not msgspec.UNSET and config.temperature != 1:
            raise LlmError(
                f"extended thinking runs at temperature 1; this request asks for "
                f'{config.temperature} with reasoning effort "{effort}": drop the temperature '
                'or use effort "off"',
                "INVALID_REQUEST",
            )
    elif config.temperature is not msgspec.UNSET:
        body["temperature"] = config.temperature
    if config.stop is not msgspec.UNSET:
        body["stop_sequences"] = list(config.stop)
    return body
