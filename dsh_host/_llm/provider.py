"""What every provider plugin shares, from its config row to the stream: one owner each.

A provider plugin resolves its row (:func:`resolve_base_url`, :meth:`ProviderSettings.of`),
builds one client per row and registers its adapter (:func:`register_adapter`). Its adapter
subclasses :class:`ProviderAdapter` (route metadata from the settings, the key read per request)
or, over a provider SDK generated in the Stainless shape (``anthropic``, ``openai``),
:class:`SdkAdapter`, which owns the whole stream loop: every await on the network cancellable
and classified in one place, the tail of the body read before ``finish`` (the kept-alive
connection survives), ``STREAM_CLOSED`` when the body ends before the answer did, and the
response closed on every way out. The adapter keeps only what is its wire's: the request it
serializes, the call it makes, the translator of its events and the classification of its
status errors (whose tail, :func:`status_failure`, is shared too).

The SDK's own retries are always off (``max_retries=0``, :func:`sdk_client_options`):
``llm-retry`` makes every retry from the route's policy and records it in the session log; a
retry inside the SDK would be invisible to the log and would multiply the policy's budget.
"""

from __future__ import annotations

import abc
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar
from urllib.parse import urlsplit

import anyio

from dsh_host._cancel import CancelToken
from dsh_host.errors import AbortError, ConfigError, install_hint

from .errors import LlmError
from .keys import LLM
from .types import LlmAdapter, LlmRequest, ModelInfo, ProviderInfo, RetryPolicy
from .vision import family_takes_images
from .wire import (
    check_api_key,
    declined_retry_after_note,
    drain_tail,
    parse_retry_after_ms,
    request_id_of,
    transport_cause,
    user_agent,
)

if TYPE_CHECKING:
    from dsh_host._context import Context
    from dsh_host._llm import RetryPolicyConfig
    from dsh_host._session import StreamChunk

__all__ = [
    "EventTranslator",
    "ProviderAdapter",
    "ProviderConfig",
    "ProviderSettings",
    "SdkAdapter",
    "SdkErrors",
    "linked",
    "missing_sdk",
    "read_api_key",
    "register_adapter",
    "request_headers",
    "resolve_base_url",
    "sdk_client_options",
    "status_failure",
]

T = TypeVar("T")


# -- the row ---------------------------------------------------------------------------------
class ProviderConfig(Protocol):
    """The fields every provider row's msgspec config has (its own names, types, defaults)."""

    @property
    def model(self) -> str: ...
    @property
    def api_key_env(self) -> str | None: ...
    @property
    def display_name(self) -> str | None: ...
    @property
    def reasoning_effort(self) -> str | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def context_window(self) -> int | None: ...
    @property
    def vision(self) -> bool | None: ...
    @property
    def connect_timeout_ms(self) -> int: ...
    @property
    def stream_idle_timeout_ms(self) -> int: ...
    @property
    def retry_policy(self) -> RetryPolicyConfig: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


def resolve_base_url(
    configured: str | None, *, env: str, default: str, row: str, appends: str
) -> str:
    """The row's endpoint base: ``base_url``, else ``$env``, else ``default``; trimmed of a
    trailing slash and refused unless it is an http(s) URL (``appends`` says what is added to
    it, so the message shows what to write)."""
    raw = configured
    if raw is None:
        raw = os.environ.get(env) or default
    url = raw.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"{row}: base_url {raw!r} is not an http(s) URL; write it like {default} ({appends})"
        )
    return url


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSettings:
    """Resolved facts of one provider row; a plugin subclasses it for its defaults, its
    endpoint path and anything only its wire has."""

    #: the path the adapter (or its SDK) appends to ``base_url``: named in error messages
    endpoint_path: ClassVar[str] = ""

    base_url: str
    model: str
    api_key_env: str | None
    display_name: str
    reasoning_effort: str | None = None
    max_tokens: int | None = None
    context_window: int | None = None
    #: whether the row's models read images (None: by the model's family, D31)
    vision: bool | None = None
    connect_timeout_ms: int = 30_000
    stream_idle_timeout_ms: int = 300_000
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, config: ProviderConfig, *, base_url: str, **specific: Any) -> Self:
        """The settings of ``config``'s row; ``specific`` sets (or overrides) what only this
        provider resolves (a derived display name, say)."""
        fields: dict[str, Any] = {
            "base_url": base_url,
            "model": config.model,
            "api_key_env": config.api_key_env,
            "display_name": config.display_name,
            "reasoning_effort": config.reasoning_effort,
            "max_tokens": config.max_tokens,
            "context_window": config.context_window,
            "vision": config.vision,
            "connect_timeout_ms": config.connect_timeout_ms,
            "stream_idle_timeout_ms": config.stream_idle_timeout_ms,
            "retry_policy": config.retry_policy.resolve(),
            "headers": dict(config.headers),
        }
        fields.update(specific)
        return cls(**fields)

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}{self.endpoint_path}"

    def timeouts(self) -> dict[str, float]:
        """Connect/write/pool within ``connect_timeout_ms``; a read (the wait for the next
        byte or event) within ``stream_idle_timeout_ms``. In seconds, for ``*.Timeout``."""
        connect = self.connect_timeout_ms / 1000
        return {
            "connect": connect,
            "read": self.stream_idle_timeout_ms / 1000,
            "write": connect,
            "pool": connect,
        }


