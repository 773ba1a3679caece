"""LlmRuntime: the ``llm`` service -- adapter routes plus the ``llm/stream`` seam.

Every model call goes through :meth:`LlmRuntime.stream`, which dispatches the
``llm/stream`` stream-waterfall with the selected adapter as its default::

    listener 1 ( listener 2 ( ... ( adapter boundary ( adapter.stream(request) ))))

Listeners (registered with ``ctx.on("llm/stream", handler)``) are *sync*
functions ``handler(request, next) -> AsyncIterator[StreamChunk]``; ``next()``
builds the downstream stream without starting it, so a listener can do work
before the adapter is even constructed (the checkpoint policy flushes the
session on the first pull). Routing happens inside the default, after the
listeners: a listener may serve a provider no adapter is registered for.

The adapter boundary is where failures change shape. Anything that goes wrong
in adapter selection, model resolution, dispatch, iterator construction or
iteration becomes **one terminal** ``finish`` chunk (``aborted`` when the
request's signal is aborted or the code is ``ABORTED``, else ``error``), and the
stream ends. Failures in middleware, in the consumer, and in the adapter's
cleanup on early close are *not* converted: they stay exceptions, because they
are bugs or policy decisions (a failed checkpoint must fail the turn closed),
not model outcomes.
"""

from __future__ import annotations

import logging
import weakref
from bisect import bisect_left
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from dsh_host._cancel import CancelToken
from dsh_host._session.messages import (
    AbortedFinish,
    AdapterDefaults,
    AssistantMessage,
    ErrorFinish,
    FinishChunk,
    LlmCallConfig,
    Message,
    ModelSource,
    StreamChunk,
)
from dsh_host._session.session import LogView

from .errors import ABORTED_CODE, LlmError, failure_of
from .keys import LLM_STREAM
from .types import LlmAdapter, LlmRequest, ModelInfo, ProviderInfo, RetryPolicy
from .vision import carries_attachment, without_images

if TYPE_CHECKING:
    from dsh_host._context import Context

__all__ = [
    "AdapterRegistration",
    "LlmRuntime",
    "PreparedCall",
    "failure_chunk",
]

log = logging.getLogger("dsh.llm")


@dataclass(frozen=True, slots=True)
class _Route:
    adapter: LlmAdapter
    provider: ProviderInfo
    retry_policy: RetryPolicy


class AdapterRegistration:
    """What :meth:`LlmRuntime.register_adapter` returns.

    Call it (or :meth:`dispose`) to release every route it holds; calling twice
    is harmless. :meth:`replace` swaps the route set atomically.
    """

    def __init__(self, runtime: LlmRuntime, adapter: LlmAdapter) -> None:
        self._runtime = runtime
        self._adapter = adapter
        self._owned: set[str] = set()
        self._released = False

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(sorted(self._owned))

    @property
    def adapter(self) -> LlmAdapter:
        return self._adapter

    def replace(self, providers: Sequence[str]) -> None:
        """Replace this registration's routes with ``providers`` (all or nothing).

        The candidate set is validated in full first; a conflict leaves the
        current routes untouched. An empty list is legal here.
        """
        if self._released:
            raise LlmError(
                "a disposed adapter registration cannot replace its routes",
                "REGISTRATION_DISPOSED",
            )
        self._runtime._commit(self, self._runtime._prepare(providers, self._adapter, self._owned))

    def dispose(self) -> None:
        if self._released:
            return
        self._released = True
        self._runtime._release(self)

    def __call__(self) -> None:
        self.dispose()


class PreparedCall:
    """One model call whose route and model were resolved together (DSH ``prepareCall``).

    ``config`` has the adapter's defaults materialized (``adapter_defaults``
    says which fields they are, for the request header); ``retry_policy`` and
    ``context_window`` come from the same route. :meth:`stream` dispatches
    through the ``llm/stream`` waterfall with the captured route, once, and only
    with a request whose ``config`` equals :attr:`config`.
    """

    def __init__(
        self,
        runtime: LlmRuntime,
        route: _Route,
        config: LlmCallConfig,
        adapter_defaults: AdapterDefaults,
        model: ModelInfo,
    ) -> None:
        self._runtime = runtime
        self._route = route
        self.config = config
        self.adapter_defaults = adapter_defaults
        self.model = model
        self._dispatched = False

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._route.retry_policy

    @property
    def context_window(self) -> int | None:
        return self.model.context_window

    def stream(
        self, request: LlmRequest, *, signal: CancelToken | None = None
    ) -> AsyncGenerator[StreamChunk, None]:
        if self._dispatched:
            raise LlmError(
                "a prepared LLM call can only be dispatched once", "INVALID_PREPARED_CALL"
            )
        if request.config != self.config:
            raise LlmError(
                "prepared LLM call config changed before adapter dispatch",
                "INVALID_PREPARED_CALL",
            )
        self._dispatched = True
        return self._runtime._dispatch(_with_signal(request, signal), self)


