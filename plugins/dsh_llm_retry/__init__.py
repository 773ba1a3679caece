"""``llm-retry``: execute the serving provider's retry policy on ``agent/request-error``.

The adapter owns the policy (:class:`~dsh_host._llm.RetryPolicy`, captured when
its route registered and carried with every prepared call); this row only
executes it. It never wraps ``llm/stream``: each adapter call stays one
provider attempt, and each retry is a fresh request in the same step, which
the loop makes when the waterfall returns ``Retry()``.

Per failure: delegate when no final adapter served the request (no policy) or
a normal policy does not cover it (code not eligible, budget spent, provider
``Retry-After`` beyond ``max_delay_ms``); otherwise append the durable
non-surface ``llm/retry`` record, wait (cancellable), append
``llm/retry-started`` and return ``Retry()``. ``always`` mode asks the rest of
the chain first and falls back to its own unbounded retry. Cancellation during
the wait writes no started event and returns nothing, so the loop ends the
turn ``aborted`` without another request; disposing the row aborts active
waits (the turn then ends ``error`` with the failure) and drains them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from msgspec import UNSET

from dsh_host.sdk import (
    AGENT_REQUEST_ERROR,
    CancelToken,
    Context,
    LlmFailure,
    LlmRetryData,
    LlmRetryStartedData,
    Plugin,
    RequestErrorAction,
    RequestErrorContext,
    Retry,
    RetryPolicy,
    Session,
    request_error_action,
)

__all__ = ["LlmRetry", "LlmRetryConfig", "last_retry"]

Next = Callable[[], Awaitable[Any]]


class LlmRetryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The executor takes no policy keys: every provider row owns its ``retry_policy``."""

    #: refused with a pointer to where it belongs (a DSH row copied to the wrong place)
    retry_policy: Any = UNSET

    def __post_init__(self) -> None:
        if self.retry_policy is not UNSET:
            raise ValueError(
                "llm-retry: retry_policy belongs under each provider configuration (e.g. the "
                "llm-openai-compatible row's retry_policy); this row takes no keys"
            )


def last_retry(
    session: Session, turn: int, step: int, provider: str, policy_key: str
) -> LlmRetryData | None:
    """The latest ``llm/retry`` of this step's chain for this provider policy, if any.

    Retries stay inside their step, so the scan stops at the step's
    ``step/start``; a policy with another key (a replaced route) starts its own chain.
    """
    events = session.events
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        data = event.data
        if event.type == "llm/retry" and isinstance(data, LlmRetryData):
            if (data.turn, data.step, data.provider, data.policy_key) == (
                turn,
                step,
                provider,
                policy_key,
            ):
                return data
        elif event.type == "step/start" and (data.turn, data.step) == (turn, step):
            return None
    return None


class LlmRetry(Plugin):
    """Entry point ``llm-retry`` (DSH ``@deepseek-ai/dsh-llm-retry``)."""

    name = "llm-retry"
    inject = ("agent",)
    Config = LlmRetryConfig

    def apply(self, ctx: Context, config: LlmRetryConfig) -> None:
        lifetime = CancelToken()
        active = 0
        drained = anyio.Event()
        drained.set()
        logger = ctx.logger

        async def recover(payload: RequestErrorContext, next_: Next) -> RequestErrorAction:
            nonlocal active, drained
            if lifetime.aborted:  # captured by a waterfall before the row went away
                return None
            if active == 0:
                drained = anyio.Event()
            active += 1
            try:
                return await _recover(payload, next_)
            finally:
                active -= 1
                if active == 0:
                    drained.set()

        async def _recover(payload: RequestErrorContext, next_: Next) -> RequestErrorAction:
            policy = payload.retry_policy
            if policy is None:  # no final adapter served the request: nothing to apply
                return request_error_action(await next_())
            signal = payload.signal
            if policy.mode == "always":
                if signal.aborted or lifetime.aborted:
                    return None
                try:
                    downstream = request_error_action(await next_())
                except Exception:
                    logger.warning(
                        'llm-retry: provider "%s" always policy ignored a downstream recovery '
                        "failure",
                        payload.provider,
                        exc_info=True,
                    )
                    downstream = None
                if signal.aborted or lifetime.aborted:
                    return None
                if downstream is not None:
                    return downstream
            key = policy.key
            session = payload.agent.session
            prior = last_retry(session, payload.turn, payload.step, payload.provider, key)
            retry = prior.retry + 1 if prior is not None else 1
            delay = policy.delay_ms(retry, payload.failure, random.random)
            if delay is None:  # normal: not eligible, budget spent, or Retry-After over the cap
                return request_error_action(await next_())
            retry_id = prior.retry_id if prior is not None else str(uuid.uuid4())
            return await _backoff(payload, policy, key, retry, retry_id, delay)

        async def _backoff(
            payload: RequestErrorContext,
            policy: RetryPolicy,
            key: str,
            retry: int,
            retry_id: str,
            delay_ms: float,
        ) -> RequestErrorAction:
            signal = payload.signal
            if signal.aborted or lifetime.aborted:
                return None
            session = payload.agent.session
            session.append(
                "llm/retry",
                _retry_event(payload, policy, key, retry, retry_id, delay_ms),
            )
            with signal.linked_scope(), lifetime.linked_scope():
                await anyio.sleep(delay_ms / 1000)
            if signal.aborted or lifetime.aborted:
                return None  # cancellation beats the retry: no started event
            session.append(
                "llm/retry-started",
                LlmRetryStartedData(
                    retry_id=retry_id, turn=payload.turn, step=payload.step, retry=retry
                ),
            )
            return Retry()

        async def close() -> None:
            lifetime.abort("llm-retry row disposed")
            await drained.wait()

        ctx.on(AGENT_REQUEST_ERROR, recover)
        ctx.effect(close, "llm-retry: abort and drain active backoff")


def _retry_event(
    payload: RequestErrorContext,
    policy: RetryPolicy,
    key: str,
    retry: int,
    retry_id: str,
    delay_ms: float,
) -> LlmRetryData:
    failure: LlmFailure = payload.failure
    return LlmRetryData(
        retry_id=retry_id,
        turn=payload.turn,
        step=payload.step,
        provider=payload.provider,
        mode=policy.mode,
        policy_key=key,
        retry=retry,
        max_retries=policy.max_retries if policy.mode == "normal" else UNSET,
        delay_ms=int(delay_ms) if float(delay_ms).is_integer() else delay_ms,
        failure=failure,
    )
