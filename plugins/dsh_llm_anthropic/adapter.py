"""The Anthropic Messages adapter: the official SDK for the wire, dsh for everything else.

One ``messages.create(stream=True)`` per model request, through ``anthropic.AsyncAnthropic``
(one client per row, so one connection pool; the key is read per request and set with
``with_options``). The SDK's own retries are off (``max_retries=0``): a retry is a durable
decision that ``llm-retry`` records in the session log (``llm/retry``) and makes from this
route's policy; a retry inside the SDK would be invisible to the log and would double the
policy's budget.

Every failure leaves as an :class:`~dsh_host.llm.LlmError` with a stable code (the table is in
the README); the error's ``type`` in the API's body decides it, because a mid-stream ``error``
event arrives on a 200 response (an ``overloaded_error`` there is as retryable as a 529).

Cancellation: connecting and every event read run inside ``request.signal.linked_scope()``,
entered and left around that one await, never around a ``yield``; the SDK stream (its HTTP
response) is closed on every way out.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anthropic
import anyio

from dsh_host.cancel import CancelToken
from dsh_host.errors import AbortError
from dsh_host.llm import (
    CONTEXT_WINDOW_EXCEEDED_CODE,
    MODEL_NOT_FOUND_CODE,
    QUOTA_EXCEEDED_CODE,
    LlmAdapter,
    LlmError,
    LlmRequest,
    ModelInfo,
    ProviderInfo,
    RetryPolicy,
)
from dsh_host.llm.wire import (
    check_api_key,
    declined_retry_after_note,
    drain_tail,
    http_error_code,
    is_context_window_exceeded,
    parse_retry_after_ms,
    request_id_of,
    transport_cause,
    user_agent,
)
from dsh_host.session import StreamChunk

from .serialize import REASONING_EFFORTS, serialize_request
from .translate import EventTranslator

__all__ = ["AdapterSettings", "AnthropicAdapter", "error_of"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings:
    """Resolved facts of one ``llm-anthropic`` row."""

    base_url: str
    model: str
    api_key_env: str
    display_name: str = "Anthropic"
    reasoning_effort: str | None = None
    max_tokens: int = 8_192
    context_window: int | None = 200_000
    connect_timeout_ms: int = 30_000
    stream_idle_timeout_ms: int = 300_000
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)

    def timeout(self) -> anthropic.Timeout:
        connect = self.connect_timeout_ms / 1000
        return anthropic.Timeout(
            connect=connect, read=self.stream_idle_timeout_ms / 1000, write=connect, pool=connect
        )


def make_client(settings: AdapterSettings) -> anthropic.AsyncAnthropic:
    """The row's SDK client: retries off, dsh's timeouts, attribution header."""
    return anthropic.AsyncAnthropic(
        api_key="unset",  # replaced per request (with_options): the key is read when used
        base_url=settings.base_url,
        max_retries=0,  # llm-retry owns retries (module doc)
        timeout=settings.timeout(),
        default_headers={
            **{name.lower(): value for name, value in settings.headers.items()},
            "user-agent": user_agent(),
        },
    )


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
    elif kind == "invalid_request_error" and message is not None and (
        "prompt is too long" in message or is_context_window_exceeded(message)
    ):
        code = CONTEXT_WINDOW_EXCEEDED_CODE
    else:
        code = http_error_code(status, " ".join(p for p in (kind, message) if p))
        if status < 400:
            code, wire_status = "SERVER", None
    text = message or f"{settings.display_name} API error (HTTP {status})"
    where = f"POST {settings.base_url}/v1/messages"
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
    failure = LlmError(
        text,
        code,
        status=wire_status,
        provider_retry_after_ms=parse_retry_after_ms(headers.get("retry-after")),
        request_id=getattr(exc, "request_id", None) or request_id_of(headers),
    )
    note = declined_retry_after_note(settings.retry_policy, failure)
    if note is not None:
        failure = LlmError(
            f"{text}; {note}",
            code,
            status=failure.status,
            provider_retry_after_ms=failure.provider_retry_after_ms,
            request_id=failure.request_id,
        )
    return failure


def _scope(signal: CancelToken | None) -> AbstractContextManager[Any]:
    return signal.linked_scope() if signal is not None else nullcontext()


class AnthropicAdapter(LlmAdapter):
    """Streams Anthropic Messages through the official SDK."""

    def __init__(self, settings: AdapterSettings, client: anthropic.AsyncAnthropic) -> None:
        self.settings = settings
        self._client = client

    # -- metadata ------------------------------------------------------------------
    def provider_info(self, provider: str) -> ProviderInfo:
        return ProviderInfo(
            id=provider, name=self.settings.display_name, default_model=self.settings.model
        )

    def retry_policy(self, provider: str) -> RetryPolicy:
        return self.settings.retry_policy

    async def resolve_model(
        self, provider: str, model: str, signal: CancelToken | None = None
    ) -> ModelInfo:
        settings = self.settings
        return ModelInfo(
            provider=provider,
            id=model,
            name=model,
            context_window=settings.context_window,
            default_max_tokens=settings.max_tokens,
            reasoning_efforts=REASONING_EFFORTS,
            default_effort=settings.reasoning_effort,
        )

    # -- streaming -----------------------------------------------------------------
    def _api_key(self) -> str:
        env = self.settings.api_key_env
        raw = os.environ.get(env)
        if raw is None:
            raise LlmError(
                f"{env} is not set: export your Anthropic API key as {env} (the variable name "
                "comes from the llm-anthropic row's `api_key_env`)",
                "MISSING_CREDENTIAL",
            )
        return check_api_key(raw, env)

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        settings = self.settings
        signal = request.signal
        client = self._client.with_options(api_key=self._api_key())
        kwargs = serialize_request(
            request,
            default_max_tokens=settings.max_tokens,
            default_effort=settings.reasoning_effort,
        )
        if signal is not None:
            signal.throw_if_aborted()

        async def create() -> Any:
            return await client.messages.create(stream=True, **kwargs)

        events = await self._guarded(create, signal)
        try:
            translator = EventTranslator()
            iterator = events.__aiter__()
            while not translator.done:
                event = await self._guarded(lambda: _next(iterator), signal)
                if event is _END:
                    break
                chunks = translator.feed(event)
                if translator.done:
                    # before the finish chunk: the runtime closes the stream after it
                    await drain_tail(iterator, signal)
                for chunk in chunks:
                    yield chunk
            if not translator.done:
                raise LlmError(
                    f"{settings.display_name} stream ended before message_stop: the answer is "
                    "incomplete",
                    "STREAM_CLOSED",
                )
        finally:
            with anyio.CancelScope(shield=True):
                await events.close()

    async def _guarded(self, call: Callable[[], Awaitable[T]], signal: CancelToken | None) -> T:
        """Await ``call()`` cancellably, with the SDK's exceptions classified."""
        settings = self.settings
        done = False
        result: Any = None
        try:
            with _scope(signal):
                result = await call()
                done = True
        except anthropic.APIStatusError as exc:
            raise error_of(exc, settings) from exc
        except anthropic.APITimeoutError as exc:
            raise LlmError(
                f"{settings.display_name} API sent nothing for "
                f"{settings.stream_idle_timeout_ms}ms (stream_idle_timeout_ms) or did not "
                f"connect within {settings.connect_timeout_ms}ms",
                "TIMEOUT",
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise LlmError(
                f"{settings.display_name} API request to {settings.base_url} failed: "
                f"{transport_cause(exc)}",
                "TRANSPORT",
            ) from exc
        except anthropic.APIResponseValidationError as exc:
            raise LlmError(
                f"{settings.display_name} API sent a response the SDK cannot read: {exc}",
                "MALFORMED_RESPONSE",
            ) from exc
        except ValueError as exc:  # an event whose data is not JSON (the SDK's json.loads)
            raise LlmError(
                f"{settings.display_name} API sent an event that is not JSON: {exc}",
                "MALFORMED_RESPONSE",
            ) from exc
        except (OSError, anthropic.AnthropicError) as exc:  # a body cut mid-transfer, say
            raise LlmError(
                f"{settings.display_name} API stream from {settings.base_url} failed: "
                f"{transport_cause(exc)}",
                "TRANSPORT",
            ) from exc
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("httpx2", "httpx", "httpcore", "h11"):
                raise LlmError(
                    f"{settings.display_name} API stream from {settings.base_url} failed: "
                    f"{transport_cause(exc)}",
                    "TRANSPORT",
                ) from exc
            raise
        if not done:  # the linked scope swallowed the cancellation
            assert signal is not None
            raise AbortError(signal.reason)
        return result  # type: ignore[no-any-return]


_END = object()


async def _next(iterator: Any) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END
