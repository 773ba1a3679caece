"""The OpenAI Responses adapter: the official ``openai`` SDK for the wire, dsh for the rest.

One ``responses.create(stream=True, store=False)`` per model request, through
``openai.AsyncOpenAI`` (one client per row; the key is read per request and set with
``with_options``). The SDK's own retries are off (``max_retries=0``): ``llm-retry`` makes every
retry from this route's policy and records it in the session log, which a retry inside the SDK
would bypass.

Cancellation: connecting and every event read run inside ``request.signal.linked_scope()``,
never around a ``yield``; the SDK stream (its HTTP response) is closed on every way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import openai

from dsh_host.sdk import (
    MODEL_NOT_FOUND_CODE,
    LlmError,
    LlmRequest,
    ProviderSettings,
    SdkAdapter,
    SdkErrors,
    http_error_code,
    sdk_client_options,
    status_failure,
)

from .serialize import REASONING_EFFORTS, serialize_request
from .translate import EventTranslator, failure_error

__all__ = ["AdapterSettings", "OpenAIResponsesAdapter", "error_of", "make_client"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings(ProviderSettings):
    """Resolved facts of one ``llm-openai-responses`` row."""

    endpoint_path: ClassVar[str] = "/responses"

    api_key_env: str
    display_name: str = "OpenAI"


def make_client(settings: AdapterSettings) -> openai.AsyncOpenAI:
    """The row's SDK client: retries off, dsh's timeouts, attribution header."""
    return openai.AsyncOpenAI(**sdk_client_options(settings, openai.Timeout))


def error_of(exc: openai.APIStatusError, settings: AdapterSettings) -> LlmError:
    """An SDK status error as a classified LlmError (what, where, and what to do)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    message, kind = body.get("message"), body.get("code") or body.get("type")
    message = message if isinstance(message, str) and message else None
    kind = kind if isinstance(kind, str) and kind else None
    status = exc.status_code
    detail = " ".join(part for part in (kind, message) if part)
    code = http_error_code(status, detail)
    text = message or f"{settings.display_name} API error (HTTP {status})"
    where = f"POST {settings.endpoint}"
    if code == "AUTH":
        shown = f", {kind}" if kind else ""
        text = (
            f"{settings.display_name} API refused the credential (HTTP {status}{shown}) for "
            f"{where}: {text}; check that ${settings.api_key_env} (the row's api_key_env) holds "
            f"a key valid for {settings.base_url}"
        )
    elif code == MODEL_NOT_FOUND_CODE:
        text = (
            f"{settings.display_name} API does not serve the requested model (HTTP {status} for "
            f"{where}: {text}); name a model this endpoint serves (--model openai-responses:MODEL)"
        )
    elif status == 404:
        text = (
            f"{settings.display_name} API answered HTTP 404 for {where}: {text}; check base_url "
            "(the Responses API lives under /v1, e.g. https://api.openai.com/v1)"
        )
    return status_failure(
        text,
        code,
        status=status if 100 <= status <= 599 else None,
        headers=exc.response.headers,
        request_id=getattr(exc, "request_id", None),
        policy=settings.retry_policy,
    )


class OpenAIResponsesAdapter(SdkAdapter[AdapterSettings]):
    """Streams OpenAI Responses through the official SDK (the loop: ``SdkAdapter``)."""

    row = "llm-openai-responses"
    errors = SdkErrors.of(openai, base=openai.OpenAIError)
    closing = "close the OpenAI client"
    end_event = "response.completed"

    def reasoning_efforts(self) -> tuple[str, ...]:
        return REASONING_EFFORTS

    def _serialize(self, request: LlmRequest) -> dict[str, Any]:
        return serialize_request(
            request,
            default_effort=self.settings.reasoning_effort,
            default_max_tokens=self.settings.max_tokens,
        )

    async def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        return await client.responses.create(stream=True, **kwargs)

    def _translator(self) -> EventTranslator:
        return EventTranslator()

    def _status_error(self, exc: Any) -> LlmError:
        return error_of(exc, self.settings)

    def _stream_error(self, exc: Exception) -> LlmError:
        """The SDK raises a bare ``APIError`` for an ``{"error": ...}`` payload in the stream."""
        body = getattr(exc, "body", None)
        return failure_error(body if body is not None else {"message": str(exc)}, "stream")
