"""llm-openai-compatible against what real servers send, not what the API reference says they send.

Each quirk is served over real HTTP on 127.0.0.1: by the suite's loopback SSE server for the
byte-exact ones, and by LLMock (an independent mock of the providers' APIs, with a journal of
every request) for the error answers it can produce itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from llmock.scenarios import Fail

from dsh_host._llm import BlockAssembler
from dsh_host._session import (
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
)
from .sse_server import SseServer, http_error, sse, text_events

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]



@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")




async def run(base_url: str, model: str = "deepseek-chat") -> list[StreamChunk]:
    async with adapter_host(base_url) as host:
        return await collect(host.ctx.llm.stream(request(PROVIDER, model)))


def assembled(chunks: list[StreamChunk]) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    """One chat.completion.chunk payload, JSON-escaped as servers send it (ASCII only)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [choice], **extra})


def call(arguments: Any, *, index: int | None = None, id: str | None = None,
         name: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    element: dict[str, Any] = {"type": "function", "function": function}
    if index is not None:
        element["index"] = index
    if id is not None:
        element["id"] = id
    return element


END = [chunk({}, "tool_calls", usage={"prompt_tokens": 9, "completion_tokens": 4}), "[DONE]"]


# -- tool calls without a usable index -------------------------------------------------------


async def test_two_calls_that_both_say_index_0_stay_two_calls() -> None:
    """Seen from gateways that number every call 0: the second id starts a second call."""
    events = [
        chunk({"tool_calls": [call("", index=0, id="call_a", name="read_file")]}),
        chunk({"tool_calls": [call('{"path": "a.txt"}', index=0)]}),
        chunk({"tool_calls": [call("", index=0, id="call_b", name="bash")]}),
        chunk({"tool_calls": [call('{"command": "ls"}', index=0)]}),
        *END,
    ]
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.blocks() == (
        ToolCallBlock(id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCallBlock(id="call_b", name="bash", arguments='{"command": "ls"}'),
    )
    assert result.finish == ToolCallsFinish()


async def test_calls_without_any_index_are_told_apart_by_id_then_by_order() -> None:
    """No index at all: the id keys the call; id-less fragments continue the last call, and
    whole id-less calls (one per element, as Ollama-style servers send them) stay apart."""
    events = [
        chunk({"tool_calls": [call('{"pa', id="call_a", name="read_file")]}),
        chunk({"tool_calls": [call('th": "a.txt"}')]}),
        chunk({"tool_calls": [call('{"command": "ls"}', id="call_b", name="bash")]}),
        chunk({"tool_calls": [call('{"q": 1}', name="grep"), call('{"q": 2}', name="grep")]}),
        chunk({"tool_calls": [call('{"x": 3}', name="glob")]}),
        *END,
    ]
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    assert assembled(chunks).blocks() == (
        ToolCallBlock(id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCallBlock(id="call_b", name="bash", arguments='{"command": "ls"}'),
        ToolCallBlock(id="", name="grep", arguments='{"q": 1}'),
        ToolCallBlock(id="", name="grep", arguments='{"q": 2}'),
        ToolCallBlock(id="", name="glob", arguments='{"x": 3}'),
    )


async def test_duplicate_ids_on_distinct_indexes_are_reported_as_sent() -> None:
    """Call identity is the harness's business: the adapter reports both calls, ids as sent."""
    events = [
        chunk({"tool_calls": [call('{"n": 1}', index=0, id="dup", name="echo")]}),
        chunk({"tool_calls": [call('{"n": 2}', index=1, id="dup", name="echo")]}),
        *END,
    ]
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    assert assembled(chunks).blocks() == (
        ToolCallBlock(id="dup", name="echo", arguments='{"n": 1}'),
        ToolCallBlock(id="dup", name="echo", arguments='{"n": 2}'),
    )


async def test_arguments_sent_as_a_json_object_reach_the_tool_as_that_object() -> None:
    arguments = {"path": "notes/todo.md", "limit": 20, "nested": {"ok": True}}
    events = [chunk({"tool_calls": [call(arguments, index=0, id="call_a", name="read_file")]}),
              *END]
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    [block] = assembled(chunks).blocks()
    assert isinstance(block, ToolCallBlock)
    assert json.loads(block.arguments) == arguments


# -- the end of the answer -------------------------------------------------------------------


async def test_finish_reason_and_usage_without_done_is_a_complete_answer() -> None:
    """The OpenAI SDK accepts a body that ends cleanly after the finish; so does the adapter."""
    with SseServer([sse(text_events("Hel", "lo", done=False))]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.blocks() == (TextBlock(text="Hello"),)
    assert result.finish == StopFinish()
    assert result.usage == TokenUsage(input_tokens=3, output_tokens=1)
    assert finish_count(chunks) == 1


async def test_a_plain_json_completion_instead_of_a_stream_is_accepted() -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [{"id": "call_a", "type": "function", "function": {
                    "name": "read_file", "arguments": '{"path": "a.txt"}'}}],
            },
            "finish_reason": "tool_calls",
        }],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7},
    }
    with SseServer([http_error(200, completion)]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.blocks() == (
        TextBlock(text="Reading it."),
        ToolCallBlock(id="call_a", name="read_file", arguments='{"path": "a.txt"}'),
    )
    assert result.finish == ToolCallsFinish()
    assert result.usage == TokenUsage(input_tokens=20, output_tokens=7)


async def test_an_html_page_with_200_is_reported_with_its_content_type_and_first_bytes() -> None:
    page = "<!DOCTYPE html><html><body>Please sign in to the proxy</body></html>"
    with SseServer([http_error(200, page, content_type="text/html; charset=utf-8")]) as server:
        chunks = await run(server.url)
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code, failure.status) == ("error", "MALFORMED_RESPONSE", 200)
    assert "content-type text/html instead of an event stream" in failure.message
    assert "<!DOCTYPE html><html><body>Please sign in" in failure.message
    assert f"POST {server.url}/chat/completions" in failure.message
    assert "Check base_url" in failure.message


