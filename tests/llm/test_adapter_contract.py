"""The adapter contract: what every provider plugin must do, run against each of them.

Parametrised over :data:`provider_wires.WIRES` (the OpenAI-compatible chat adapter, the
Anthropic Messages one and the OpenAI Responses one), each over real HTTP on 127.0.0.1 and on both anyio backends: text, tool calls
(single, parallel, arguments streamed in fragments), reasoning, usage, each error class with
its stable code, a retry by ``llm-retry`` through the agent loop, and cancellation mid-stream.
Two tests also run each adapter against LLMock, an independent implementation of both APIs.

A new provider plugin passes this file by adding its :class:`~provider_wires.Wire`; what is
specific to one provider (its request shape, its own features) stays in that provider's file.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from llmock.scenarios import Reply, ToolCall

from dsh_host import Agent, PluginHost, Row, open_host
from dsh_host._cancel import CancelToken
from dsh_host._llm import BlockAssembler
from dsh_host._session import (
    CompletedReason,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
)

from .llm_helpers import collect, finish_count, request, terminal_failure
from .provider_wires import WIRES, Wire
from .sse_server import SseServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

KEY_ENV = "DSH_TEST_CONTRACT_KEY"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=WIRES, ids=[wire.id for wire in WIRES])
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Wire:
    monkeypatch.setenv(KEY_ENV, "contract-key")
    value: Wire = request.param
    return value


@asynccontextmanager
async def adapter(wire: Wire, base_url: str, **config: Any) -> AsyncIterator[PluginHost]:
    row = {**wire.row_config(base_url, KEY_ENV), **config}
    async with open_host([Row(name="llm"), Row(id="model", name=wire.plugin, config=row)]) as host:
        yield host


async def run(wire: Wire, base_url: str, **config: Any) -> list[StreamChunk]:
    async with adapter(wire, base_url, **config) as host:
        return await collect(host.ctx.llm.stream(request(wire.provider, wire.model)))


def assembled(chunks: list[StreamChunk]) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


# -- answers ---------------------------------------------------------------------------------


async def test_text_streams_live_and_assembles(wire: Wire) -> None:
    with SseServer([wire.text(["Hel", "lo ", "world"], usage=(12, 3, 0))]) as server:
        chunks = await run(wire, server.url)
    assert [c.text for c in chunks if isinstance(c, TextDeltaChunk)] == ["Hel", "lo ", "world"]
    result = assembled(chunks)
    assert result.blocks() == (TextBlock(text="Hello world"),)
    assert result.finish == StopFinish()
    assert finish_count(chunks) == 1


async def test_usage_is_disjoint_with_cache_reads(wire: Wire) -> None:
    with SseServer([wire.text(["ok"], usage=(12, 3, 40))]) as server:
        chunks = await run(wire, server.url)
    usage = assembled(chunks).usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (12, 3, 40)


@pytest.mark.parametrize("fragment", [1, 7])
async def test_a_single_tool_call_with_arguments_streamed_in_fragments(
    wire: Wire, fragment: int
) -> None:
    arguments = json.dumps({"command": "echo 'héllo wörld' | wc -c", "timeout": 30})
    with SseServer([wire.tool_calls([("bash", arguments)], fragment=fragment)]) as server:
        chunks = await run(wire, server.url)
    result = assembled(chunks)
    [call] = result.blocks()
    assert isinstance(call, ToolCallBlock)
    assert (call.name, call.arguments) == ("bash", arguments) and call.id
    assert result.finish == ToolCallsFinish()
    deltas = [c for c in chunks if isinstance(c, ToolCallDeltaChunk) and c.arguments_delta]
    assert len(deltas) >= len(arguments) // fragment  # streamed, not delivered at the end


async def test_parallel_tool_calls_stay_apart(wire: Wire) -> None:
    calls = [("read_file", '{"path": "a.txt"}'), ("bash", '{"command": "ls"}'),
             ("grep", '{"pattern": "x"}')]
    with SseServer([wire.tool_calls(calls, fragment=4)]) as server:
        chunks = await run(wire, server.url)
    blocks = assembled(chunks).blocks()
    assert [(b.name, b.arguments) for b in blocks] == calls  # type: ignore[union-attr]
    ids = [b.id for b in blocks]  # type: ignore[union-attr]
    assert all(ids) and len(set(ids)) == 3


async def test_reasoning_streams_live_then_the_answer(wire: Wire) -> None:
    with SseServer([wire.reasoning(["Let me ", "think."], ["Answer", "!"])]) as server:
        chunks = await run(wire, server.url)
    assert [c.text for c in chunks if isinstance(c, ReasoningDeltaChunk)] == ["Let me ", "think."]
    assert assembled(chunks).blocks() == (
        ReasoningBlock(text="Let me think."), TextBlock(text="Answer!"),
    )


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "retry_after", "retryable"),
    [
        ("AUTH", None, False),
        ("RATE_LIMIT", "2", True),
        ("SERVER", None, True),
        ("CONTEXT_WINDOW_EXCEEDED", None, False),
        ("MODEL_NOT_FOUND", None, False),
        ("INVALID_REQUEST", None, False),
    ],
)
async def test_each_provider_error_has_its_stable_code(
    wire: Wire, code: str, retry_after: str | None, retryable: bool
) -> None:
    with SseServer([wire.error(code, "the provider's words", retry_after)]) as server:
        async with adapter(wire, server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request(wire.provider, wire.model)))
            policy = host.ctx.llm.retry_policy(wire.provider)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code) == ("error", code)
    assert "the provider's words" in failure.message
    assert isinstance(failure.status, int)
    if retry_after is not None:
        assert failure.provider_retry_after_ms == int(retry_after) * 1000
    assert (policy.delay_ms(1, failure) is not None) == retryable


async def test_a_retry_after_beyond_the_policy_cap_is_kept_and_explained(wire: Wire) -> None:
    """Every adapter's status errors end in one place that keeps the provider's Retry-After
    and says why dsh will not wait that long (the default cap is 10 s)."""
    with SseServer([wire.error("RATE_LIMIT", "the provider's words", "30")]) as server:
        chunks = await run(wire, server.url)
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.provider_retry_after_ms) == ("RATE_LIMIT", 30_000)
    assert "the provider's words" in failure.message
    assert "longer than this route's retry_policy.backoff.max_delay_ms" in failure.message


async def test_a_completed_answer_without_content_is_empty_response(wire: Wire) -> None:
    """A normal stop with no block is no answer: ``EMPTY_RESPONSE``, which the route retries."""
    with SseServer([wire.empty()]) as server:
        async with adapter(wire, server.url) as host:
            chunks = await collect(host.ctx.llm.stream(request(wire.provider, wire.model)))
            policy = host.ctx.llm.retry_policy(wire.provider)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code) == ("error", "EMPTY_RESPONSE")
    assert policy.delay_ms(1, failure) is not None


async def test_refused_connection_is_transport_and_names_the_cause(wire: Wire) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    chunks = await run(wire, f"http://127.0.0.1:{port}")
    _, failure = terminal_failure(chunks)
    assert failure.code == "TRANSPORT" and "connection refused" in failure.message


async def test_a_body_cut_mid_transfer_is_transport_after_the_delivered_text(wire: Wire) -> None:
    with SseServer([wire.cut(["par", "tial"])]) as server:
        chunks = await run(wire, server.url)
    assert "".join(c.text for c in chunks if isinstance(c, TextDeltaChunk)) == "partial"
    assert terminal_failure(chunks)[1].code == "TRANSPORT"


async def test_a_clean_end_before_the_answer_is_complete_is_stream_closed(wire: Wire) -> None:
    with SseServer([wire.early_end(["par", "tial"])]) as server:
        chunks = await run(wire, server.url)
    assert terminal_failure(chunks)[1].code == "STREAM_CLOSED"


async def test_silence_beyond_the_idle_timeout_is_timeout(wire: Wire) -> None:
    with SseServer([wire.hang(["slow"])]) as server:
        with anyio.fail_after(30):
            chunks = await run(wire, server.url, stream_idle_timeout_ms=300)
    assert terminal_failure(chunks)[1].code == "TIMEOUT"


async def test_a_payload_that_is_not_json_is_malformed_response(wire: Wire) -> None:
    with SseServer([wire.malformed()]) as server:
        chunks = await run(wire, server.url)
    assert terminal_failure(chunks)[1].code == "MALFORMED_RESPONSE"


async def test_missing_key_fails_before_any_request(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with SseServer([wire.text(["x"], usage=(1, 1, 0))]) as server:
        chunks = await run(wire, server.url)
        assert server.requests == []
    _, failure = terminal_failure(chunks)
    assert failure.code == "MISSING_CREDENTIAL" and KEY_ENV in failure.message


# -- retry and cancellation ------------------------------------------------------------------


async def test_a_transient_failure_is_retried_by_llm_retry_through_the_loop(
    wire: Wire, tmp_path: Path
) -> None:
    """The adapter makes one request per model request; the shipped composition's llm-retry
    row retries the SERVER failure, logs it, and the turn completes on the second request."""
    with SseServer([wire.error("SERVER", "busy"), wire.text(["Recovered."], usage=(1, 1, 0))]
                   ) as server:
        async with Agent(
            f"{wire.id}:{wire.model}",
            store=None,
            composition=REPO / "configs" / "default.yml",
            config={"model": wire.row_config(server.url, KEY_ENV)},
        ) as agent:
            result = await agent.run("hi")
            events = [event.type for event in agent.session.events]
        assert len(server.requests) == 2
    assert result.turn_end == CompletedReason() and result.output == "Recovered."
    assert events.count("llm/retry") == 1 and events.count("llm/retry-started") == 1


async def test_abort_mid_stream_ends_aborted_and_drops_the_connection(wire: Wire) -> None:
    with SseServer([wire.hang(["first"])]) as server:
        async with adapter(wire, server.url) as host:
            token = CancelToken()
            chunks: list[StreamChunk] = []
            first_delta = anyio.Event()

            async def pull() -> None:
                stream = host.ctx.llm.stream(request(wire.provider, wire.model, signal=token))
                async with aclosing(stream) as items:
                    async for chunk in items:
                        chunks.append(chunk)
                        if isinstance(chunk, TextDeltaChunk):
                            first_delta.set()

            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(pull)
                    await first_delta.wait()
                    await anyio.wait_all_tasks_blocked()
                    token.abort("user pressed ctrl-c")
            assert await anyio.to_thread.run_sync(server.wait_disconnect)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code) == ("aborted", "ABORTED")
    assert [c.text for c in chunks if isinstance(c, TextDeltaChunk)] == ["first"]
    assert finish_count(chunks) == 1


# -- against an independent server ----------------------------------------------------------


def llmock_base(llmock: Any, wire: Wire) -> str:
    return str(llmock.base_url("anthropic" if wire.id == "anthropic" else "openai"))


async def test_llmock_parallel_tool_calls(wire: Wire, llmock: Any) -> None:
    llmock.add(Reply(tool_calls=(ToolCall("read_file", {"path": "a.txt"}),
                                 ToolCall("bash", {"command": "ls -la /tmp"}))))
    chunks = await run(wire, llmock_base(llmock, wire))
    blocks = assembled(chunks).blocks()
    calls = [(b.name, json.loads(b.arguments)) for b in blocks if isinstance(b, ToolCallBlock)]
    assert calls == [("read_file", {"path": "a.txt"}), ("bash", {"command": "ls -la /tmp"})]
    assert assembled(chunks).finish == ToolCallsFinish()
    assert llmock.last_request.stream is True


async def test_llmock_truncated_stream_is_never_a_complete_answer(
    wire: Wire, llmock: Any
) -> None:
    """LLMock's truncate fault: a clean end with no finish; 'many clients accept it'."""
    llmock.reply("a long enough answer to be cut somewhere in the middle")
    llmock.truncate(after_chunks=3)
    chunks = await run(wire, llmock_base(llmock, wire))
    assert terminal_failure(chunks)[1].code == "STREAM_CLOSED"


async def test_one_connection_carries_consecutive_requests_and_unloading_closes_it(
    wire: Wire,
) -> None:
    """One client per row, and each answer read to the end of its body: both requests ride
    one kept-alive connection, which unloading the row closes."""
    with SseServer([wire.text(["one"], usage=(1, 1, 0)), wire.text(["two"], usage=(1, 1, 0))]
                   ) as server:
        async with adapter(wire, server.url) as host:
            for _ in range(2):
                await collect(host.ctx.llm.stream(request(wire.provider, wire.model)))
            first, second = (r.peer for r in server.requests)
            assert first == second, "the second request opened a new connection"
            await host.unload("model")
            assert await anyio.to_thread.run_sync(server.wait_connection_ended, first), (
                "unloading the adapter left its connection open"
            )
