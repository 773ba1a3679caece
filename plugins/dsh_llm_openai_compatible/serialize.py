"""dsh request -> chat-completions request body.

- system prompt first, as ``{role: "system", content}``;
- an assistant message sends ``content`` = its concatenated text (``""``, never
  null: some gateways reject null, and a null in a logged message would break
  every later request of that session), ``reasoning_content`` when it carried
  reasoning, and ``tool_calls`` with the raw argument strings;
- a user message sends its text as ``{role: "user"}`` when it has text or no
  tool results, then each ``tool-result`` block becomes its own
  ``{role: "tool", tool_call_id, content}`` (``(no output)`` when empty);
- optional request fields are omitted, never sent as null.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from dsh_host.sdk import (
    LlmError,
    LlmRequest,
    chat_tools,
    serialize_messages,
    unsupported_effort,
)

__all__ = ["REASONING_EFFORTS", "Thinking", "serialize_messages", "serialize_request"]

#: Efforts the DeepSeek wire understands; ``off`` disables thinking.
REASONING_EFFORTS: tuple[str, ...] = ("off", "low", "high", "max")
Thinking = Literal["enabled", "disabled"]


def _thinking(request: LlmRequest, thinking: Thinking | None) -> tuple[Thinking | None, str | None]:
    """The (thinking type, wire effort) pair; ``off`` is never sent as an effort."""
    if request.purpose == "session-title":
        return "disabled", None
    effort = request.config.reasoning_effort
    if effort is msgspec.UNSET:
        return thinking, None
    if effort not in REASONING_EFFORTS:
        raise unsupported_effort("openai-compatible", effort, REASONING_EFFORTS)
    if effort == "off":
        return "disabled", None
    if thinking == "disabled":
        raise LlmError(
            f'this deployment has thinking disabled, so reasoning effort "{effort}" is not '
            "supported",
            "UNSUPPORTED_REASONING_EFFORT",
        )
    return "enabled", effort


def serialize_request(request: LlmRequest, *, thinking: Thinking | None = None) -> dict[str, Any]:
    """The full streaming request body for ``POST <base_url>/chat/completions``."""
    config = request.config
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(serialize_messages(request.messages))
    body: dict[str, Any] = {
        "model": config.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    thinking_type, effort = _thinking(request, thinking)
    if thinking_type is not None:
        body["thinking"] = {"type": thinking_type}
    if effort is not None:
        body["reasoning_effort"] = effort
    if request.tools:
        body["tools"] = chat_tools(request.tools)
    if config.temperature is not msgspec.UNSET:
        body["temperature"] = config.temperature
    if config.max_tokens is not msgspec.UNSET:
        body["max_tokens"] = config.max_tokens
    if config.stop is not msgspec.UNSET:
        body["stop"] = list(config.stop)
    return body
