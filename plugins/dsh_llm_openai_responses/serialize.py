"""dsh request -> OpenAI Responses API request (the keyword arguments of ``responses.create``).

- ``instructions`` is the system prompt; ``tools`` are ``{type: function, name, description,
  parameters, strict: false}`` (dsh validates arguments itself; strict mode would rewrite the
  schemas);
- ``input`` is a list of items: a user message's text as a ``user`` message of ``input_text``,
  each tool result as a ``function_call_output`` (``call_id``, the result's text; with images,
  ``output`` is the list form: ``input_text`` then one ``input_image`` each); an assistant
  message as its reasoning items, an ``assistant`` message of ``output_text`` and one
  ``function_call`` per tool call, in stream order;
- ``store: false``: the API keeps nothing between requests, the session log is the state. So a
  reasoning item goes back only as the API gave it, with its ``id`` and ``encrypted_content``
  (requested with ``include: ["reasoning.encrypted_content"]`` and kept in the message's replay
  state, one entry per block); a reasoning block without them (another provider's, or a stream
  cut short) cannot be sent as reasoning and is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from dsh_host.sdk import (
    AssistantMessage,
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

__all__ = ["REASONING_EFFORTS", "serialize_input", "serialize_request"]

#: The Responses API's efforts; ``off`` sends no ``reasoning`` (the model's default applies).
REASONING_EFFORTS: tuple[str, ...] = ("off", "minimal", "low", "medium", "high")


def _assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    entries = replay_entries(message)
    items: list[dict[str, Any]] = []
    for position, block in enumerate(message.content):
        entry = entries[position] if entries else None
        entry = entry if isinstance(entry, Mapping) else {}
        if isinstance(block, ReasoningBlock):
            item_id, encrypted = entry.get("id"), entry.get("encrypted_content")
            if isinstance(item_id, str) and isinstance(encrypted, str) and encrypted:
                summary = [{"type": "summary_text", "text": block.text}] if block.text else []
                items.append(
                    {
                        "type": "reasoning",
                        "id": item_id,
                        "summary": summary,
                        "encrypted_content": encrypted,
                    }
                )
        elif isinstance(block, TextBlock):
            if block.text:
                items.append(
                    {"role": "assistant", "content": [{"type": "output_text", "text": block.text}]}
                )
        elif isinstance(block, ToolCallBlock):
            items.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": block.arguments,
                }
            )
    return items


def serialize_input(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The conversation as Responses ``input`` items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        refuse_images(message.content, message.role, "openai-responses", attachments=True)
        if isinstance(message, AssistantMessage):
            items.extend(_assistant(message))
            continue
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                images = tool_result_images(block)
                output: Any = tool_result_text(block)
                if images:  # the list form: input_text, then one input_image per image
                    output = [{"type": "input_text", "text": output}] + [
                        {"type": "input_image", "image_url": image.data_uri} for image in images
                    ]
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": block.tool_call_id,
                        "output": output,
                    }
                )
        text = text_of(message.content)
        content: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text else []
        for attachment in attached(message.content):
            if attachment.kind == "image":
                content.append({"type": "input_image", "image_url": attachment.data_uri})
            else:
                content.append(
                    {
                        "type": "input_file",
                        "filename": attachment.name,
                        "file_data": attachment.data_uri,
                    }
                )
        if content:
            items.append({"role": "user", "content": content})
    return items


def serialize_request(
    request: LlmRequest, *, default_effort: str | None = None, default_max_tokens: int | None
) -> dict[str, Any]:
    """The keyword arguments of one streaming ``responses.create`` call."""
    config = request.config
    body: dict[str, Any] = {
        "model": config.model,
        "input": serialize_input(request.messages),
        "store": False,
    }
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": thaw_json(tool.parameters),
                "strict": False,
            }
            for tool in request.tools
        ]
    effort = or_default(config.reasoning_effort, default_effort)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise unsupported_effort("openai-responses", effort, REASONING_EFFORTS)
    if effort not in (None, "off") and request.purpose != "session-title":
        body["reasoning"] = {"effort": effort, "summary": "auto"}
        body["include"] = ["reasoning.encrypted_content"]
    max_tokens = or_default(config.max_tokens, default_max_tokens)
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    if config.temperature is not msgspec.UNSET:
        body["temperature"] = config.temperature
    if config.stop is not msgspec.UNSET:
        raise LlmError(
            "the Responses API has no stop sequences; drop `stop` from the request, or use "
            "the openai-compatible adapter (chat completions) for this model",
            "INVALID_REQUEST",
        )
    return body
