"""llm-openai-compatible against a real HTTP/1.1 SSE server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from dsh_host._cancel import CancelToken
from dsh_host._llm import BlockAssembler, assemble
from dsh_host._session import (
    LlmFailure,
    ReasoningBlock,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallsFinish,
)

from .llm_helpers import (
    KEY_ENV,
    PROVIDER,
    adapter_host,
    collect,
    finish_count,
    request,
    terminal_failure,
    user,
)
from .sse_server import (
    SseServer,
    http_error,
    raw,
    reasoning_events,
    sse,
    text_events,
    tool_call_events,
)

# both backends: HTTP over real sockets, timeouts, aborts
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]



@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, " sk-test-123 ")




def req(**kwargs: Any) -> Any:
    return request(PROVIDER, "deepseek-chat", **kwargs)


async def test_text_stream_end_to_end_with_request_shape() -> None:
    with SseServer([sse(text_events("Hel", "lo", usage={
        "prompt_tokens": 12, "completion_tokens": 2, "prompt_cache_hit_tokens": 8,
    }))]) as server:
        async with adapter_host(server.url) as host:
            result = await assemble(
                host.ctx.llm.stream(req(messages=[user("hi")], system="be brief", temperature=0))
            )
        assert result.blocks() == (TextBlock(text="Hello"),)
        assert result.finish == StopFinish()
        assert result.usage == TokenUsage(input_tokens=4, output_tokens=2, cache_read_tokens=8)
        [sent] = server.requests
        assert sent.path == "/chat/completions"
        assert sent.headers["authorization"] == "Bearer sk-test-123"
        assert sent.headers["accept"] == "text/event-stream"
        assert sent.headers["content-type"] == "application/json"
        assert sent.headers["user-agent"].startswith("dsh-python/")
        assert sent.body == {
            "model": "deepseek-chat",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }


async def test_reasoning_then_text() -> None:
    with SseServer([sse(reasoning_events(["Let me ", "think."], ["Answer", "!"]))]) as server:
        async with adapter_host(server.url) as host:
            result = await assemble(host.ctx.llm.stream(req(reasoning_effort="high")))
        assert result.blocks() == (ReasoningBlock(text="Let me think."), TextBlock(text="Answer!"))
        assert result.usage == TokenUsage(
            input_tokens=20, output_tokens=20, cache_read_tokens=30, reasoning_tokens=12
        )
        body = server.requests[0].body
        assert body["thinking"] == {"type": "enabled"} and body["reasoning_effort"] == "high"


async def test_tool_calls_split_across_many_deltas() -> None:
    first_args = json.dumps({"command": "echo 'hello world' | wc -c", "timeout": 30})
    second_args = json.dumps({"path": "notes/todo.md"})
    events = tool_call_events(
        [("call_a", "bash", first_args), ("call_b", "read_file", second_args)],
        fragment=1,
        text="Running two tools.",
        interleave=True,
    )
    assert len(events) > 60  # really one character per delta
    with SseServer([sse(events)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    assert assembler.blocks() == (
        TextBlock(text="Running two tools."),
        ToolCallBlock(id="call_a", name="bash", arguments=first_args),
        ToolCallBlock(id="call_b", name="read_file", arguments=second_args),
    )
    assert assembler.finish == ToolCallsFinish()
    assert json.loads(first_args) == {"command": "echo 'hello world' | wc -c", "timeout": 30}
    assert finish_count(chunks) == 1


async def test_stream_cut_before_done_is_stream_closed_after_the_delivered_deltas() -> None:
    events = text_events("par", "tial", done=False)[:-1]  # cut before the finish_reason
    with SseServer([sse(events)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    assert [c.text for c in chunks if isinstance(c, TextDeltaChunk)] == ["par", "tial"]
    kind, failure = terminal_failure(chunks)
    assert (kind, failure) == (
        "error",
        LlmFailure(
            message="127.0.0.1 SSE stream ended without [DONE] and before any finish_reason: "
            "the answer is incomplete",
            code="STREAM_CLOSED",
        ),
    )
    assert finish_count(chunks) == 1


async def test_transfer_cut_mid_body_is_transport() -> None:
    with SseServer([sse(text_events("par", done=False)[:2], close_early=True)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    kind, failure = terminal_failure(chunks)
    assert kind == "error" and failure.code == "TRANSPORT"
    assert failure.message == f"127.0.0.1 API stream from {server.url} failed"


async def test_malformed_json_is_malformed_response() -> None:
    events = [text_events("ok")[1], "{this is not json", "[DONE]"]
    with SseServer([sse(events)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    kind, failure = terminal_failure(chunks)
    assert kind == "error" and failure.code == "MALFORMED_RESPONSE"
    assert "{this is not json" in failure.message


async def test_429_with_retry_after_and_request_id() -> None:
    with SseServer([http_error(
        429, {"error": {"message": "slow down", "type": "rate_limit"}},
        headers={"retry-after": "2", "x-request-id": "req-429"},
    )]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
            policy = host.ctx.llm.retry_policy(PROVIDER)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure) == ("error", LlmFailure(
        message="slow down", code="RATE_LIMIT", status=429,
        provider_retry_after_ms=2000, request_id="req-429",
    ))
    assert policy.delay_ms(1, failure) == 2000


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        (401, {"error": {"message": "bad key"}}, "AUTH", "bad key"),
        (403, {"error": {"message": "forbidden"}}, "AUTH", "forbidden"),
        (400, {"error": {"message": "This model's maximum context length is 65536 tokens",
                         "code": "context_length_exceeded"}},
         "CONTEXT_WINDOW_EXCEEDED", "This model's maximum context length is 65536 tokens"),
        (400, {"error": {"message": "bad temperature"}}, "INVALID_REQUEST", "bad temperature"),
        (402, {"error": {"message": "Insufficient Balance"}}, "QUOTA", "Insufficient Balance"),
        (500, {"error": {"type": "x"}}, "SERVER", "127.0.0.1 API error (HTTP 500)"),
        (502, "Bad Gateway", "SERVER", "127.0.0.1 API error (HTTP 502)"),
        (418, "", "HTTP_418", "127.0.0.1 API error (HTTP 418)"),
    ],
)
async def test_http_errors_are_classified(
    status: int, body: Any, code: str, message: str
) -> None:
    content_type = "application/json" if isinstance(body, dict) else "text/plain"
    with SseServer([http_error(status, body, content_type=content_type)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    kind, failure = terminal_failure(chunks)
    if code == "AUTH":  # the provider's message, where it went, and which variable to check
        message = (
            f"127.0.0.1 API refused the credential (HTTP {status}) for POST "
            f"{server.url}/chat/completions: {message}; check that ${KEY_ENV} (the row's "
            f"api_key_env) holds a key valid for {server.url}"
            + (" and allowed to use this model" if status == 403 else "")
        )
    assert (kind, failure) == ("error", LlmFailure(message=message, code=code, status=status))


async def test_connection_refused_is_transport() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # the port is closed again: nothing listens there
    async with adapter_host(f"http://127.0.0.1:{port}") as host:
        chunks = await collect(host.ctx.llm.stream(req()))
    kind, failure = terminal_failure(chunks)
    assert kind == "error" and failure.code == "TRANSPORT"
    assert failure.message == (
        f"127.0.0.1 API request to http://127.0.0.1:{port} failed: connection refused (nothing "
        "listens there; start the server or fix the port in base_url)"
    )


async def test_abort_mid_stream_is_aborted_and_the_connection_is_dropped() -> None:
    with SseServer([sse(text_events("first")[:2], hang=True)]) as server:
        async with adapter_host(server.url) as host:
            token = CancelToken()
            chunks: list[StreamChunk] = []

            first_delta = anyio.Event()

            async def pull() -> None:
                async with aclosing(host.ctx.llm.stream(req(signal=token))) as stream:
                    async for chunk in stream:
                        chunks.append(chunk)
                        if isinstance(chunk, TextDeltaChunk):
                            first_delta.set()

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pull)
                    await first_delta.wait()
                    # let the adapter block on the next read of the hanging response
                    await anyio.wait_all_tasks_blocked()
                    token.abort("user pressed ctrl-c")
            # the adapter closed the response itself: the host (and its client) is still up
            assert await anyio.to_thread.run_sync(server.wait_disconnect)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code) == ("aborted", "ABORTED")
    assert [type(c).__name__ for c in chunks] == ["BlockStartChunk", "TextDeltaChunk", "FinishChunk"]


async def test_consumer_early_close_drops_the_connection() -> None:
    with SseServer([sse(text_events("first")[:2], hang=True)]) as server:
        async with adapter_host(server.url) as host:
            with anyio.fail_after(20):
                async with aclosing(host.ctx.llm.stream(req())) as stream:
                    async for chunk in stream:
                        if isinstance(chunk, TextDeltaChunk):
                            break
            # the adapter closed the response itself: the host (and its client) is still up
            assert await anyio.to_thread.run_sync(server.wait_disconnect)


async def test_abort_before_the_request_sends_nothing() -> None:
    token = CancelToken()
    token.abort("early")
    with SseServer([sse(text_events("x"))]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req(signal=token)))
    assert terminal_failure(chunks)[0] == "aborted"
    assert server.requests == []


async def test_idle_stream_times_out() -> None:
    with SseServer([sse(text_events("slow")[:2], hang=True)]) as server:
        async with adapter_host(server.url, stream_idle_timeout_ms=300) as host:
            with anyio.fail_after(20):
                chunks = await collect(host.ctx.llm.stream(req()))
    kind, failure = terminal_failure(chunks)
    assert (kind, failure) == (
        "error", LlmFailure(message="127.0.0.1 stream idle timeout after 300ms", code="TIMEOUT")
    )


async def test_missing_and_blank_keys_fail_without_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SseServer([]) as server:
        async with adapter_host(server.url) as host:
            monkeypatch.delenv(KEY_ENV)
            _, missing = terminal_failure(await collect(host.ctx.llm.stream(req())))
            monkeypatch.setenv(KEY_ENV, "   ")
            _, blank = terminal_failure(await collect(host.ctx.llm.stream(req())))
    assert missing.code == "MISSING_CREDENTIAL" and KEY_ENV in missing.message
    assert blank.code == "INVALID_CREDENTIAL"
    assert server.requests == []


async def test_no_key_configured_sends_no_authorization() -> None:
    with SseServer([sse(text_events("x"))]) as server:
        async with adapter_host(server.url, api_key_env=None, headers={"X-Gateway": "g1"}) as host:
            await collect(host.ctx.llm.stream(req()))
    headers = server.requests[0].headers
    assert "authorization" not in headers and headers["x-gateway"] == "g1"


async def test_raw_framing_crlf_comments_and_arbitrary_splits() -> None:
    body = (
        ": keep-alive\r\n\r\n"
        + "".join(f"data: {event}\r\n\r\n" for event in text_events("a", "b"))
    ).encode()
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)]
    with SseServer([raw(pieces)]) as server:
        async with adapter_host(server.url) as host:
            result = await assemble(host.ctx.llm.stream(req()))
    assert result.blocks() == (TextBlock(text="ab"),)


async def test_empty_completion_is_empty_response() -> None:
    events = text_events(usage={"prompt_tokens": 1, "completion_tokens": 0})
    with SseServer([sse(events)]) as server:
        async with adapter_host(server.url) as host:
            chunks = await collect(host.ctx.llm.stream(req()))
    assert terminal_failure(chunks)[1].code == "EMPTY_RESPONSE"


async def test_the_client_is_reused_across_requests_and_closed_on_unload() -> None:
    """One client per adapter: both requests ride one kept-alive connection, which unloading
    the adapter closes (a client per request would open two; a client never closed would leave
    the connection open)."""
    with SseServer([sse(text_events("one")), sse(text_events("two"))]) as server:
        async with adapter_host(server.url) as host:
            first = await assemble(host.ctx.llm.stream(req()))
            second = await assemble(host.ctx.llm.stream(req()))
            peers = [r.peer for r in server.requests]
            assert len(peers) == 2
            assert peers[0] == peers[1], "the second request opened a new connection"
            assert peers[0] not in server.ended_peers
            await host.unload("model")
            assert not host.ctx.llm.has_provider(PROVIDER)
            assert await anyio.to_thread.run_sync(server.wait_connection_ended, peers[0]), (
                "unloading the adapter left its connection open"
            )
    assert [r.blocks() for r in (first, second)] == [
        (TextBlock(text="one"),), (TextBlock(text="two"),)
    ]
