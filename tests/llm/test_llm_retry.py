"""``llm-retry`` through the real agent loop and the real HTTP adapter on 127.0.0.1.

Each test scripts the loopback server (:mod:`sse_server`), counts the requests
it received, and judges from the session log: ``llm/retry`` before the wait,
``llm/retry-started`` after it, the final ``assistant/message`` and ``turn/end``.
Backoff is made short through the provider row's ``retry_policy`` (or a
``Retry-After`` of one second); no assertion depends on how long anything took.
"""

from __future__ import annotations

import email.utils
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from msgspec import UNSET

from dsh_host import PluginHost, Row, open_host
from dsh_host._agent import Agent, AgentService
from dsh_host._llm import RetryPolicy
from dsh_host._session import (
    AbortedReason,
    AssistantMessageData,
    CompletedReason,
    ErrorReason,
    LlmFailure,
    LlmRetryData,
    LlmRetryStartedData,
    SessionEvent,
    TextBlock,
    decode_event,
    encode_event,
)
from dsh_host.errors import ConfigError

from .sse_server import SseServer, http_error, sse, text_events

# both backends: HTTP, timeouts and cancellation during backoff
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

KEY_ENV = "DSH_TEST_RETRY_KEY"
PROVIDER = "deepseek-official"
#: fast, deterministic local backoff: 20 ms, 40 ms, then capped at 50 ms, no jitter
FAST = {"backoff": {"initial_delay_ms": 20, "max_delay_ms": 50, "jitter_ratio": 0}}


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")


def rows(base_url: str, retry_policy: dict[str, Any] | None = None, **extra: Any) -> list[Row]:
    model: dict[str, Any] = {"base_url": base_url, "api_key_env": KEY_ENV, **extra}
    if retry_policy is not None:
        model["retry_policy"] = retry_policy
    return [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        Row(id="model", name="llm-openai-compatible", config=model),
        Row(id="llm-retry", name="@deepseek-ai/dsh-llm-retry"),
        Row(name="agent", config={"provider": PROVIDER, "model": "deepseek-chat"}),
    ]


@asynccontextmanager
async def retry_host(
    base_url: str, retry_policy: dict[str, Any] | None = None, **extra: Any
) -> AsyncIterator[PluginHost]:
    async with open_host(rows(base_url, retry_policy, **extra)) as host:
        yield host


def new_agent(host: PluginHost) -> Agent:
    service: AgentService = host.ctx.agent
    return service.create()


def of_type(agent: Agent, kind: str) -> list[Any]:
    return [event.data for event in agent.session.events if event.type == kind]


def kinds(agent: Agent) -> list[str]:
    return [event.type for event in agent.session.events]


def final_text(agent: Agent) -> str:
    [message] = of_type(agent, "assistant/message")
    assert isinstance(message, AssistantMessageData)
    return "".join(b.text for b in message.message.content if isinstance(b, TextBlock))


def assert_retry_pairs(agent: Agent) -> tuple[list[LlmRetryData], list[LlmRetryStartedData]]:
    """Each retry follows a failed attempt and each started record its retry, with equal ids."""
    scheduled = of_type(agent, "llm/retry")
    started = of_type(agent, "llm/retry-started")
    assert all(isinstance(s, LlmRetryData) for s in scheduled)
    assert [(s.retry_id, s.turn, s.step, s.retry) for s in started] == [
        (s.retry_id, s.turn, s.step, s.retry) for s in scheduled[: len(started)]
    ]
    order = [k for k in kinds(agent) if k in ("assistant/attempt", "llm/retry", "llm/retry-started")]
    for index, kind in enumerate(order):
        if kind == "llm/retry":
            assert order[index - 1] == "assistant/attempt", order
        elif kind == "llm/retry-started":
            assert order[index - 1] == "llm/retry", order
    return scheduled, started


