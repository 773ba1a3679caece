"""The shapes of the LLM seam: the request an adapter receives, adapter metadata, retry policy.

The wire types (stream chunks, finish reasons, usage, messages, call config,
tool schemas) are the session core's, in :mod:`dsh_host._session.messages`:
the log stores chunks and assistant messages verbatim, so there is exactly one
definition of each and this module re-exports them.

Non-wire objects (the request with its cancel token and live session, adapter
metadata) are frozen dataclasses: they are never serialized, and a frozen
request is what lets ``llm/stream`` middleware *read* the loop's request
without being able to rewrite it.
"""

from __future__ import annotations

import abc
import json
import math
import random as _random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import msgspec

from dsh_host._cancel import CancelToken
from dsh_host._jsonsafe import js_number
from dsh_host._session.messages import (
    LlmCallConfig,
    LlmFailure,
    Message,
    StreamChunk,
    ToolSchema,
)
from dsh_host._session.session import LogView, MessagesView

from .errors import EMPTY_RESPONSE_CODE

__all__ = [
    "DEFAULT_RETRYABLE_CODES",
    "MAX_TIMER_DELAY_MS",
    "LlmAdapter",
    "LlmRequest",
    "ModelInfo",
    "ProviderInfo",
    "Purpose",
    "RetryBackoffConfig",
    "RetryPolicy",
    "RetryPolicyConfig",
]

