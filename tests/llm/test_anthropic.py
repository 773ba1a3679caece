"""llm-anthropic over real HTTP on 127.0.0.1: Anthropic's documented SSE streams replayed by
the suite's loopback server (fixtures/anthropic/*.sse, written from the Messages API's
streaming examples), and LLMock's independent ``/anthropic/v1/messages`` with its journal.

What every adapter must do is in tests/llm/contract; this file holds what is Anthropic's:
the request shape, thinking with signatures kept and passed back, prompt caching, the API's
error types, and the SDK's own retries being off.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from llmock.scenarios import Fail, Reply, ToolCall

from dsh_host import PluginHost, Row, open_host
from dsh_host._jsonsafe import json_dec_hook, json_enc_hook, thaw_json
from dsh_host._llm import BlockAssembler
from dsh_host._session import (
    MaxTokensFinish,
    ReasoningBlock,
    StopFinish,
    StreamChunk,
    TextBlock,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
)
from dsh_host._session.messages import ToolResultBlock, UserMessage, UserSource, new_message_id

from .llm_helpers import collect, request, terminal_failure, user
from .sse_server import SseServer, raw

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

KEY_ENV = "DSH_TEST_ANTHROPIC_KEY"
MODEL = "claude-sonnet-4-5"
FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")


@asynccontextmanager
async def anthropic_host(base_url: str, **config: Any) -> AsyncIterator[PluginHost]:
    row = {"base_url": base_url, "api_key_env": KEY_ENV, **config}
    async with open_host(
        [Row(name="llm"), Row(id="model", name="llm-anthropic", config=row)]
    ) as host:
        yield host


def replay(name: str) -> Any:
    """A recorded stream, one HTTP chunk per event, as the API sends it."""
    text = (FIXTURES / f"{name}.sse").read_text(encoding="utf-8")
    return raw([f"{event}\n\n".encode() for event in text.strip().split("\n\n")])


async def run(base_url: str, **kwargs: Any) -> list[StreamChunk]:
    async with anthropic_host(base_url) as host:
        return await collect(host.ctx.llm.stream(request("anthropic", MODEL, **kwargs)))


def assembled(chunks: list[StreamChunk]) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


async def test_text_stream_and_the_request_it_sends() -> None:
    with SseServer([replay("text")]) as server:
        chunks = await run(server.url, messages=[user("hi")], system="be brief", stop=["END"])
    result = assembled(chunks)
    assert result.blocks() == (TextBlock(text="Hello!"),)
    assert result.finish == StopFinish()
    assert result.usage == TokenUsage(input_tokens=25, output_tokens=15)
    [sent] = server.requests
    assert sent.path == "/v1/messages"
    # the key read from the row's variable, as the SDK sends it (x-api-key, or Bearer in 2.x)
    assert "sk-ant-test" in (sent.headers.get("x-api-key"), sent.headers.get("authorization", "")[7:])
    assert sent.headers["anthropic-version"]
    assert sent.headers["user-agent"].startswith("dsh-python/")
    assert sent.headers.get("x-stainless-retry-count", "0") == "0"
    assert sent.body == {
        "model": MODEL,
        "max_tokens": 8192,  # the API requires one: the row's default
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
            ]},
        ],
        # the stable prefix (tools + system) ends here: a cache breakpoint
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "stop_sequences": ["END"],
        "stream": True,
    }


async def test_tool_use_streams_its_arguments_as_they_arrive() -> None:
    with SseServer([replay("tool_use")]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.blocks() == (
        TextBlock(text="Okay, let's check the weather for San Francisco, CA:"),
        ToolCallBlock(
            id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            name="get_weather",
            arguments='{"location": "San Francisco, CA", "unit": "fahrenheit"}',
        ),
    )
    assert result.finish == ToolCallsFinish()
    deltas = [c for c in chunks if isinstance(c, ToolCallDeltaChunk)]
    assert len(deltas) == 8 and all(d.id == "toolu_01T1x1fJ34qAmk2tNTrN7Up6" for d in deltas)


async def test_thinking_is_kept_with_its_signature_and_passed_back() -> None:
    """Extended thinking: the reasoning streams live, the signature (and a redacted block's
    data) lands in the message's replay state, and the next request sends both back."""
    with SseServer([replay("thinking"), replay("text")]) as server:
        async with anthropic_host(server.url) as host:
            first = request("anthropic", MODEL, reasoning_effort="high", max_tokens=32_000,
                            messages=[user("gcd(1071, 462)?")])
            result = assembled(await collect(host.ctx.llm.stream(first)))
            message = result.message(provider="anthropic", model=MODEL)
            follow = request("anthropic", MODEL, reasoning_effort="high", max_tokens=32_000,
                             messages=[user("gcd(1071, 462)?"), message, user("and lcm?")])
            await collect(host.ctx.llm.stream(follow))
    assert message.content == (
        ReasoningBlock(text="I need to find the GCD of 1071 and 462 using the Euclidean "
                       "algorithm.\n\n1071 = 2 × 462 + 147\n462 = 3 × 147 + 21\n147 = 7 × 21 "
                       "+ 0\n\nSo GCD(1071, 462) = 21"),
        ReasoningBlock(text=""),
        TextBlock(text="The greatest common divisor of 1071 and 462 is **21**."),
    )
    assert result.usage == TokenUsage(input_tokens=14, output_tokens=102, cache_read_tokens=0,
                                      cache_write_tokens=2048)
    replay_state = thaw_json(message.source.replay_state)
    assert replay_state["blocks"][0] == {
        "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."
    }
    assert replay_state["blocks"][1]["redacted_data"].startswith("EmwKAhgBEgy3va3p")
    assert replay_state["blocks"][2] is None
    # the log form survives a round trip (the replay state is what the session stores)
    encoded = msgspec.json.encode(message, enc_hook=json_enc_hook)
    assert msgspec.json.decode(encoded, type=type(message), dec_hook=json_dec_hook) == message
    first_body, second_body = (r.body for r in server.requests)
    assert first_body["thinking"] == {"type": "enabled", "budget_tokens": 24_576}
    assistant = second_body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {"type": "thinking", "thinking": message.content[0].text,
         "signature": replay_state["blocks"][0]["signature"]},
        {"type": "redacted_thinking", "data": replay_state["blocks"][1]["redacted_data"]},
        {"type": "text", "text": "The greatest common divisor of 1071 and 462 is **21**."},
    ]