async def test_429_with_retry_after_seconds_then_200() -> None:
    script = [
        http_error(429, {"error": {"message": "slow down"}},
                   headers={"retry-after": "1", "x-request-id": "req-1"}),
        sse(text_events("after ", "the wait")),
    ]
    with SseServer(script) as server:
        async with retry_host(server.url) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 2
        assert server.requests[0].body == server.requests[1].body
    assert reason == CompletedReason()
    (retry,), (started,) = assert_retry_pairs(agent)
    assert retry.failure == LlmFailure(
        message="slow down", code="RATE_LIMIT", status=429,
        provider_retry_after_ms=1000, request_id="req-1",
    )
    # the provider's delay is honoured exactly (no jitter), under the default policy
    assert (retry.retry, retry.mode, retry.max_retries, retry.delay_ms) == (1, "normal", 5, 1000)
    assert (retry.turn, retry.step, retry.provider) == (1, 1, PROVIDER)
    assert retry.policy_key == RetryPolicy().key == (
        '["normal",5,["EMPTY_RESPONSE","RATE_LIMIT","SERVER","TIMEOUT","TRANSPORT"],500,10000,0.1]'
    )
    assert started == LlmRetryStartedData(retry_id=retry.retry_id, turn=1, step=1, retry=1)
    assert final_text(agent) == "after the wait"
    assert kinds(agent).count("step/start") == 1  # a retry is a fresh request in the same step
    assert kinds(agent)[-2:] == ["step/end", "turn/end"]


async def test_429_with_retry_after_http_date() -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    script = [
        http_error(429, {"error": {"message": "later"}}, headers={"retry-after": when}),
        sse(text_events("ok")),
    ]
    with SseServer(script) as server:
        async with retry_host(server.url) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 2
    assert reason == CompletedReason()
    (retry,), _ = assert_retry_pairs(agent)
    assert retry.failure.code == "RATE_LIMIT"
    delay = retry.failure.provider_retry_after_ms
    assert delay is not UNSET and 0 < delay <= 2000
    assert retry.delay_ms == delay


async def test_500_then_200_uses_local_backoff() -> None:
    script = [http_error(500, {"error": {"message": "boom"}}), sse(text_events("fine"))]
    with SseServer(script) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 2
    assert reason == CompletedReason()
    (retry,), _ = assert_retry_pairs(agent)
    assert (retry.failure.code, retry.failure.status, retry.delay_ms) == ("SERVER", 500, 20)
    assert retry.policy_key == '["normal",5,["EMPTY_RESPONSE","RATE_LIMIT","SERVER","TIMEOUT","TRANSPORT"],20,50,0]'
    assert final_text(agent) == "fine"


async def test_mid_stream_disconnect_then_200_commits_only_the_retry() -> None:
    cut = text_events("discard me", done=False)[:2]
    script = [sse(cut, close_early=True), sse(text_events("recovered"))]
    with SseServer(script) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
            derived = list(agent.session.derive_messages())
        assert len(server.requests) == 2
        assert server.requests[0].body == server.requests[1].body
    assert reason == CompletedReason()
    (retry,), _ = assert_retry_pairs(agent)
    assert retry.failure.code == "TRANSPORT"
    assert final_text(agent) == "recovered"
    # the failed partial output stays in its attempt record, never in what the model sees
    assert "discard me" not in json.dumps([str(m) for m in derived])
    [attempt] = of_type(agent, "assistant/attempt")
    assert "discard me" in str(attempt.stream)


async def test_refused_connection_recovers_when_the_endpoint_starts_during_backoff() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # nothing listens on the port until the first retry is scheduled
    late: list[SseServer] = []
    policy = {"backoff": {"initial_delay_ms": 200, "max_delay_ms": 200, "jitter_ratio": 0}}
    try:
        async with retry_host(f"http://127.0.0.1:{port}", policy) as host:
            agent = new_agent(host)

            def start_on_first_retry(session: Any, event: SessionEvent) -> None:
                if event.type == "llm/retry" and not late:
                    late.append(SseServer([sse(text_events("connected after retry"))], port=port))
                    late[0].start()

            host.ctx.on("session/event", start_on_first_retry)
            with anyio.fail_after(60):
                reason = await agent.run_turn("hi")
    finally:
        for server in late:
            server.stop()
    assert reason == CompletedReason()
    assert [len(server.requests) for server in late] == [1]
    [retry] = of_type(agent, "llm/retry")
    assert retry.failure.code == "TRANSPORT"
    assert final_text(agent) == "connected after retry"


@pytest.mark.parametrize(
    ("status", "code"), [(400, "INVALID_REQUEST"), (401, "AUTH"), (403, "AUTH")]
)
async def test_non_retryable_failures_are_not_retried(status: int, code: str) -> None:
    script = [http_error(status, {"error": {"message": "no"}}), sse(text_events("never"))]
    with SseServer(script) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 1
    assert isinstance(reason, ErrorReason)
    assert (reason.error.code, reason.error.status) == (code, status)
    assert "llm/retry" not in kinds(agent)