# -- text split inside a character -----------------------------------------------------------


async def test_a_surrogate_pair_split_across_two_deltas_is_one_character() -> None:
    events = [
        chunk({"role": "assistant", "content": "smile "}),
        chunk({"content": "\ud83d"}),  # json.dumps escapes each half: "\\ud83d"
        chunk({"content": "\ude00!"}),
        chunk({"tool_calls": [call('{"s": "\ud83d', index=0, id="c", name="echo")]}),
        chunk({"tool_calls": [call('\ude80"}', index=0)]}),
        chunk({}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 3}),
        "[DONE]",
    ]
    assert "\\ud83d" in events[1]  # really split on the wire
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    result = assembled(chunks)
    assert result.finish == StopFinish()
    assert result.blocks() == (
        TextBlock(text="smile \U0001f600!"),
        ToolCallBlock(id="c", name="echo", arguments='{"s": "\U0001f680"}'),
    )
    # what was streamed live is what the block says, and every delta is valid UTF-8
    live = "".join(c.text for c in chunks if isinstance(c, TextDeltaChunk))
    assert live == "smile \U0001f600!"
    live.encode("utf-8")


async def test_a_surrogate_half_that_never_finds_its_partner_becomes_a_replacement_char() -> None:
    events = [chunk({"content": "cut \ud83d"}), chunk({"content": "\ud83d end"}),
              chunk({}, "stop"), "[DONE]"]
    with SseServer([sse(events)]) as server:
        chunks = await run(server.url)
    assert assembled(chunks).blocks() == (TextBlock(text="cut \ufffd\ufffd end"),)


# -- error lines that point the right way (LLMock answers) -------------------------------------


async def test_unknown_model_404_says_the_model_is_unknown(llmock: Any) -> None:
    llmock.add(Fail(404, message="The model `gpt-9` does not exist", code="model_not_found"))
    chunks = await run(llmock.base_url("openai"), model="gpt-9")
    kind, failure = terminal_failure(chunks)
    assert (kind, failure.code, failure.status) == ("error", "MODEL_NOT_FOUND", 404)
    assert failure.message.startswith("127.0.0.1 API does not serve the requested model")
    assert "The model `gpt-9` does not exist" in failure.message
    assert "check base_url" not in failure.message
    assert llmock.last_request.model == "gpt-9"


async def test_a_404_that_names_no_model_still_points_at_base_url() -> None:
    with SseServer([http_error(404, "Not Found", content_type="text/plain")]) as server:
        chunks = await run(server.url)
    _, failure = terminal_failure(chunks)
    assert failure.code == "HTTP_404" and "check base_url" in failure.message


async def test_a_declined_retry_after_is_explained(llmock: Any) -> None:
    llmock.rate_limit(retry_after=30)
    chunks = await run(llmock.base_url("openai"))
    _, failure = terminal_failure(chunks)
    assert (failure.code, failure.provider_retry_after_ms) == ("RATE_LIMIT", 30_000)
    assert (
        "the server asked to wait 30s before retrying (Retry-After), longer than this route's "
        "retry_policy.backoff.max_delay_ms (10000ms), so dsh does not retry" in failure.message
    )
    assert "raise max_delay_ms to at least 30000" in failure.message


async def test_a_retry_after_within_the_cap_is_not_called_declined(llmock: Any) -> None:
    llmock.rate_limit(retry_after=2)
    chunks = await run(llmock.base_url("openai"))
    _, failure = terminal_failure(chunks)
    assert failure.code == "RATE_LIMIT" and "Retry-After" not in failure.message


async def test_auth_names_the_provider_code_the_variable_and_the_endpoint(llmock: Any) -> None:
    llmock.fail(401, message="Incorrect API key provided")
    chunks = await run(llmock.base_url("openai"))
    _, failure = terminal_failure(chunks)
    base = llmock.base_url("openai")
    assert (failure.code, failure.status) == ("AUTH", 401)
    assert failure.message == (
        f"127.0.0.1 API refused the credential (HTTP 401, invalid_api_key) for POST "
        f"{base}/chat/completions: Incorrect API key provided; check that ${KEY_ENV} (the row's "
        f"api_key_env) holds a key valid for {base}"
    )
