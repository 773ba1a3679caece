"""The OpenAI-compatible chat-completions adapter: httpx + SSE, cancellable, classified.

One request per stream call: ``POST <base_url>/chat/completions`` with
``stream: true``; the SSE body is decoded (:mod:`.sse`) and translated
(:mod:`.translate`) into dsh chunks as bytes arrive.

Every failure leaves as an :class:`~dsh_host._llm.LlmError` with a stable code:

========================  =====================================================
``MISSING_CREDENTIAL``    the key variable (``api_key_env``) is not set
``INVALID_CREDENTIAL``    the key is blank or not a legal header value
``AUTH``                  HTTP 401/403
``RATE_LIMIT``            HTTP 429 (with ``Retry-After`` as provider_retry_after_ms)
``QUOTA``                 quota/balance wording (terminal, even on 429)
``INVALID_REQUEST``       HTTP 400/413
``CONTEXT_WINDOW_EXCEEDED``  HTTP 400 naming the context window
``SERVER``                HTTP >= 500
``HTTP_<status>``         any other non-2xx
``TRANSPORT``             connection failed, or the body was cut mid-transfer
``TIMEOUT``               no byte for ``stream_idle_timeout_ms``
``STREAM_CLOSED``         the body ended cleanly but without ``[DONE]``
``MALFORMED_RESPONSE``    a payload that is not the expected JSON
``EMPTY_RESPONSE``        (finish) a completed response with no content
========================  =====================================================

Cancellation: every await on the network (connect + headers, each body read)
runs inside ``request.signal.linked_scope()``, entered and left around that
one await and never around a ``yield``; an interrupted await becomes
:class:`~dsh_host.errors.AbortError`, which the runtime reports as an
``aborted`` finish. The response is always closed on the way out.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import ClassVar

import anyio
import httpx
import msgspec

from dsh_host.sdk import (
    DONE,
    MODEL_NOT_FOUND_CODE,
    AbortError,
    CancelToken,
    ChunkTranslator,
    LlmError,
    LlmRequest,
    ProviderAdapter,
    ProviderSettings,
    StreamChunk,
    http_error_code,
    linked,
    request_headers,
    request_id_of,
    status_failure,
    transport_cause,
)

from .serialize import REASONING_EFFORTS, Thinking, serialize_request
from .sse import SseDecoder

__all__ = ["AdapterSettings", "OpenAICompatibleAdapter"]

#: The most of an error body read to find the provider's message.
_ERROR_BODY_LIMIT = 64 * 1024
#: The largest plain JSON completion accepted in place of an event stream.
_JSON_ANSWER_LIMIT = 64 * 1024 * 1024
#: How much of an unexpected body is quoted in the error.
_SNIPPET_BYTES = 200
#: Media types read as an event stream; a missing content-type is read as one (as before).
_EVENT_STREAM_TYPES = frozenset({"text/event-stream", ""})


def _media_type(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "")).partition(";")[0].strip().lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings(ProviderSettings):
    """Resolved connection facts of one adapter (built from the plugin config)."""

    endpoint_path: ClassVar[str] = "/chat/completions"

    thinking: Thinking | None = None

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(**self.timeouts())


async def _body(response: httpx.Response) -> AsyncGenerator[bytes, None]:
    """The response body as an async generator we own (so it is closed deterministically)."""
    body = response.aiter_bytes()
    try:
        async for part in body:
            yield part
    finally:
        close = getattr(body, "aclose", None)
        if close is not None:
            await close()


#: after ``[DONE]`` the adapter reads on to the end of the body (normally only the chunked
#: terminator, already on its way) so the kept-alive connection returns to the client's pool;
#: a server that sends more than this, or not within this time, costs only the connection
_TAIL_BYTES = 64 * 1024
_TAIL_SECONDS = 5.0


async def _finish_body(body: AsyncIterator[bytes], signal: CancelToken | None) -> None:
    """Read the body's tail after ``[DONE]`` so the connection can carry the next request.

    The answer is complete: a failure or an abort here only means the connection is closed
    instead of reused, so neither is reported.
    """
    left = _TAIL_BYTES
    with anyio.move_on_after(_TAIL_SECONDS), linked(signal):
        try:
            async for part in body:
                left -= len(part)
                if left < 0:
                    return
        except httpx.HTTPError:
            return


class OpenAICompatibleAdapter(ProviderAdapter[AdapterSettings, httpx.AsyncClient]):
    """Streams chat completions from an OpenAI-compatible endpoint (DeepSeek by default)."""

    row = "llm-openai-compatible"
    closing = "close the HTTP client"

    async def close(self) -> None:
        await self._client.aclose()

    def reasoning_efforts(self) -> tuple[str, ...]:
        return ("off",) if self.settings.thinking == "disabled" else REASONING_EFFORTS

    # -- streaming -----------------------------------------------------------------
    def _headers(self, api_key: str | None) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **request_headers(self.settings.headers),
        }
        if api_key is not None:
            headers["authorization"] = f"Bearer {api_key}"
        return headers

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        settings = self.settings
        signal = request.signal
        api_key = self._api_key()
        body = msgspec.json.encode(serialize_request(request, thinking=settings.thinking))
        if signal is not None:
            signal.throw_if_aborted()
        http_request = self._client.build_request(
            "POST", settings.endpoint, content=body, headers=self._headers(api_key)
        )
        response = await self._send(http_request, signal)
        try:
            if not response.is_success:
                raise await self._http_error(response, signal)
            media = _media_type(response)
            translator = ChunkTranslator()
            if media not in _EVENT_STREAM_TYPES:
                for chunk in await self._whole_answer(response, media, translator, signal):
                    yield chunk
                return
            decoder = SseDecoder()
            async with aclosing(_body(response)) as body_bytes:
                while not translator.done:
                    data = await self._read(body_bytes, signal)
                    payloads = decoder.close() if data is None else decoder.feed(data)
                    for payload in payloads:
                        chunks = translator.feed(payload)
                        if translator.done:
                            # before the finish chunk: the runtime closes the stream after it
                            await _finish_body(body_bytes, signal)
                        for chunk in chunks:
                            yield chunk
                        if translator.done:
                            break
                    if data is None:
                        break
            if not translator.done:
                if not translator.finished:
                    raise LlmError(
                        f"{settings.display_name} SSE stream ended without [DONE] and before any "
                        "finish_reason: the answer is incomplete",
                        "STREAM_CLOSED",
                    )
                # finish_reason came, then a clean end of the body without [DONE]: complete
                for chunk in translator.feed(DONE):
                    yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _whole_answer(
        self,
        response: httpx.Response,
        media: str,
        translator: ChunkTranslator,
        signal: CancelToken | None,
    ) -> list[StreamChunk]:
        """A 2xx answer that is not an event stream: a JSON completion is translated whole;
        anything else (an HTML page from a proxy, say) is reported with what it was."""
        settings = self.settings
        is_json = media == "application/json" or media.endswith("+json")
        limit = _JSON_ANSWER_LIMIT if is_json else _SNIPPET_BYTES
        raw = bytearray()
        async with aclosing(_body(response)) as body_bytes:
            while len(raw) <= limit:
                data = await self._read(body_bytes, signal)
                if data is None:
                    break
                raw += data
        if is_json and len(raw) <= limit:
            return translator.completion(raw.decode("utf-8", errors="replace"))
        shown = bytes(raw[:_SNIPPET_BYTES]).decode("utf-8", errors="replace")
        what = (
            f"a JSON body over {_JSON_ANSWER_LIMIT} bytes"
            if is_json
            else f"content-type {media or '(none)'}"
        )
        raise LlmError(
            f"{settings.display_name} API answered POST {settings.endpoint} with HTTP "
            f"{response.status_code} and {what} instead of an event stream "
            f"(text/event-stream); the body begins {shown!r}. Check base_url: it must be the "
            "API's base, not a web page or a proxy's login page",
            "MALFORMED_RESPONSE",
            status=response.status_code,
            request_id=request_id_of(response.headers),
        )

    async def _send(self, request: httpx.Request, signal: CancelToken | None) -> httpx.Response:
        """Connect, send, and wait for the response headers (cancellable)."""
        settings = self.settings
        response: httpx.Response | None = None
        try:
            with linked(signal):
                response = await self._client.send(request, stream=True)
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise LlmError(
                f"{settings.display_name} API request to {settings.base_url} failed "
                f"(no connection within {settings.connect_timeout_ms}ms)",
                "TRANSPORT",
            ) from exc
        except httpx.TimeoutException as exc:
            raise LlmError(
                f"{settings.display_name} API did not answer within "
                f"{settings.stream_idle_timeout_ms}ms",
                "TIMEOUT",
            ) from exc
        except httpx.HTTPError as exc:
            raise LlmError(
                f"{settings.display_name} API request to {settings.base_url} failed: "
                f"{transport_cause(exc)}",
                "TRANSPORT",
            ) from exc
        if response is None:  # the linked scope swallowed the cancellation
            assert signal is not None
            raise AbortError(signal.reason)
        return response

    async def _read(self, body: AsyncIterator[bytes], signal: CancelToken | None) -> bytes | None:
        """The next body bytes (None at the end), cancellable, with errors classified."""
        settings = self.settings
        finished = False
        data: bytes | None = None
        try:
            with linked(signal):
                try:
                    data = await anext(body)
                except StopAsyncIteration:
                    finished = True
        except httpx.TimeoutException as exc:
            raise LlmError(
                f"{settings.display_name} stream idle timeout after "
                f"{settings.stream_idle_timeout_ms}ms",
                "TIMEOUT",
            ) from exc
        except httpx.HTTPError as exc:
            raise LlmError(
                f"{settings.display_name} API stream from {settings.base_url} failed", "TRANSPORT"
            ) from exc
        if finished:
            return None
        if data is None:  # the linked scope swallowed the cancellation
            assert signal is not None
            raise AbortError(signal.reason)
        return data

    async def _http_error(self, response: httpx.Response, signal: CancelToken | None) -> LlmError:
        """Turn a non-2xx answer into an LlmError with the provider's own message."""
        settings = self.settings
        status = response.status_code
        raw = b""
        try:
            with linked(signal):
                async for part in response.aiter_bytes():
                    raw += part
                    if len(raw) >= _ERROR_BODY_LIMIT:
                        break
        except httpx.HTTPError:
            pass  # the status stays authoritative when the body cannot be read
        if signal is not None and signal.aborted:
            raise AbortError(signal.reason)
        message = f"{settings.display_name} API error (HTTP {status})"
        detail = provider_code = ""
        try:
            parsed = msgspec.json.decode(raw) if raw else None
        except msgspec.DecodeError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict):
            text = error.get("message")
            if isinstance(text, str) and text:
                message = text
            detail = " ".join(
                str(error[key])
                for key in ("code", "type", "message")
                if isinstance(error.get(key), (str, int))
            )
            provider_code = next(
                (str(error[key]) for key in ("code", "type") if error.get(key) not in (None, "")),
                "",
            )
        elif isinstance(error, str) and error:
            message = detail = error
        code = http_error_code(status, detail)
        message = self._explain(code, status, message, provider_code)
        failure = status_failure(
            message,
            code,
            status=status if 100 <= status <= 599 else None,
            headers=response.headers,
            request_id=None,
            policy=settings.retry_policy,
        )
        body_text = raw.decode("utf-8", errors="replace")
        failure.__cause__ = RuntimeError(body_text or f"{settings.display_name} HTTP {status}")
        return failure

    def _explain(self, code: str, status: int, message: str, provider_code: str) -> str:
        """Say what was wrong, where, and what to do, for the answers whose fix is known."""
        settings = self.settings
        bare = message.endswith(f"(HTTP {status})")  # no provider message to quote
        said = "" if bare else f": {message}"
        where = f"POST {settings.endpoint}"
        if code == MODEL_NOT_FOUND_CODE:
            return (
                f"{settings.display_name} API does not serve the requested model (HTTP {status} "
                f"for {where}{said}); name a model this endpoint serves (--model "
                "openai-compatible:MODEL, or the model of the request)"
            )
        if status == 404:
            # Nearly always a base URL without its API prefix: say where the request went.
            return (
                f"{settings.display_name} API answered HTTP 404 for {where}{said}; check "
                "base_url (OpenAI-compatible servers usually serve the API under /v1, e.g. "
                "http://127.0.0.1:8000/v1)"
            )
        if code == "AUTH":
            shown = f", {provider_code}" if provider_code else ""
            env = settings.api_key_env
            if env is None:
                hint = (
                    "the llm-openai-compatible row sends no key (api_key_env is null); set "
                    "api_key_env to the variable that holds this endpoint's key"
                )
            else:
                hint = (
                    f"check that ${env} (the row's api_key_env) holds a key valid for "
                    f"{settings.base_url}"
                    + (" and allowed to use this model" if status == 403 else "")
                )
            return (
                f"{settings.display_name} API refused the credential (HTTP {status}{shown}) for "
                f"{where}{said}; {hint}"
            )
        return message