class LlmRuntime:
    """The ``llm`` service: adapter registry plus the interceptable streaming call.

    Typical use (the agent loop)::

        prepared = await ctx.llm.prepare_call(config, signal=token)
        request = LlmRequest(config=prepared.config, messages=..., tools=...,
                             session=session, signal=token, agent_loop=True)
        assembler = BlockAssembler()
        async with aclosing(prepared.stream(request)) as chunks:
            async for chunk in chunks:
                assembler.push(chunk, now_ms())
        message = assembler.message(provider=..., model=...)

    ``ctx.llm.stream(request)`` is the same without preparation.
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._routes: dict[str, _Route] = {}
        self._owners: dict[str, AdapterRegistration] = {}
        #: per live session: where its derived messages carry replay state (_for_adapter)
        self._replay_indexes: weakref.WeakKeyDictionary[object, _ReplayIndex] = (
            weakref.WeakKeyDictionary()
        )

    # -- registration ---------------------------------------------------------------
    def register_adapter(
        self,
        providers: Sequence[str],
        adapter: LlmAdapter,
        *,
        owner: Context | None = None,
    ) -> AdapterRegistration:
        """Route ``providers`` to ``adapter`` (all or nothing).

        A provider that already has an adapter raises ``LlmError`` code
        ``DUPLICATE_ADAPTER``. Pass ``owner=ctx`` (the registering plugin's
        context) so the routes are released when that plugin is disposed.
        """
        if isinstance(providers, str):
            raise TypeError(
                f"register_adapter takes a list of provider names, not the string {providers!r}"
            )
        if not isinstance(adapter, LlmAdapter):
            raise TypeError(
                f"register_adapter needs an LlmAdapter instance, not {type(adapter).__name__}"
            )
        if not providers:
            raise LlmError("an adapter must register at least one provider", "INVALID_ADAPTER")
        registration = AdapterRegistration(self, adapter)
        self._commit(registration, self._prepare(providers, adapter, frozenset()))
        if owner is not None:
            owner.effect(registration.dispose, f"llm adapter {', '.join(providers)}")
        return registration

    def _prepare(
        self, providers: Sequence[str], adapter: LlmAdapter, owned: set[str] | frozenset[str]
    ) -> list[_Route]:
        seen: set[str] = set()
        routes: list[_Route] = []
        for provider in providers:
            if not isinstance(provider, str) or not provider:
                raise LlmError(
                    f"adapter provider names must be non-empty strings, not {provider!r}",
                    "INVALID_ADAPTER",
                )
            if provider in seen or (provider in self._routes and provider not in owned):
                raise LlmError(
                    f'an adapter for provider "{provider}" is already registered',
                    "DUPLICATE_ADAPTER",
                )
            info = adapter.provider_info(provider)
            if not isinstance(info, ProviderInfo) or info.id != provider or not info.name:
                raise LlmError(
                    f'adapter metadata for provider "{provider}" must preserve its id and have '
                    "a non-empty name",
                    "INVALID_ADAPTER",
                )
            policy = adapter.retry_policy(provider)
            seen.add(provider)
            routes.append(_Route(adapter, info, policy if policy is not None else RetryPolicy()))
        return routes

    def _commit(self, registration: AdapterRegistration, routes: list[_Route]) -> None:
        for provider in registration._owned:
            self._routes.pop(provider, None)
            self._owners.pop(provider, None)
        registration._owned.clear()
        for route in routes:
            self._routes[route.provider.id] = route
            self._owners[route.provider.id] = registration
            registration._owned.add(route.provider.id)

    def _release(self, registration: AdapterRegistration) -> None:
        for provider in registration._owned:
            if self._owners.get(provider) is registration:
                del self._routes[provider]
                del self._owners[provider]
        registration._owned.clear()

    # -- queries ----------------------------------------------------------------
    def list_providers(self) -> list[ProviderInfo]:
        """Every routed provider, in registration order."""
        return [route.provider for route in self._routes.values()]

    def has_provider(self, provider: str) -> bool:
        return provider in self._routes

    def adapter_for(self, provider: str) -> LlmAdapter:
        """The adapter routed for ``provider`` (``NO_ADAPTER`` if none)."""
        return self._route(provider).adapter

    def retry_policy(self, provider: str) -> RetryPolicy:
        """The retry policy captured when ``provider``'s route was registered."""
        return self._route(provider).retry_policy

    async def resolve_model(
        self, provider: str, model: str, signal: CancelToken | None = None
    ) -> ModelInfo:
        """Validated metadata of one exact model from the adapter that owns the route."""
        route = self._route(provider)
        return await self._resolve_model(route, model, signal)

    def _route(self, provider: str) -> _Route:
        route = self._routes.get(provider)
        if route is None:
            known = ", ".join(sorted(self._routes)) or "none"
            raise LlmError(
                f'no adapter registered for provider "{provider}" (registered providers: '
                f"{known}); add a model adapter row (e.g. llm-scripted or "
                "llm-openai-compatible) whose provider is this name",
                "NO_ADAPTER",
            )
        return route

    async def _resolve_model(
        self, route: _Route, model: str, signal: CancelToken | None
    ) -> ModelInfo:
        info = await route.adapter.resolve_model(route.provider.id, model, signal)
        provider = route.provider.id
        if not isinstance(info, ModelInfo) or info.provider != provider or info.id != model:
            raise LlmError(
                f'adapter returned invalid exact model metadata for provider "{provider}" '
                f'model "{model}"',
                "INVALID_MODEL_INFO",
            )
        if info.context_window is not None and (
            type(info.context_window) is not int or info.context_window <= 0
        ):
            raise LlmError(
                f'adapter returned invalid context metadata for provider "{provider}" '
                f'model "{model}"',
                "INVALID_MODEL_CONTEXT",
            )
        if info.default_max_tokens is not None and (
            type(info.default_max_tokens) is not int or info.default_max_tokens <= 0
        ):
            raise LlmError(
                f'adapter returned invalid default maxTokens for provider "{provider}" '
                f'model "{model}"',
                "INVALID_MODEL_MAX_TOKENS",
            )
        efforts = info.reasoning_efforts
        if efforts is not None and (
            not efforts
            or len(set(efforts)) != len(efforts)
            or (info.default_effort is not None and info.default_effort not in efforts)
        ):
            raise LlmError(
                f'adapter returned invalid reasoning metadata for provider "{provider}" '
                f'model "{model}"',
                "INVALID_MODEL_REASONING",
            )
        return info

    # -- preparing --------------------------------------------------------------------
    async def prepare_call(
        self, config: LlmCallConfig, signal: CancelToken | None = None
    ) -> PreparedCall:
        """Resolve the route and exact model of ``config`` and materialize adapter defaults.

        ``NO_ADAPTER`` when nothing routes the provider (the agent loop tolerates
        it and falls back to :meth:`stream`, since middleware may serve the
        route); ``UNSUPPORTED_REASONING_EFFORT`` when the model does not take the
        requested effort.
        """
        route = self._route(config.provider)
        info = await self._resolve_model(route, config.model, signal)
        resolved, defaults = resolve_call_config(config, info)
        return PreparedCall(self, route, resolved, defaults, info)

    # -- streaming ----------------------------------------------------------------------
    def stream(
        self, request: LlmRequest, *, signal: CancelToken | None = None
    ) -> AsyncGenerator[StreamChunk, None]:
        """Stream one model call through the ``llm/stream`` waterfall.

        ``signal`` (optional) is fused with ``request.signal``. Nothing runs
        until the first ``__anext__``. Consume it inside
        ``contextlib.aclosing(...)`` so an early exit closes the adapter.
        """
        return self._dispatch(_with_signal(request, signal), None)

    def _dispatch(
        self, request: LlmRequest, prepared: PreparedCall | None
    ) -> AsyncGenerator[StreamChunk, None]:
        def default(arg: LlmRequest) -> AsyncIterator[StreamChunk]:
            # The default always serves the loop's request: listeners must not
            # rewrite it (and cannot, it is frozen); ``arg`` is the same object.
            return self._adapter_stream(request, prepared)

        chain: AsyncIterator[StreamChunk] = self._ctx.waterfall_stream(
            LLM_STREAM, request, default
        )
        if isinstance(chain, AsyncGenerator):
            return chain  # its own aclose reaches the adapter: no relay step per chunk
        return _relay(chain)

    async def _adapter_stream(
        self, request: LlmRequest, prepared: PreparedCall | None
    ) -> AsyncGenerator[StreamChunk, None]:
        """The final boundary: adapter failures become one terminal finish chunk."""
        signal = request.signal
        try:
            if prepared is not None:
                route, info = prepared._route, prepared.model
                if request.config != prepared.config:
                    raise LlmError(
                        "prepared LLM call config changed before adapter dispatch",
                        "INVALID_PREPARED_CALL",
                    )
            else:
                route = self._route(request.provider)
                info = await self._resolve_model(route, request.model, signal)
                resolved, _defaults = resolve_call_config(request.config, info)
                if resolved != request.config:
                    request = request.replace(config=resolved)
            request = self._for_adapter(request, route.adapter, info)
            if signal is not None:
                signal.throw_if_aborted()
            iterator = aiter(route.adapter.stream(request))
        except Exception as exc:
            yield failure_chunk(exc, signal)
            return

        completed = False
        try:
            while True:
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    completed = True
                    return
                except Exception as exc:
                    completed = True
                    yield failure_chunk(exc, signal)
                    return
                # The adapter's try ends before the yield: a failure thrown into
                # this generator by the consumer stays the consumer's.
                yield chunk
                if isinstance(chunk, FinishChunk):
                    # Nothing may follow finish; the adapter is closed below.
                    return
        finally:
            if not completed:
                close = getattr(iterator, "aclose", None)
                if close is not None:
                    await close()

    def _for_adapter(
        self, request: LlmRequest, adapter: LlmAdapter, model: ModelInfo
    ) -> LlmRequest:
        """Strip replay state the target adapter does not own (provider/model kept), and,
        for a model that takes no images, put a note in each image's place (D31).

        Only assistant messages carrying ``source.replay_state`` can need it, and
        whether one does depends only on its provider's route. So the messages
        are indexed by provider (positions of those carrying replay state), and
        only the providers whose route is not ``adapter`` are visited: with no
        foreign replay state in the history the request passes through untouched.
        For a session's :class:`MessagesView` the index is kept per session and
        extended by the new messages only (the view's backing list is append-only;
        a surface replacement allocates a new one, which restarts the index), so
        the usual request costs O(new messages), not O(history). The same index holds
        the positions of the messages carrying images, for the notes.
        """
        messages = request.messages
        index = self._replay_index(request.session, messages)
        if not model.vision and index.images:
            images = index.images[: bisect_left(index.images, len(messages))]
            request = without_images(request, model, images)
        foreign: list[int] = []
        routes = self._routes
        length = len(messages)
        for provider, positions in index.by_provider.items():
            route = routes.get(provider)
            if route is None or route.adapter is not adapter:
                # Positions ascend; an older snapshot of the same list may be shorter.
                foreign.extend(positions[: bisect_left(positions, length)])
        if not foreign:
            return request
        stripped = list(messages)
        for position in foreign:
            message = stripped[position]
            assert isinstance(message, AssistantMessage)
            source = ModelSource(provider=message.source.provider, model=message.source.model)
            stripped[position] = msgspec.structs.replace(message, source=source)
        return request.replace(messages=tuple(stripped))

    def _replay_index(self, session: object, messages: Sequence[Message]) -> _ReplayIndex:
        """The replay-state index of ``messages``, extended incrementally when it can be.

        Incremental only for a :class:`LogView` whose request names a session
        (weakly keyed, so a disposed session's index goes with it); any other
        sequence is indexed from scratch.
        """
        if type(messages) is not LogView or session is None:
            fresh = _ReplayIndex(messages)
            fresh.extend(messages, 0)
            return fresh
        items = messages.lineage  # same token = a prefix of the same append-only list
        cache: weakref.WeakKeyDictionary[object, _ReplayIndex] | None = self._replay_indexes
        index: _ReplayIndex | None = None
        try:
            index = self._replay_indexes.get(session)
        except TypeError:  # not weak-referenceable: index from scratch every time
            cache = None
        if index is None or index.items is not items:
            index = _ReplayIndex(items)
            if cache is not None:
                cache[session] = index
        if index.checked < len(messages):
            index.extend(messages, index.checked)
        return index