async def test_budget_of_five_then_the_turn_ends_error_with_the_last_failure() -> None:
    script = [http_error(500 + n, {"error": {"message": f"down {n}"}}) for n in range(6)]
    script.append(sse(text_events("too late")))
    with SseServer(script) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 6  # the first request and five retries
    assert isinstance(reason, ErrorReason)
    assert reason.error == LlmFailure(message="down 5", code="SERVER", status=505)
    scheduled, started = assert_retry_pairs(agent)
    assert [s.retry for s in scheduled] == [1, 2, 3, 4, 5]
    assert len(started) == 5
    assert len({s.retry_id for s in scheduled}) == 1  # one chain
    assert [s.delay_ms for s in scheduled] == [20, 40, 50, 50, 50]  # exponential, capped
    assert [s.failure.message for s in scheduled] == [f"down {n}" for n in range(5)]
    assert "assistant/message" not in kinds(agent)
    assert kinds(agent).count("assistant/attempt") == 6


async def test_configured_budget_and_codes() -> None:
    policy = {**FAST, "max_retries": 1, "retryable_codes": ["SERVER"]}
    script = [http_error(500), http_error(500), sse(text_events("x"))]
    with SseServer(script) as server:
        async with retry_host(server.url, policy) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 2
    assert isinstance(reason, ErrorReason) and reason.error.code == "SERVER"
    [retry] = of_type(agent, "llm/retry")
    assert retry.max_retries == 1 and retry.policy_key == '["normal",1,["SERVER"],20,50,0]'
    # a code outside the configured list is not retried
    with SseServer([http_error(429), sse(text_events("x"))]) as server:
        async with retry_host(server.url, policy) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 1
    assert isinstance(reason, ErrorReason) and reason.error.code == "RATE_LIMIT"


async def test_retry_after_over_the_cap_delegates_in_normal_mode() -> None:
    script = [http_error(429, headers={"retry-after": "30"}), sse(text_events("x"))]
    with SseServer(script) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 1
    assert isinstance(reason, ErrorReason)
    assert reason.error.provider_retry_after_ms == 30_000
    assert "llm/retry" not in kinds(agent)


async def test_always_mode_retries_permanent_failures_and_ignores_an_over_cap_delay() -> None:
    policy = {"mode": "always", **FAST}
    script = [
        http_error(401, {"error": {"message": "bad key"}}),
        http_error(429, headers={"retry-after": "30"}),
        sse(text_events("eventually")),
    ]
    with SseServer(script) as server:
        async with retry_host(server.url, policy) as host:
            agent = new_agent(host)
            reason = await agent.run_turn("hi")
        assert len(server.requests) == 3
    assert reason == CompletedReason()
    scheduled, started = assert_retry_pairs(agent)
    assert len(started) == 2
    assert [(s.mode, s.retry, s.failure.code, s.delay_ms) for s in scheduled] == [
        ("always", 1, "AUTH", 20), ("always", 2, "RATE_LIMIT", 40),
    ]
    assert all(s.max_retries is UNSET for s in scheduled)
    assert scheduled[0].policy_key == '["always",20,50,0]'
    assert final_text(agent) == "eventually"


async def test_cancellation_during_backoff_aborts_without_another_request() -> None:
    slow = {"backoff": {"initial_delay_ms": 60_000, "max_delay_ms": 60_000}}
    with SseServer([http_error(503), sse(text_events("never sent"))]) as server:
        async with retry_host(server.url, slow) as host:
            agent = new_agent(host)
            scheduled = anyio.Event()

            def watch(session: Any, event: SessionEvent) -> None:
                if event.type == "llm/retry":
                    scheduled.set()

            host.ctx.on("session/event", watch)
            outcome: list[Any] = []

            async def turn() -> None:
                outcome.append(await agent.run_turn("hi"))

            with anyio.fail_after(30):  # a hang guard, far below the 60 s backoff
                async with anyio.create_task_group() as tg:
                    tg.start_soon(turn)
                    await scheduled.wait()
                    agent.cancel()
        assert len(server.requests) == 1
    [reason] = outcome
    assert isinstance(reason, AbortedReason)
    assert len(of_type(agent, "llm/retry")) == 1
    assert "llm/retry-started" not in kinds(agent)
    assert "assistant/message" not in kinds(agent)
    assert kinds(agent)[-2:] == ["step/end", "turn/end"]


