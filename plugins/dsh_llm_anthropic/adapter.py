"""The Anthropic Messages adapter: the official SDK for the wire, dsh for everything else.

One ``messages.create(stream=True)`` per model request, through ``anthropic.AsyncAnthropic``
(one client per row, so one connection pool; the key is read per request and set with
``with_options``). The SDK's own retries are off (``max_retries=0``): a retry is a durable
decision that ``llm-retry`` records in the session log (``llm/retry``) and makes from this
route's policy; a retry inside the SDK would be invisible to the log and would double the
policy's budget.

Every failure leaves as an :class:`~dsh_host._llm.LlmError` with a stable code (the table is in
the README); the error's ``type`` in the API's body decides it, because a mid-stream ``error``
event arrives on a 200 response (an ``overloaded_error`` there is as retryable as a 529).

Cancellation: connecting and every event read run inside ``request.signal.linked_scope()``,
entered and left around that one await, never around a ``yield``; the SDK stream (its HTTP
response) is closed on every way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import anthropic

from dsh_host.sdk import (
    CONTEXT_WINDOW_EXCEEDED_CODE,
    MODEL_NOT_FOUND_CODE,
    QUOTA_EXCEEDED_CODE,
    LlmError,
    LlmRequest,
    ProviderSettings,
    SdkAdapter,
    SdkErrors,
    http_error_code,
    is_context_window_exceeded,
    sdk_client_options,
    status_failure,
)

from .serialize import REASONING_EFFORTS, serialize_request
from .translate import EventTranslator

__all__ = ["AdapterSettings", "AnthropicAdapter", "error_of", "make_client"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings(ProviderSettings):
    """Resolved facts of one ``llm-anthropic`` row (the API requires ``max_tokens``)."""

    endpoint_path: ClassVar[str] = "/v1/messages"

    api_key_env: str
    display_name: str = "Anthropic"
    max_tokens: int = 8_192
    context_window: int | None = 200_000


def make_client(settings: AdapterSettings) -> anthropic.AsyncAnthropic:
    """The row's SDK client: retries off, dsh's timeouts, attribution header."""
    return anthropic.AsyncAnthropic(**sdk_client_options(settings, anthropic.Timeout))


#: The API's error ``type`` -> dsh code, and the status it stands for when it arrives in a
#: stream (HTTP 200). ``overloaded_error`` is a retryable server condition.
_ERROR_TYPES: dict[str, tuple[str, int | None]] = {
    "overloaded_error": ("SERVER", 529),
    "api_error": ("SERVER", 500),
    "rate_limit_error": ("RATE_LIMIT", 429),
    "authentication_error": ("AUTH", 401),
    "permission_error": ("AUTH", 403),
    "billing_error": (QUOTA_EXCEEDED_CODE, 402),
    "request_too_large": ("INVALID_REQUEST", 413),
    "timeout_error": ("TIMEOUT", 504),
}


def _body_error(body: object) -> tuple[str | None, str | None]:
    """(``error.type``, ``error.message``) of an API error body, where present."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, body if isinstance(body, str) and body else None
    kind, message = error.get("type"), error.get("message")
    return (
        kind if isinstance(kind, str) and kind else None,
        message if isinstance(message, str) and message else None,
    )


def error_of(exc: anthropic.APIStatusError, settings: AdapterSettings) -> LlmError:
    """An SDK status error as a classified LlmError (what, where, and what to do)."""
    kind, message = _body_error(exc.body)
    status = exc.status_code
    code: str
    wire_status: int | None = status if 100 <= status <= 599 else None
    if kind in _ERROR_TYPES:
        code, stream_status = _ERROR_TYPES[kind]
        if status < 400:  # an ``error`` event inside a 200 stream
            wire_status = stream_status
    elif kind == "not_found_error" and message is not None and message.startswith("model:"):
        code = MODEL_NOT_FOUND_CODE
    elif (
        kind == "invalid_request_error"
        and message is not None
        and ("prompt is too long" in message or is_context_window_exceeded(message))
    ):
        code = CONTEXT_WINDOW_EXCEEDED_CODE
    else:
        code = http_error_code(status, " ".join(p for p in (kind, message) if p))
        if status < 400:
            code, wire_status = "SERVER", None
    text = message or f"{settings.display_name} API error (HTTP {status})"
    where = f"POST {settings.endpoint}"
    if code == "AUTH":
        text = (
            f"{settings.display_name} API refused the credential (HTTP {wire_status}, {kind}) "
            f"for {where}: {text}; check that ${settings.api_key_env} (the row's api_key_env) "
            f"holds a key valid for {settings.base_url}"
        )
    elif code == MODEL_NOT_FOUND_CODE:
        text = (
            f"{settings.display_name} API does not serve the requested model (HTTP {status} for "
            f"{where}: {text}); name a model this endpoint serves (--model anthropic:MODEL)"
        )
    elif kind == "overloaded_error":
        text = f"{settings.display_name} API is overloaded ({text}); retryable"
    headers = exc.response.headers if exc.response is not None else {}
    return status_failure(
        text,
        code,
        status=wire_status,
        headers=headers,
        request_id=getattr(exc, "request_id", None),
        policy=settings.retry_policy,
    )


class AnthropicAdapter(SdkAdapter[AdapterSettings]):
    """Streams Anthropic Messages through the official SDK (the loop: ``SdkAdapter``)."""

    row = "llm-anthropic"
    errors = SdkErrors.of(anthropic, base=anthropic.AnthropicError)
    closing = "close the Anthropic client"
    end_event = "message_stop"

    def reasoning_efforts(self) -> tuple[str, ...]:
        return REASONING_EFFORTS

    def _key_owner(self) -> str:
        return "your Anthropic API key"

    def _serialize(self, request: LlmRequest) -> dict[str, Any]:
        return serialize_request(
            request,
            default_max_tokens=self.settings.max_tokens,
            default_effort=self.settings.reasoning_effort,
        )

    async def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        return await client.messages.create(stream=True, **kwargs)

    def _translator(self) -> EventTranslator:
        return EventTranslator()

    def _status_error(self, exc: Any) -> LlmError:
        return error_of(exc, self.settings)