def request_headers(extra: Mapping[str, str]) -> dict[str, str]:
    """The row's extra headers (lower-cased) and dsh's User-Agent, which they cannot replace."""
    return {**{name.lower(): value for name, value in extra.items()}, "user-agent": user_agent()}


def sdk_client_options(
    settings: ProviderSettings, timeout: Callable[..., object]
) -> dict[str, Any]:
    """The keyword arguments of a Stainless SDK client for the row: retries off (module doc),
    dsh's timeouts (``timeout`` is the SDK's ``Timeout``), the attribution header, and a
    placeholder key (the real one is read per request and set with ``with_options``)."""
    return {
        "api_key": "unset",
        "base_url": settings.base_url,
        "max_retries": 0,
        "timeout": timeout(**settings.timeouts()),
        "default_headers": request_headers(settings.headers),
    }


def missing_sdk(row: str, vendor: str, package: str) -> ConfigError:
    """The error of a row whose provider SDK is not installed (the extra is the package)."""
    return ConfigError(
        f"{row} needs {vendor}'s SDK, which is not installed: {install_hint(package)} "
        f"(or pip install {package})"
    )


def register_adapter(ctx: Context, provider: str, adapter: ProviderAdapter[Any, Any]) -> None:
    """Serve ``provider`` with ``adapter``, and close its client when the row is disposed
    (one client per row: one connection pool)."""
    ctx.effect(adapter.close, adapter.closing)
    ctx.service(LLM).register_adapter([provider], adapter, owner=ctx)


def read_api_key(env: str, *, what: str, row: str) -> str:
    """The key in ``$env``, read when used (so a key exported later is seen), checked by
    :func:`~dsh_host._llm.wire.check_api_key`; unset is ``MISSING_CREDENTIAL``."""
    raw = os.environ.get(env)
    if raw is None:
        raise LlmError(
            f"{env} is not set: export {what} as {env} (the variable name comes from the "
            f"{row} row's `api_key_env`)",
            "MISSING_CREDENTIAL",
        )
    return check_api_key(raw, env)


def status_failure(
    text: str,
    code: str,
    *,
    status: int | None,
    headers: Mapping[str, str],
    request_id: str | None,
    policy: RetryPolicy,
) -> LlmError:
    """A classified HTTP answer as an LlmError with the provider's ``Retry-After`` and request
    id, and a note when the route's policy will not wait as long as the provider asked."""
    failure = LlmError(
        text,
        code,
        status=status,
        provider_retry_after_ms=parse_retry_after_ms(headers.get("retry-after")),
        request_id=request_id or request_id_of(headers),
    )
    note = declined_retry_after_note(policy, failure)
    if note is None:
        return failure
    return LlmError(
        f"{text}; {note}",
        code,
        status=failure.status,
        provider_retry_after_ms=failure.provider_retry_after_ms,
        request_id=failure.request_id,
    )


def linked(signal: CancelToken | None) -> AbstractContextManager[Any]:
    """The request's cancellation scope around one await (no signal: none)."""
    return signal.linked_scope() if signal is not None else nullcontext()


# -- the adapter -----------------------------------------------------------------------------
S = TypeVar("S", bound=ProviderSettings)
C = TypeVar("C")


class ProviderAdapter(LlmAdapter, Generic[S, C]):
    """An adapter serving routes from one row's settings through one client."""

    #: the plugin's name, in messages that tell the user which row to fix
    row: ClassVar[str]
    #: what closing the client is called when the row is disposed
    closing: ClassVar[str]

    def __init__(self, settings: S, client: C) -> None:
        self.settings = settings
        self._client = client

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the row's client (its connection pool)."""

    def provider_info(self, provider: str) -> ProviderInfo:
        return ProviderInfo(
            id=provider, name=self.settings.display_name, default_model=self.settings.model
        )

    def retry_policy(self, provider: str) -> RetryPolicy:
        return self.settings.retry_policy

    def reasoning_efforts(self) -> tuple[str, ...] | None:
        """The efforts a request may name on this row (None: any)."""
        return None

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
            reasoning_efforts=self.reasoning_efforts(),
            default_effort=settings.reasoning_effort,
            vision=family_takes_images(model) if settings.vision is None else settings.vision,
        )

    def _key_owner(self) -> str:
        """Whose key ``$api_key_env`` must hold, in the missing-key message."""
        return f"the API key for {self.settings.base_url}"

    def _api_key(self) -> str | None:
        env = self.settings.api_key_env
        if env is None:
            return None
        return read_api_key(env, what=self._key_owner(), row=self.row)


