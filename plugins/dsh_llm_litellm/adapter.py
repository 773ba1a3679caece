"""The LiteLLM adapter: ``litellm.acompletion`` on its own asyncio loop, bridged to the host's.

LiteLLM is asyncio-only (it awaits asyncio futures and spawns asyncio tasks), while the host
runs on any anyio backend, trio included. So each row owns a :class:`LoopRunner`: one asyncio
event loop in one daemon thread, where every LiteLLM call of the row runs. A stream is one
task on that loop; each chunk LiteLLM yields is handed to the host's loop as a plain dict
(``anyio.from_thread`` with the host loop's token) and translated there by the chat-completions
translator (:mod:`dsh_host._llm.chat`) (LiteLLM normalises every provider to that chunk
shape). Aborting the request cancels the task, which closes the provider's response (so the
connection is dropped); disposing of the row closes its client and stops its loop.

LiteLLM's retries are off (``num_retries=0``, ``max_retries=0``): ``llm-retry`` makes every
retry from the route's policy and logs it (the module doc of :mod:`dsh_host._llm.provider`).

For models LiteLLM routes to its ``openai`` provider (``openai/MODEL``: any OpenAI-compatible
server at ``base_url``), the row passes its own ``AsyncOpenAI`` client (retries off, dsh's
timeouts, one connection pool per row, closed with the row). Other providers use LiteLLM's
own clients (see the README's limitations).

LiteLLM's exceptions are classified here (:func:`error_of`) into dsh's stable codes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import math
import os
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar

# LiteLLM fetches its model price map from GitHub when imported unless told to use the copy it
# ships: a harness must not reach the network on import (and offline it waits ~10 s retrying).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import anyio.from_thread
import anyio.lowlevel
import litellm
import litellm.exceptions as litellm_errors
import msgspec
import openai
from anyio.streams.memory import MemoryObjectSendStream

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
    chat_tools,
    exception_chain,
    http_error_code,
    linked,
    request_headers,
    serialize_messages,
    status_failure,
    transport_cause,
    unsupported_effort,
)

__all__ = ["AdapterSettings", "LiteLLMAdapter", "LoopRunner", "error_of", "start_runner"]

# LiteLLM prints a "Give Feedback / Get Help" banner to stdout with every exception it raises:
# stdout is dsh's (``dsh run --json``), and the error reaches the user through dsh already.
litellm.suppress_debug_info = True

#: LiteLLM's efforts; ``off`` sends none
EFFORTS: tuple[str, ...] = ("off", "low", "medium", "high")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSettings(ProviderSettings):
    """Resolved facts of one ``llm-litellm`` row; ``base_url`` is ``""`` when the row leaves
    the endpoint to LiteLLM (the provider's default)."""

    endpoint_path: ClassVar[str] = ""

    @property
    def api_base(self) -> str | None:
        return self.base_url or None

    @property
    def where(self) -> str:
        """The endpoint, for messages."""
        return self.base_url or "the provider's default endpoint"


class LoopRunner:
    """One asyncio event loop in its own daemon thread (LiteLLM's calls of one row run there)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        # In an empty context: the task would otherwise inherit the caller's context variables,
        # among them sniffio's "current async library" (trio, say), and the HTTP stack on the
        # asyncio loop would then call trio.
        return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop and wait for it without blocking the host's loop."""
        future = self.submit(coro)
        await anyio.to_thread.run_sync(future.result)

    async def stop(self) -> None:
        """Cancel what still runs on the loop, stop it and wait for its thread."""

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self.loop.is_closed():
            return
        await self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await anyio.to_thread.run_sync(self._thread.join)


@dataclass
class _Runner:
    loop: LoopRunner
    #: the row's client for LiteLLM's ``openai`` provider (built on the loop's thread)
    client: openai.AsyncOpenAI


def start_runner(settings: AdapterSettings) -> _Runner:
    """The row's loop and its OpenAI client (retries off, dsh's timeouts, the row's headers)."""
    client = openai.AsyncOpenAI(
        api_key="unset",
        base_url=settings.api_base,
        max_retries=0,
        timeout=openai.Timeout(**settings.timeouts()),
        default_headers=request_headers(settings.headers),
    )
    return _Runner(LoopRunner(f"dsh-litellm-{settings.model}"), client)


class _Gone(Exception):
    """The host side stopped listening (the stream was closed or its loop ended)."""


def _provider_detail(exc: BaseException) -> tuple[str, str]:
    """(the provider's own message, its code/type/message joined for classification), from
    the first error body in the chain (LiteLLM keeps it on the exception it wrapped, or not)."""
    for current in exception_chain(exc):
        body = getattr(current, "body", None)
        error = body.get("error", body) if isinstance(body, dict) else None
        if isinstance(error, dict):
            text = error.get("message")
            detail = " ".join(
                str(error[key])
                for key in ("code", "type", "message")
                if isinstance(error.get(key), str | int)
            )
            if isinstance(text, str) and text:
                return text, detail
    message = str(getattr(exc, "message", "") or exc)
    return message, message


def error_of(exc: Exception, settings: AdapterSettings, model: str) -> LlmError:
    """A LiteLLM (or OpenAI SDK) exception as dsh's stable code, naming what, where, what to do."""
    name, where = settings.display_name, settings.where
    chain = list(exception_chain(exc))
    said = str(exc)
    if any(isinstance(e, openai.APITimeoutError | TimeoutError) for e in chain):
        return LlmError(
            f"{name} ({model}) sent nothing for {settings.stream_idle_timeout_ms}ms "
            "(stream_idle_timeout_ms) or did not connect in time",
            "TIMEOUT",
        )
    if any("finish_reason was received" in str(e) for e in chain):
        return LlmError(
            f"{name} ({model}) stream from {where} ended before a finish_reason: the answer "
            "is incomplete",
            "STREAM_CLOSED",
        )
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return LlmError(
            f"{name} ({model}) sent a chunk that is not JSON: {said[:200]}", "MALFORMED_RESPONSE"
        )
    if isinstance(exc, litellm_errors.MidStreamFallbackError) or any(
        isinstance(e, openai.APIConnectionError | OSError) for e in chain
    ):
        return LlmError(
            f"{name} ({model}) request to {where} failed: {transport_cause(exc)}", "TRANSPORT"
        )
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return LlmError(f"{name} ({model}) failed: {said}", "TRANSPORT")
    text, detail = _provider_detail(exc)
    if isinstance(exc, litellm_errors.ContextWindowExceededError):
        code = "CONTEXT_WINDOW_EXCEEDED"
    elif isinstance(exc, litellm_errors.BadRequestError) and "LLM Provider NOT provided" in said:
        code = MODEL_NOT_FOUND_CODE
        text = (
            f"LiteLLM does not know which provider serves {model!r}; name the model as "
            "LiteLLM does, provider/model (e.g. --model litellm:gemini/gemini-2.0-flash, "
            "litellm:ollama/llama3, litellm:openai/MODEL for an OpenAI-compatible server)"
        )
    else:
        code = http_error_code(status, detail)
    if code == "AUTH":
        env = settings.api_key_env
        hint = (
            f"check that ${env} (the row's api_key_env) holds a key valid for {where}"
            if env is not None
            else "set the provider's key variable LiteLLM reads, or the row's api_key_env"
        )
        text = f"{name} ({model}) refused the credential (HTTP {status}): {text}; {hint}"
    elif code == MODEL_NOT_FOUND_CODE and "LiteLLM does not know" not in text:
        text = (
            f"{name} ({model}): the provider does not serve this model (HTTP {status}: "
            f"{text}); name a model it serves (--model litellm:PROVIDER/MODEL)"
        )
    else:
        text = f"{name} ({model}) error (HTTP {status}): {text}"
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    lowered = {str(k).lower(): str(v) for k, v in dict(headers or {}).items()}
    return status_failure(
        text,
        code,
        status=status if 100 <= status <= 599 else None,
        headers=lowered,
        request_id=None,
        policy=settings.retry_policy,
    )


def _item_receiver(
    token: anyio.lowlevel.EventLoopToken,
    send: MemoryObjectSendStream[tuple[str, Any]],
) -> Callable[[tuple[str, Any]], None]:
    """Hand one item from the asyncio thread to the host's loop (``_Gone`` when it left)."""

    def deliver(item: tuple[str, Any]) -> None:
        try:
            anyio.from_thread.run_sync(send.send_nowait, item, token=token)
        except Exception as exc:  # closed stream, finished host loop
            raise _Gone from exc

    return deliver


class LiteLLMAdapter(ProviderAdapter[AdapterSettings, _Runner]):
    """Streams chat completions through ``litellm.acompletion`` (module doc)."""

    row = "llm-litellm"
    closing = "close the LiteLLM row's client and loop"

    async def close(self) -> None:
        runner = self._client

        async def close_client() -> None:
            await runner.client.close()

        await runner.loop.run(close_client())
        await runner.loop.stop()

    def reasoning_efforts(self) -> tuple[str, ...]:
        return EFFORTS

    def _key_owner(self) -> str:
        return f"the API key for {self.settings.where}"

    def _kwargs(self, request: LlmRequest) -> dict[str, Any]:
        """``litellm.acompletion``'s arguments for ``request`` (the key read now)."""
        settings, config = self.settings, request.config
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(serialize_messages(request.messages))
        kwargs: dict[str, Any] = {
            "model": config.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "num_retries": 0,
            "max_retries": 0,
            "extra_headers": request_headers(settings.headers),
        }
        key = self._api_key()
        try:
            _, provider, _, _ = litellm.get_llm_provider(config.model, api_base=settings.api_base)
        except Exception as exc:
            raise error_of(exc, settings, config.model) from exc
        if provider == "openai":
            # the row's client: one pool, retries off, dsh's timeouts (module doc)
            client = self._client.client
            kwargs["client"] = client.with_options(
                api_key=key or os.environ.get("OPENAI_API_KEY") or "unset"
            )
            kwargs["timeout"] = openai.Timeout(**settings.timeouts())
        else:
            kwargs["timeout"] = settings.stream_idle_timeout_ms / 1000
            if key is not None:
                kwargs["api_key"] = key
        if settings.api_base is not None:
            kwargs["api_base"] = settings.api_base
        if request.tools:
            kwargs["tools"] = chat_tools(request.tools)
        effort = config.reasoning_effort
        if effort is not msgspec.UNSET and request.purpose != "session-title":
            if effort not in EFFORTS:
                raise unsupported_effort("litellm", effort, EFFORTS)
            if effort != "off":
                kwargs["reasoning_effort"] = effort
        if config.temperature is not msgspec.UNSET:
            kwargs["temperature"] = config.temperature
        if config.max_tokens is not msgspec.UNSET:
            kwargs["max_tokens"] = config.max_tokens
        if config.stop is not msgspec.UNSET:
            kwargs["stop"] = list(config.stop)
        return kwargs

    async def _produce(
        self, kwargs: dict[str, Any], deliver: Callable[[tuple[str, Any]], None]
    ) -> None:
        """On the row's asyncio loop: the call and its chunks, handed over one at a time."""
        response: Any = None
        try:
            try:
                response = await litellm.acompletion(**kwargs)
                async for chunk in response:
                    deliver(("chunk", chunk.model_dump(exclude_none=True)))
            except (_Gone, asyncio.CancelledError):
                raise
            except Exception as exc:
                deliver(("error", exc))
                return
            deliver(("end", None))
        except _Gone:
            return
        finally:
            # an abandoned answer: close the provider's response (the connection is dropped)
            stream = getattr(response, "completion_stream", None)
            close = getattr(stream, "close", None) or getattr(stream, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # closing a broken response: nothing left to report
                    pass

    async def stream(self, request: LlmRequest) -> AsyncGenerator[StreamChunk, None]:
        settings, signal = self.settings, request.signal
        model = request.config.model
        kwargs = self._kwargs(request)
        if signal is not None:
            signal.throw_if_aborted()
        send, receive = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)
        deliver = _item_receiver(anyio.lowlevel.current_token(), send)
        future = self._client.loop.submit(self._produce(kwargs, deliver))
        translator = ChunkTranslator()
        try:
            with receive:
                while True:
                    kind, value = await self._next(receive, signal)
                    if kind == "end":
                        break
                    if kind == "error":
                        raise error_of(value, settings, model) from value
                    for chunk in translator.feed_object(value):
                        yield chunk
            if not translator.finished:
                raise LlmError(
                    f"{settings.display_name} ({model}) stream ended before a finish_reason: "
                    "the answer is incomplete",
                    "STREAM_CLOSED",
                )
            for chunk in translator.feed(DONE):
                yield chunk
        finally:
            future.cancel()  # a no-op once the task is done
            send.close()

    async def _next(
        self,
        receive: anyio.abc.ObjectReceiveStream[tuple[str, Any]],
        signal: CancelToken | None,
    ) -> tuple[str, Any]:
        item: tuple[str, Any] | None = None
        with linked(signal):
            item = await receive.receive()
        if item is None:  # the linked scope swallowed the cancellation
            assert signal is not None
            raise AbortError(signal.reason)
        return item