async def test_reasoning_without_a_signature_is_not_sent_as_thinking() -> None:
    """A reasoning block the API did not sign (another provider's, a stream cut short) cannot
    be verified, so it is left out rather than forged."""
    from dsh_host._session import AssistantMessage, ModelSource

    foreign = AssistantMessage(
        id=new_message_id(),
        content=(ReasoningBlock(text="unsigned"), TextBlock(text="answer")),
        source=ModelSource(provider="anthropic", model=MODEL),
    )
    with SseServer([replay("text")]) as server:
        await run(server.url, messages=[user("q"), foreign, user("next")])
    assert server.requests[0].body["messages"][1] == {
        "role": "assistant", "content": [{"type": "text", "text": "answer"}],
    }


async def test_tool_results_go_first_in_the_user_turn_and_calls_as_tool_use() -> None:
    from dsh_host._session import AssistantMessage, ModelSource

    call = AssistantMessage(
        id=new_message_id(),
        content=(ToolCallBlock(id="toolu_1", name="read_file", arguments='{"path": "a"}'),),
        source=ModelSource(provider="anthropic", model=MODEL),
    )
    result = UserMessage(
        id=new_message_id(),
        content=(ToolResultBlock(tool_call_id="toolu_1", content=(TextBlock(text="body"),),
                                 is_error=True),),
        source=UserSource(),
    )
    with SseServer([replay("text")]) as server:
        await run(server.url, messages=[user("read a"), call, result, user("go on")])
    assert server.requests[0].body["messages"][1:] == [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
        ]},
        {"role": "user", "content": [  # two dsh messages, one API turn: roles alternate
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "body",
             "is_error": True},
            {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
        ]},
    ]