class _ReplayIndex:
    """Positions of assistant messages with replay state, by provider, in one sequence.

    ``items`` is the sequence indexed (kept only to recognize it: identity),
    ``checked`` how many of its leading entries have been looked at.
    """

    __slots__ = ("by_provider", "checked", "images", "items")

    def __init__(self, items: object) -> None:
        self.items = items
        self.checked = 0
        self.by_provider: dict[str, list[int]] = {}
        #: positions of the messages that carry an image or a document (D31)
        self.images: list[int] = []

    def extend(self, messages: Sequence[Message], start: int) -> None:
        """Index ``messages[start:]`` (positions counted in ``messages``)."""
        by_provider = self.by_provider
        unset = msgspec.UNSET
        for position in range(start, len(messages)):
            message = messages[position]
            if isinstance(message, AssistantMessage) and message.source.replay_state is not unset:
                by_provider.setdefault(message.source.provider, []).append(position)
            elif carries_attachment(message):
                self.images.append(position)
        self.checked = len(messages)


def resolve_call_config(
    config: LlmCallConfig, info: ModelInfo
) -> tuple[LlmCallConfig, AdapterDefaults]:
    """Validate ``config`` against ``info`` and materialize the adapter's defaults.

    No clamping or aliasing: an effort the model does not offer is refused.
    """
    changes: dict[str, Any] = {}
    if config.max_tokens is msgspec.UNSET and info.default_max_tokens is not None:
        changes["max_tokens"] = info.default_max_tokens
    requested = None if config.reasoning_effort is msgspec.UNSET else config.reasoning_effort
    if info.reasoning_efforts is None:
        if requested is not None:
            raise LlmError(
                f'provider "{config.provider}" model "{config.model}" does not support '
                f'reasoning effort "{requested}"',
                "UNSUPPORTED_REASONING_EFFORT",
            )
    else:
        effective = requested if requested is not None else info.default_effort
        if effective is not None:
            if effective not in info.reasoning_efforts:
                raise LlmError(
                    f'provider "{config.provider}" model "{config.model}" does not support '
                    f'reasoning effort "{effective}" (supported: '
                    f'{", ".join(info.reasoning_efforts)})',
                    "UNSUPPORTED_REASONING_EFFORT",
                )
            if requested is None:
                changes["reasoning_effort"] = effective
    resolved = msgspec.structs.replace(config, **changes) if changes else config
    markers: dict[str, Any] = {}
    if "max_tokens" in changes:
        markers["max_tokens"] = True
    if "reasoning_effort" in changes:
        markers["reasoning_effort"] = True
    return resolved, AdapterDefaults(**markers)