async def test_disposing_the_row_during_backoff_fails_the_turn_closed() -> None:
    slow = {"backoff": {"initial_delay_ms": 60_000, "max_delay_ms": 60_000}}
    with SseServer([http_error(503), sse(text_events("never sent"))]) as server:
        async with retry_host(server.url, slow) as host:
            agent = new_agent(host)
            scheduled = anyio.Event()

            def watch(session: Any, event: SessionEvent) -> None:
                if event.type == "llm/retry":
                    scheduled.set()

            host.ctx.on("session/event", watch)
            outcome: list[Any] = []

            async def turn() -> None:
                outcome.append(await agent.run_turn("hi"))

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(turn)
                    await scheduled.wait()
                    await host.unload("llm-retry")
        assert len(server.requests) == 1
    [reason] = outcome
    assert isinstance(reason, ErrorReason) and reason.error.code == "SERVER"
    assert "llm/retry-started" not in kinds(agent)


async def test_retry_events_round_trip_through_the_codec() -> None:
    with SseServer([http_error(500), sse(text_events("ok"))]) as server:
        async with retry_host(server.url, FAST) as host:
            agent = new_agent(host)
            await agent.run_turn("hi")
    events = [e for e in agent.session.events if e.type.startswith("llm/retry")]
    assert [e.type for e in events] == ["llm/retry", "llm/retry-started"]
    for event in events:
        wire = json.loads(encode_event(event))
        assert decode_event(encode_event(event)) == event
        if event.type == "llm/retry":
            assert list(wire["data"]) == [
                "retryId", "turn", "step", "provider", "mode", "policyKey", "retry",
                "maxRetries", "delayMs", "failure",
            ]
        else:
            assert list(wire["data"]) == ["retryId", "turn", "step", "retry"]


def test_event_payload_checks_mode_against_max_retries() -> None:
    failure = LlmFailure(message="m", code="SERVER")
    common: dict[str, Any] = {
        "retry_id": "r", "turn": 1, "step": 1, "provider": "p", "policy_key": "k",
        "retry": 1, "delay_ms": 0, "failure": failure,
    }
    LlmRetryData(mode="normal", max_retries=5, **common)
    LlmRetryData(mode="always", **common)
    with pytest.raises(ValueError, match="needs maxRetries"):
        LlmRetryData(mode="normal", **common)
    with pytest.raises(ValueError, match="has no maxRetries"):
        LlmRetryData(mode="always", max_retries=5, **common)


async def test_dsh_spelled_rows_are_accepted() -> None:
    camel = {
        "baseURL": "http://127.0.0.1:9",
        "apiKeyEnv": KEY_ENV,
        "retryPolicy": {
            "mode": "normal",
            "maxRetries": 2,
            "retryableCodes": ["SERVER", "TRANSPORT"],
            "backoff": {"initialDelayMs": 100, "maxDelayMs": 400, "jitterRatio": 0.2},
        },
    }
    async with open_host(
        [Row(name="llm"), Row(id="model", name="llm-openai-compatible", config=camel)]
    ) as host:
        policy = host.ctx.llm.retry_policy(PROVIDER)
    assert policy == RetryPolicy(
        max_retries=2, retryable_codes=("SERVER", "TRANSPORT"),
        initial_delay_ms=100, max_delay_ms=400, jitter_ratio=0.2,
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"retryPolicy": {"mode": "always"}}, "retry_policy belongs under each provider"),
        ({"maxRetries": 3}, "unknown key"),
    ],
)
async def test_executor_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        async with open_host(
            [*rows("http://127.0.0.1:9")[:-2], Row(name="llm-retry", config=config)],
        ):
            pass


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"retryable_codes": ["SERVER", "SERVER"]}, "duplicates"),
        ({"backoff": {"initial_delay_ms": 500, "max_delay_ms": 100}}, "less than or equal"),
        ({"backoff": {"jitter_ratio": 2}}, "jitter_ratio"),
        ({"mode": "sometimes"}, "mode"),
        ({"retry_policy": {}}, "unknown key"),
    ],
)
async def test_bad_provider_policies_fail_the_row(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        async with open_host(
            [Row(name="llm"), Row(id="model", name="llm-openai-compatible",
                                  config={"retry_policy": policy})]
        ):
            pass