async def test_cache_tokens_and_max_tokens_stop() -> None:
    with SseServer([replay("cache_read")]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.usage == TokenUsage(
        input_tokens=21, output_tokens=393, cache_read_tokens=1800, cache_write_tokens=188
    )
    assert result.finish == MaxTokensFinish()


async def test_overloaded_mid_stream_is_a_retryable_server_error() -> None:
    with SseServer([replay("overloaded_mid_stream")]) as server:
        async with anthropic_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request("anthropic", MODEL)))
            policy = host.ctx.llm.retry_policy("anthropic")
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code, failure.status) == ("error", "SERVER", 529)
    assert "overloaded" in failure.message.lower()
    assert policy.delay_ms(1, failure) is not None  # llm-retry retries it


# -- against LLMock --------------------------------------------------------------------------


async def test_parallel_tool_calls_from_llmock(llmock: Any) -> None:
    llmock.add(Reply(text="Both.", tool_calls=(
        ToolCall("read_file", {"path": "a.txt"}), ToolCall("bash", {"command": "ls -la"}),
    )))
    chunks = await run(llmock.base_url("anthropic"))
    blocks = assembled(chunks).blocks()
    assert blocks[0] == TextBlock(text="Both.")
    assert [(b.name, json.loads(b.arguments)) for b in blocks[1:]] == [  # type: ignore[union-attr]
        ("read_file", {"path": "a.txt"}), ("bash", {"command": "ls -la"}),
    ]
    assert assembled(chunks).finish == ToolCallsFinish()
    record = llmock.last_request
    assert (record.path, record.model, record.stream) == ("/anthropic/v1/messages", MODEL, True)


async def test_the_sdk_does_not_retry_on_its_own(llmock: Any) -> None:
    """A 529 reaches dsh after exactly one request: llm-retry decides, and logs, any retry."""
    llmock.add(Fail(529, message="Overloaded"))
    llmock.reply("never reached by a hidden retry")
    chunks = await run(llmock.base_url("anthropic"))
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.status) == ("SERVER", 529)
    assert len(llmock.requests) == 1


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "prompt is too long: 210000 tokens > 200000 maximum", "CONTEXT_WINDOW_EXCEEDED"),
        (400, "max_tokens: Field required", "INVALID_REQUEST"),
        (404, "model: claude-nope", "MODEL_NOT_FOUND"),
        (429, "Number of request tokens has exceeded your per-minute rate limit", "RATE_LIMIT"),
        (500, "Internal server error", "SERVER"),
    ],
)
async def test_api_error_types_map_to_dsh_codes(
    llmock: Any, status: int, message: str, code: str
) -> None:
    llmock.add(Fail(status, message=message))
    chunks = await run(llmock.base_url("anthropic"))
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.status) == (code, status)
    assert message in failure.message


async def test_auth_error_names_the_variable_and_the_endpoint(llmock: Any) -> None:
    llmock.add(Fail(401, message="invalid x-api-key"))
    base = llmock.base_url("anthropic")
    chunks = await run(base)
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.status) == ("AUTH", 401)
    assert failure.message == (
        f"Anthropic API refused the credential (HTTP 401, authentication_error) for POST "
        f"{base}/v1/messages: invalid x-api-key; check that ${KEY_ENV} (the row's api_key_env) "
        f"holds a key valid for {base}"
    )


async def test_missing_key_fails_before_any_request(
    llmock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    chunks = await run(llmock.base_url("anthropic"))
    _, failure = terminal_failure(chunks)
    assert failure.code == "MISSING_CREDENTIAL" and KEY_ENV in failure.message
    assert llmock.requests == []


async def test_thinking_budget_needs_room_and_refuses_a_temperature() -> None:
    with SseServer([]) as server:
        small = await run(server.url, reasoning_effort="low", max_tokens=1000)
        warm = await run(server.url, reasoning_effort="low", temperature=0.2)
    assert terminal_failure(small)[1].code == "UNSUPPORTED_REASONING_EFFORT"
    assert "max_tokens of at least 2048" in terminal_failure(small)[1].message
    assert terminal_failure(warm)[1].code == "INVALID_REQUEST"
    assert server.requests == []