def failure_chunk(exc: BaseException, signal: CancelToken | None = None) -> FinishChunk:
    """The terminal ``finish`` chunk for an adapter exception.

    ``aborted`` when the request's signal is aborted or the code is ``ABORTED``,
    else ``error``. The exception is logged, since its traceback does not fit
    in a failure record.
    """
    failure = failure_of(exc)
    aborted = (signal is not None and signal.aborted) or failure.code == ABORTED_CODE
    if not aborted:
        log.info("model adapter failed (%s): %s", failure.code, failure.message, exc_info=exc)
    if aborted:
        return FinishChunk(reason=AbortedFinish(failure=failure))
    return FinishChunk(reason=ErrorFinish(failure=failure))


def _with_signal(request: LlmRequest, signal: CancelToken | None) -> LlmRequest:
    if signal is None or signal is request.signal:
        return request
    fused = signal if request.signal is None else CancelToken.any(request.signal, signal)
    return request.replace(signal=fused)


async def _relay(chain: AsyncIterator[StreamChunk]) -> AsyncGenerator[StreamChunk, None]:
    """Give a stream that lacks one an ``aclose`` that reaches the innermost adapter.

    Listener streams may be any async iterator; this wrapper closes the chain
    when the consumer stops early, so adapter cleanup always runs (and any
    failure in it stays thrown). An async generator has that ``aclose`` already.
    """
    try:
        async for chunk in chain:
            yield chunk
    finally:
        close: Callable[[], Any] | None = getattr(chain, "aclose", None)
        if close is not None:
            await close()