#: Why a non-loop request was made (DSH ``purpose``); None for ordinary agent steps.
Purpose = Literal["compaction", "session-title"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmRequest:
    """One model call, as middleware and adapters see it (DSH ``GenerateOptions``).

    ``config`` is the call configuration (provider route, model, effort,
    temperature, max tokens, stop). ``messages`` are the session's derived
    messages (``session.derive_messages()``), ``tools`` the model-facing schemas.
    ``signal`` is the request's :class:`CancelToken`: adapters honour it and the
    runtime reports a failure as ``aborted`` when it is set. ``session`` is the
    live session the request belongs to (or None for a side call), so
    ``llm/stream`` middleware such as the checkpoint policy knows which session
    to flush before the adapter sees the request; ``session_id`` is filled from
    it when omitted.

    Lists passed in are stored as tuples; messages and schemas are frozen
    Structs, so a request cannot be mutated after construction. Use
    :meth:`replace` to derive a changed copy. ``messages`` may also be the
    session's :class:`~dsh_host._session.session.MessagesView` (what
    ``derive_messages()`` returns), kept as is: it is an immutable snapshot
    already, and copying it would cost O(history) on every request of a loop.
    Treat ``messages`` as a read-only sequence (index, slice, iterate, ``len``);
    ``tuple()`` it when a tuple is needed.
    """

    config: LlmCallConfig
    messages: tuple[Message, ...] | MessagesView = ()
    system: str | None = None
    tools: tuple[ToolSchema, ...] = ()
    signal: CancelToken | None = None
    #: the live Session this request derives from (typed loosely: the llm layer does
    #: not depend on the session runtime, only on its wire types)
    session: Any = None
    session_id: str | None = None
    purpose: Purpose | None = None
    #: True for requests built by the agent loop (DSH marks them; middleware may check)
    agent_loop: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.config, LlmCallConfig):
            raise TypeError(
                f"LlmRequest.config must be an LlmCallConfig, not {type(self.config).__name__}"
            )
        if not isinstance(self.messages, tuple | LogView):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        if self.session_id is None and self.session is not None:
            session_id = getattr(self.session, "id", None)
            if isinstance(session_id, str):
                object.__setattr__(self, "session_id", session_id)

    @property
    def provider(self) -> str:
        return self.config.provider

    @property
    def model(self) -> str:
        return self.config.model

    def replace(self, **changes: Any) -> LlmRequest:
        """A copy with ``changes`` applied (the original is untouched)."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderInfo:
    """Display metadata of one provider route."""

    id: str
    name: str
    #: the model the adapter serves when the caller names none (CLI convenience)
    default_model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """What an adapter knows about one exact model.

    ``reasoning_efforts`` None means the model takes no effort setting, so a
    request naming one is refused (``UNSUPPORTED_REASONING_EFFORT``) rather than
    silently ignored. ``default_effort`` and ``default_max_tokens`` are
    materialized into a request that omits them, and marked as adapter defaults
    in the request header.
    """

    provider: str
    id: str
    name: str
    context_window: int | None = None
    default_max_tokens: int | None = None
    reasoning_efforts: tuple[str, ...] | None = None
    default_effort: str | None = None
    #: whether the model reads images and PDFs; False: a prompt's attachments are refused
    #: before anything is logged and the history's images go as text notes (D31)
    vision: bool = True


#: Failure codes worth retrying by default: transient, and nothing durable happened.
DEFAULT_RETRYABLE_CODES: tuple[str, ...] = (
    EMPTY_RESPONSE_CODE,
    "RATE_LIMIT",
    "SERVER",
    "TIMEOUT",
    "TRANSPORT",
)

#: The longest delay a retry policy may configure (DSH's timer bound, 2**31 - 1 ms).
MAX_TIMER_DELAY_MS = 2_147_483_647


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A provider-owned retry policy (DSH ``ResolvedRetryPolicy``).

    The adapter owns it because only the provider knows which failures are
    transient; the ``llm-retry`` plugin executes it on the agent loop's
    ``agent/request-error`` hook. The runtime captures it when a route is
    registered and hands it out with every prepared call. ``mode="always"``
    retries every failure until success or cancellation (``max_retries`` and
    ``retryable_codes`` are then inactive).
    """

    mode: Literal["normal", "always"] = "normal"
    max_retries: int = 5
    retryable_codes: tuple[str, ...] = DEFAULT_RETRYABLE_CODES
    initial_delay_ms: float = 500.0
    max_delay_ms: float = 10_000.0
    jitter_ratio: float = 0.1
    _codes: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("normal", "always"):
            raise ValueError(f'retry policy mode must be "normal" or "always", not {self.mode!r}')
        if type(self.max_retries) is not int or self.max_retries < 0:
            raise ValueError(
                f"retry max_retries must be a non-negative integer, not {self.max_retries!r}"
            )
        if not self.retryable_codes or not all(
            isinstance(code, str) and code for code in self.retryable_codes
        ):
            raise ValueError("retry retryable_codes must be a non-empty list of non-empty strings")
        if len(set(self.retryable_codes)) != len(self.retryable_codes):
            raise ValueError("retry retryable_codes must not contain duplicates")
        for name in ("initial_delay_ms", "max_delay_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0 or value > MAX_TIMER_DELAY_MS:
                raise ValueError(
                    f"retry {name} must be a positive finite number no greater than "
                    f"{MAX_TIMER_DELAY_MS}, not {value!r}"
                )
        if self.initial_delay_ms > self.max_delay_ms:
            raise ValueError("retry initial_delay_ms must be less than or equal to max_delay_ms")
        if not 0 <= self.jitter_ratio <= 1:
            raise ValueError(
                f"retry jitter_ratio must be between 0 and 1, not {self.jitter_ratio!r}"
            )
        object.__setattr__(self, "retryable_codes", tuple(self.retryable_codes))
        object.__setattr__(self, "_codes", frozenset(self.retryable_codes))

    @property
    def key(self) -> str:
        """The canonical identity of every behaviour-affecting field (DSH ``policyKey``).

        A JSON array: ``["always", initial, max, jitter]`` or ``["normal",
        max_retries, [sorted codes], initial, max, jitter]``, numbers written
        as JavaScript writes them, so a key matches the one DSH logs for the
        same policy. Retry numbers continue only across ``llm/retry`` events
        with the same key.
        """
        backoff = [js_number(v) for v in (self.initial_delay_ms, self.max_delay_ms)]
        backoff.append(js_number(self.jitter_ratio))
        head = [json.dumps(self.mode)]
        if self.mode == "normal":
            head.append(str(self.max_retries))
            head.append(json.dumps(sorted(self.retryable_codes), separators=(",", ":")))
        return "[" + ",".join(head + backoff) + "]"

    def declines_retry_after(self, failure: LlmFailure) -> bool:
        """True when this policy would retry ``failure`` but for its ``Retry-After``: a normal
        policy, a retryable code, and a provider delay beyond ``max_delay_ms``.

        Adapters use it to say so in the failure's message (a declined wait is otherwise
        invisible: the turn just ends with the provider's error).
        """
        delay = failure.provider_retry_after_ms
        return (
            self.mode == "normal"
            and self.max_retries > 0
            and failure.code in self._codes
            and isinstance(delay, int)
            and delay > self.max_delay_ms
        )

    def delay_ms(
        self,
        retry: int,
        failure: LlmFailure,
        random: Callable[[], float] = _random.random,
    ) -> float | None:
        """How long to wait before retry number ``retry`` (1-based), or None for "do not retry".

        A provider ``Retry-After`` within ``max_delay_ms`` is honoured exactly; one
        beyond it ends a normal policy (waiting that long is the caller's call, not
        ours) and is replaced by local backoff in ``always`` mode. Local backoff is
        exponential from ``initial_delay_ms``, capped at ``max_delay_ms``, with
        symmetric jitter.
        """
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, not {retry}")
        if self.mode == "normal":
            if failure.code not in self._codes or retry > self.max_retries:
                return None
            if self.declines_retry_after(failure):
                return None
        provider_delay = failure.provider_retry_after_ms
        if isinstance(provider_delay, int) and 0 < provider_delay <= self.max_delay_ms:
            return float(provider_delay)
        exponential = min(self.initial_delay_ms * 2.0 ** min(retry - 1, 64), self.max_delay_ms)
        jitter = 1 - self.jitter_ratio + 2 * self.jitter_ratio * random()
        return min(exponential * jitter, self.max_delay_ms)


_Delay = Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMER_DELAY_MS)]
_Code = Annotated[str, msgspec.Meta(min_length=1)]


class RetryBackoffConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``retry_policy.backoff`` of a provider row (DSH ``BackoffConfig``)."""

    #: first local delay; doubles per retry
    initial_delay_ms: _Delay = 500
    #: cap on a local delay, and the longest provider Retry-After honoured
    max_delay_ms: _Delay = 10_000
    #: symmetric random multiplier range around one
    jitter_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1


class RetryPolicyConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A provider row's ``retry_policy`` (DSH ``RetryPolicyConfig``), embedded by adapters.

    ``mode: always`` keeps ``max_retries`` / ``retryable_codes`` accepted but
    inactive, as DSH does for layered configs.
    """

    mode: Literal["normal", "always"] = "normal"
    max_retries: Annotated[int, msgspec.Meta(ge=0)] = 5
    retryable_codes: list[_Code] = msgspec.field(
        default_factory=lambda: list(DEFAULT_RETRYABLE_CODES)
    )
    backoff: RetryBackoffConfig = msgspec.field(default_factory=RetryBackoffConfig)

    def __post_init__(self) -> None:
        self.resolve()  # a bad combination fails the row's config with its key path

    def resolve(self) -> RetryPolicy:
        """The immutable policy (ValueError names the offending field)."""
        return RetryPolicy(
            mode=self.mode,
            max_retries=self.max_retries,
            retryable_codes=tuple(self.retryable_codes),
            initial_delay_ms=float(self.backoff.initial_delay_ms),
            max_delay_ms=float(self.backoff.max_delay_ms),
            jitter_ratio=float(self.backoff.jitter_ratio),
        )


class LlmAdapter(abc.ABC):
    """A model backend: turns an :class:`LlmRequest` into a stream of chunks.

    Register an instance with ``ctx.llm.register_adapter([provider], adapter,
    owner=ctx)``. Only :meth:`stream` is required. The stream contract:

    - chunks in order; ``usage`` before ``finish``; nothing after ``finish``;
    - tool-call arguments stay raw JSON strings (never parsed here);
    - honour ``request.signal``: when it aborts, stop and raise
      :class:`~dsh_host.errors.AbortError` (use ``signal.linked_scope()``
      around your own awaits, never around a ``yield``);
    - to fail, *raise* (preferably :class:`~dsh_host._llm.errors.LlmError` with a
      stable code); the runtime turns it into the terminal ``finish`` chunk.
    """

    def provider_info(self, provider: str) -> ProviderInfo:
        """Display metadata for one route this adapter serves."""
        return ProviderInfo(id=provider, name=provider)

    def retry_policy(self, provider: str) -> RetryPolicy | None:
        """The retry policy of one route (None: the normal defaults)."""
        return None

    async def resolve_model(
        self, provider: str, model: str, signal: CancelToken | None = None
    ) -> ModelInfo:
        """Metadata of one exact model (context window, defaults, reasoning efforts)."""
        return ModelInfo(provider=provider, id=model, name=model)

    @abc.abstractmethod
    def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Stream one model call (typically an ``async def`` generator)."""

