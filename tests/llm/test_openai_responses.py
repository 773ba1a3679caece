"""llm-openai-responses over real HTTP on 127.0.0.1: Responses streams served by the loopback
server (shaped by tests/llm/provider_wires.py as the API documents them) and LLMock's
``/v1/responses`` with its journal. What every adapter does is in test_adapter_contract.py;
this file holds what is the Responses API's: the request shape, encrypted reasoning carried
across turns with ``store: false``, incomplete answers, failures reported inside the stream,
and the SDK's own retries being off."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from llmock.scenarios import Fail

from dsh_host import Agent, PluginHost, Row, open_host
from dsh_host._jsonsafe import thaw_json
from dsh_host._llm import BlockAssembler
from dsh_host._session import (
    AssistantMessage,
    CompletedReason,
    MaxTokensFinish,
    ModelSource,
    ReasoningBlock,
    StreamChunk,
    TextBlock,
    ToolCallBlock,
)
from dsh_host._session.messages import ToolResultBlock, UserMessage, UserSource, new_message_id

from .llm_helpers import collect, request, terminal_failure, user
from .provider_wires import ResponsesWire
from .sse_server import Behavior, SseServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

KEY_ENV = "DSH_TEST_OPENAI_RESPONSES_KEY"
MODEL = "gpt-5-mini"
WIRE = ResponsesWire("openai-responses", "llm-openai-responses", "openai", MODEL)


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-responses")


@asynccontextmanager
async def responses_host(base_url: str, **config: Any) -> AsyncIterator[PluginHost]:
    row = {"base_url": base_url, "api_key_env": KEY_ENV, **config}
    async with open_host(
        [Row(name="llm"), Row(id="model", name="llm-openai-responses", config=row)]
    ) as host:
        yield host


async def run(base_url: str, **kwargs: Any) -> list[StreamChunk]:
    async with responses_host(base_url) as host:
        return await collect(host.ctx.llm.stream(request("openai", MODEL, **kwargs)))


def assembled(chunks: list[StreamChunk]) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


async def test_the_request_it_sends() -> None:
    call = AssistantMessage(
        id=new_message_id(),
        content=(TextBlock(text="Reading."),
                 ToolCallBlock(id="call_1", name="read_file", arguments='{"path": "a"}')),
        source=ModelSource(provider="openai", model=MODEL),
    )
    result = UserMessage(
        id=new_message_id(),
        content=(ToolResultBlock(tool_call_id="call_1", content=(TextBlock(text="body"),)),),
        source=UserSource(),
    )
    with SseServer([WIRE.text(["ok"], usage=(1, 1, 0))]) as server:
        await run(server.url, messages=[user("read a"), call, result], system="be brief",
                  temperature=0.5, max_tokens=300)
    [sent] = server.requests
    assert sent.path == "/responses"
    assert sent.headers["authorization"] == "Bearer sk-test-responses"
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.body == {
        "model": MODEL,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "read a"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
            {"type": "function_call", "call_id": "call_1", "name": "read_file",
             "arguments": '{"path": "a"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "body"},
        ],
        "store": False,  # the session log is the state, not the provider
        "instructions": "be brief",
        "max_output_tokens": 300,
        "temperature": 0.5,
        "stream": True,
    }


async def test_encrypted_reasoning_is_kept_and_carried_to_the_next_turn() -> None:
    with SseServer([WIRE.reasoning(["Think", "ing."], ["Done."]),
                    WIRE.text(["ok"], usage=(1, 1, 0))]) as server:
        async with responses_host(server.url) as host:
            first = request("openai", MODEL, reasoning_effort="high", messages=[user("q")])
            result = assembled(await collect(host.ctx.llm.stream(first)))
            message = result.message(provider="openai", model=MODEL)
            follow = request("openai", MODEL, reasoning_effort="high",
                             messages=[user("q"), message, user("more")])
            await collect(host.ctx.llm.stream(follow))
    assert message.content == (ReasoningBlock(text="Thinking."), TextBlock(text="Done."))
    assert thaw_json(message.source.replay_state)["blocks"] == [
        {"id": "rs_0", "encrypted_content": "gAAAA-contract"}, None,
    ]
    first_body, second_body = (r.body for r in server.requests)
    assert first_body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert first_body["include"] == ["reasoning.encrypted_content"]
    assert second_body["input"][1] == {
        "type": "reasoning", "id": "rs_0", "encrypted_content": "gAAAA-contract",
        "summary": [{"type": "summary_text", "text": "Thinking."}],
    }


async def test_an_incomplete_answer_is_max_tokens() -> None:
    pieces = WIRE._stream([WIRE._message(0, ["cut sh"])], (5, 300, 0), status="incomplete")
    with SseServer([Behavior(pieces=pieces)]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.finish == MaxTokensFinish()
    assert result.blocks() == (TextBlock(text="cut sh"),)


async def test_a_failure_inside_the_stream_is_classified() -> None:
    failed = {"type": "response.failed", "sequence_number": 1, "response": {
        "id": "resp_1", "status": "failed",
        "error": {"code": "server_error", "message": "The server had an error"}}}
    pieces = [b'event: response.created\ndata: {"type": "response.created", '
              b'"sequence_number": 0, "response": {"id": "resp_1", "status": "in_progress"}}\n\n',
              f"event: response.failed\ndata: {json.dumps(failed)}\n\n".encode()]
    with SseServer([Behavior(pieces=pieces)]) as server:
        chunks = await run(server.url)
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.message) == ("SERVER", "The server had an error")


async def test_stop_sequences_are_refused_before_any_request() -> None:
    with SseServer([]) as server:
        chunks = await run(server.url, stop=["END"])
    assert terminal_failure(chunks)[1].code == "INVALID_REQUEST"
    assert server.requests == []


async def test_the_sdk_does_not_retry_on_its_own(llmock: Any) -> None:
    llmock.add(Fail(500, message="upstream broke"))
    llmock.reply("never reached by a hidden retry")
    chunks = await run(llmock.base_url("openai"))
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.status) == ("SERVER", 500)
    assert len(llmock.requests) == 1


async def test_agent_with_an_openai_responses_model(llmock: Any) -> None:
    llmock.reply("Responses answer.")
    async with Agent(f"openai-responses:{MODEL}", store=None,
                     config={"model": {"api_key_env": KEY_ENV}}) as agent:
        result = await agent.run("hi")
    assert (result.output, result.turn_end) == ("Responses answer.", CompletedReason())
    assert llmock.last_request.path == "/v1/responses"
