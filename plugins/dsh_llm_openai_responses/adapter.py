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

import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import openai

from dsh_host.cancel import CancelToken
from dsh_host.errors import AbortError
from dsh_host.llm import (
    MODEL_NOT_FOUND_CODE,
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
    parse_retry_after_ms,
    request_id_of,
    transport_cause,
    user_agent,
)
from dsh_host.session import StreamChunk

from .serialize import REASONING_EFFORTS, serialize_request
from .translate import EventTranslator, failure_error

__all__ = ["AdapterSettings", "OpenAIResponsesAdapter", "error_of", "make_client"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings:
    """Resolved facts of one ``llm-openai-responses`` row."""

    base_url: str
    model: str
    api_key_env: str
    display_name: str = "OpenAI"
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    context_window: int | None = None
    connect_timeout_ms: int = 30_000
    stream_idle_timeout_ms: int = 300_000
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/responses"


def make_client(settings: AdapterSettings) -> openai.AsyncOpenAI:
    """The row's SDK client: retries off, dsh's timeouts, attribution header."""
    connect = settings.connect_timeout_ms / 1000
    return openai.AsyncOpenAI(
        api_key="unset",  # replaced per request (with_options): the key is read when used
        base_url=settings.base_url,
        max_retries=0,  # llm-retry owns retries (module doc)
        timeout=openai.Timeout(
            connect=connect, read=settings.stream_idle_timeout_ms / 1000, write=connect,
            pool=connect,
        ),
        default_headers={
            **{name.lower(): value for name, value in settings.headers.items()},
            "user-agent": user_agent(),
        },
    )


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
    headers = exc.response.headers
    failure = LlmError(
        text,
        code,
        status=status if 100 <= status <= 599 else None,
        provider_retry_after_ms=parse_retry_after_ms(headers.get("retry-after")),
        request_id=getattr(exc, "request_id", None) or request_id_of(headers),
    )
    note = declined_retry_after_note(settings.retry_policy, failure)
    if note is not None:
        failure = LlmError(f"{text}; {note}", code, status=failure.status,
                           provider_retry_after_ms=failure.provider_retry_after_ms,
                           request_id=failure.request_id)
    return failure


def _scope(signal: CancelToken | None) -> AbstractContextManager[Any]:
    return signal.linked_scope() if signal is not None else nullcontext()


_END = object()


async def _next(iterator: Any) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


class OpenAIResponsesAdapter(LlmAdapter):
    """Streams OpenAI Responses through the official SDK."""

    def __init__(self, settings: AdapterSettings, client: openai.AsyncOpenAI) -> None:
        self.settings = settings
        self._client = client

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

    def _api_key(self) -> str:
        env = self.settings.api_key_env
        raw = os.environ.get(env)
        if raw is None:
            raise LlmError(
                f"{env} is not set: export the API key for {self.settings.base_url} as {env} "
                "(the variable name comes from the llm-openai-responses row's `api_key_env`)",
                "MISSING_CREDENTIAL",
            )
        return check_api_key(raw, env)

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        settings = self.settings
        signal = request.signal
        client = self._client.with_options(api_key=self._api_key())
        kwargs = serialize_request(
            request,
            default_effort=settings.reasoning_effort,
            default_max_tokens=settings.max_tokens,
        )
        if signal is not None:
            signal.throw_if_aborted()

        async def create() -> Any:
            return await client.responses.create(stream=True, **kwargs)

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
                    f"{settings.display_name} stream ended before response.completed: the "
                    "answer is incomplete",
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
        except openai.APIStatusError as exc:
            raise error_of(exc, settings) from exc
        except openai.APITimeoutError as exc:
            raise LlmError(
                f"{settings.display_name} API sent nothing for "
                f"{settings.stream_idle_timeout_ms}ms (stream_idle_timeout_ms) or did not "
                f"connect within {settings.connect_timeout_ms}ms",
                "TIMEOUT",
            ) from exc
        except openai.APIConnectionError as exc:
            raise LlmError(
                f"{settings.display_name} API request to {settings.base_url} failed: "
                f"{transport_cause(exc)}",
                "TRANSPORT",
            ) from exc
        except openai.APIResponseValidationError as exc:
            raise LlmError(
                f"{settings.display_name} API sent a response the SDK cannot read: {exc}",
                "MALFORMED_RESPONSE",
            ) from exc
        except openai.APIError as exc:  # an {"error": ...} payload inside the stream
            raise failure_error(exc.body if exc.body is not None else {"message": str(exc)},
                                "stream") from exc
        except ValueError as exc:  # an event whose data is not JSON
            raise LlmError(
                f"{settings.display_name} API sent an event that is not JSON: {exc}",
                "MALFORMED_RESPONSE",
            ) from exc
        except (OSError, openai.OpenAIError) as exc:
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