class EventTranslator(Protocol):
    """A provider's synchronous translator: one event in, the chunks it means out."""

    @property
    def done(self) -> bool: ...
    def feed(self, event: Any) -> list[StreamChunk]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SdkErrors:
    """The exception classes of one Stainless-generated SDK (they share the hierarchy)."""

    base: type[Exception]  #: AnthropicError, OpenAIError
    api: type[Exception]  #: APIError: an error payload inside the stream
    status: type[Exception]  #: APIStatusError
    timeout: type[Exception]  #: APITimeoutError (before ``connection``: it is one)
    connection: type[Exception]  #: APIConnectionError
    validation: type[Exception]  #: APIResponseValidationError

    @classmethod
    def of(cls, sdk: ModuleType, base: type[Exception]) -> SdkErrors:
        """The classes of the SDK module ``sdk``, whose root error is ``base``."""
        return cls(
            base=base,
            api=sdk.APIError,
            status=sdk.APIStatusError,
            timeout=sdk.APITimeoutError,
            connection=sdk.APIConnectionError,
            validation=sdk.APIResponseValidationError,
        )


_END = object()

#: the HTTP stacks an SDK may raise from without wrapping (a body cut mid-transfer)
_HTTP_MODULES = ("httpx2", "httpx", "httpcore", "h11")


async def _next(iterator: Any) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


class SdkAdapter(ProviderAdapter[S, Any]):
    """The stream loop of an adapter over a Stainless SDK (module doc); the subclass says what
    its wire does: :meth:`_serialize`, :meth:`_create`, :meth:`_translator`,
    :meth:`_status_error` and, when its SDK raises a bare ``APIError`` for an error event,
    :meth:`_stream_error`."""

    errors: ClassVar[SdkErrors]
    #: the event that completes an answer, named when the body ends before it
    end_event: ClassVar[str]

    async def close(self) -> None:
        await self._client.close()

    def _serialize(self, request: LlmRequest) -> dict[str, Any]:
        raise NotImplementedError

    async def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        """Send the one streaming request; the SDK's event stream."""
        raise NotImplementedError

    def _translator(self) -> EventTranslator:
        raise NotImplementedError

    def _status_error(self, exc: Any) -> LlmError:
        raise NotImplementedError

    def _stream_error(self, exc: Exception) -> LlmError | None:
        """A bare ``APIError`` (an error payload in the stream) classified; None: a transport
        failure like any other SDK error."""
        return None

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        settings = self.settings
        signal = request.signal
        client = self._client.with_options(api_key=self._api_key())
        kwargs = self._serialize(request)
        if signal is not None:
            signal.throw_if_aborted()
        events = await self._guarded(lambda: self._create(client, kwargs), signal)
        try:
            translator = self._translator()
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
                    f"{settings.display_name} stream ended before {self.end_event}: the "
                    "answer is incomplete",
                    "STREAM_CLOSED",
                )
        finally:
            with anyio.CancelScope(shield=True):
                await events.close()

    async def _guarded(self, call: Callable[[], Awaitable[T]], signal: CancelToken | None) -> T:
        """Await ``call()`` cancellably, with the SDK's exceptions classified (one place)."""
        settings, errors = self.settings, self.errors
        name, base_url = settings.display_name, settings.base_url
        done = False
        result: Any = None
        try:
            with linked(signal):
                result = await call()
                done = True
        except errors.status as exc:
            raise self._status_error(exc) from exc
        except errors.timeout as exc:
            raise LlmError(
                f"{name} API sent nothing for {settings.stream_idle_timeout_ms}ms "
                f"(stream_idle_timeout_ms) or did not connect within "
                f"{settings.connect_timeout_ms}ms",
                "TIMEOUT",
            ) from exc
        except errors.connection as exc:
            raise LlmError(
                f"{name} API request to {base_url} failed: {transport_cause(exc)}", "TRANSPORT"
            ) from exc
        except errors.validation as exc:
            raise LlmError(
                f"{name} API sent a response the SDK cannot read: {exc}", "MALFORMED_RESPONSE"
            ) from exc
        except ValueError as exc:  # an event whose data is not JSON (the SDK's json.loads)
            raise LlmError(
                f"{name} API sent an event that is not JSON: {exc}", "MALFORMED_RESPONSE"
            ) from exc
        except Exception as exc:
            failure = self._stream_error(exc) if isinstance(exc, errors.api) else None
            if failure is not None:
                raise failure from exc
            if isinstance(exc, OSError | errors.base) or (
                type(exc).__module__.split(".")[0] in _HTTP_MODULES
            ):  # a body cut mid-transfer, say
                raise LlmError(
                    f"{name} API stream from {base_url} failed: {transport_cause(exc)}",
                    "TRANSPORT",
                ) from exc
            raise
        if not done:  # the linked scope swallowed the cancellation
            assert signal is not None
            raise AbortError(signal.reason)
        return result  # type: ignore[no-any-return]
