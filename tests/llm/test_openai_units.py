"""llm-openai-compatible pieces without the network: SSE framing, translation, serialization."""

from __future__ import annotations

import email.utils
import json

import pytest
from dsh_llm_openai_compatible import (
    ChunkTranslator,
    LlmOpenAICompatibleConfig,
    SseDecoder,
    map_finish_reason,
    map_usage,
    serialize_request,
)
from dsh_llm_openai_compatible import settings_of as settings_of_config
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host._llm import BlockAssembler, LlmError, RetryPolicyConfig
from dsh_host._llm.wire import (
    check_api_key,
    http_error_code,
    parse_retry_after_ms,
    request_id_of,
    user_agent,
)
from dsh_host._session import (
    AssistantMessage,
    BlockEndChunk,
    BlockStartChunk,
    ErrorFinish,
    FinishChunk,
    LlmFailure,
    MaxTokensFinish,
    ModelSource,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StopFinish,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    ToolSchema,
    UsageChunk,
)
from dsh_host._session.messages import (
    ToolResultBlock,
    ToolResultMessage,
    ToolSource,
    UserMessage,
    UserSource,
)
from dsh_host.errors import ConfigError

from .llm_helpers import request, user

# -- SSE framing ---------------------------------------------------------------------------


def decode_all(pieces: list[bytes]) -> list[str]:
    decoder = SseDecoder()
    out: list[str] = []
    for piece in pieces:
        out += decoder.feed(piece)
    out += decoder.close()
    return out


def test_sse_basic_fields_comments_and_multiline_data() -> None:
    stream = (
        b": keep-alive\n"
        b"event: message\nid: 7\nretry: 100\ndata: first\n\n"
        b"data:no-space\n\n"
        b"data: line one\ndata: line two\n\n"
        b"data\n\n"
        b"unknown: ignored\n\n"
        b"data: [DONE]\n\n"
    )
    assert decode_all([stream]) == ["first", "no-space", "line one\nline two", "", "[DONE]"]


def test_sse_line_endings_bom_and_split_utf8() -> None:
    text = "\ufeffdata: h\u00e9llo \u4e16\u754c\r\n\r\ndata: cr\r\rdata: tail-without-blank-line"
    data = text.encode()
    pieces = [data[i:i + 1] for i in range(len(data))]  # every byte on its own
    assert decode_all(pieces) == ["h\u00e9llo \u4e16\u754c", "cr"]


def test_sse_cr_split_from_its_lf_is_one_line_end() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == []
    assert decoder.feed(b"\n") == ["a"]
    assert decoder.close() == []


_EVENT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_EVENT, max_size=6),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.data(),
)
def test_sse_any_split_any_line_ending_gives_the_same_events(
    events: list[str], newline: str, data: st.DataObject
) -> None:
    body = "".join(f"data: {event}{newline}{newline}" for event in events).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert decode_all(pieces) == events


# -- translation ---------------------------------------------------------------------------


def payload(delta: dict[str, object], finish: str | None = None, **extra: object) -> str:
    choice: dict[str, object] = {"index": 0, "delta": delta}
    if finish is not None:
        choice["finish_reason"] = finish
    return json.dumps({"choices": [choice], **extra})


def translate(payloads: list[str]) -> list[object]:
    translator = ChunkTranslator()
    out: list[object] = []
    for item in payloads:
        out += translator.feed(item)
    return out


def test_translation_opens_blocks_in_first_open_order_and_defers_ends() -> None:
    chunks = translate([
        payload({"role": "assistant", "content": None, "reasoning_content": ""}),
        payload({"reasoning_content": "hmm"}),
        payload({"content": "Hi"}),
        payload({"reasoning_content": " more"}),
        payload({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "bash",
                                                                        "arguments": '{"a"'}}]}),
        payload({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
        payload({}, finish="tool_calls", usage={"prompt_tokens": 9, "completion_tokens": 4}),
        "[DONE]",
    ])
    assert chunks == [
        BlockStartChunk(index=0, block_type="reasoning"),
        ReasoningDeltaChunk(index=0, text="hmm"),
        BlockStartChunk(index=1, block_type="text"),
        TextDeltaChunk(index=1, text="Hi"),
        ReasoningDeltaChunk(index=0, text=" more"),
        BlockStartChunk(index=2, block_type="tool-call"),
        ToolCallDeltaChunk(index=2, id="c1", name="bash", arguments_delta='{"a"'),
        ToolCallDeltaChunk(index=2, id="c1", name="bash", arguments_delta=":1}"),
        BlockEndChunk(index=0, block=ReasoningBlock(text="hmm more")),
        BlockEndChunk(index=1, block=TextBlock(text="Hi")),
        BlockEndChunk(index=2, block=ToolCallBlock(id="c1", name="bash", arguments='{"a":1}')),
        UsageChunk(usage=TokenUsage(input_tokens=9, output_tokens=4)),
        FinishChunk(reason=ToolCallsFinish()),
    ]


def test_usage_only_trailing_chunk_and_cache_accounting() -> None:
    chunks = translate([
        payload({"content": "x"}),
        payload({}, finish="length"),
        json.dumps({"choices": [], "usage": {
            "prompt_tokens": 100, "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 60},
            "completion_tokens_details": {"reasoning_tokens": 3},
        }}),
        "[DONE]",
    ])
    assert chunks[-2:] == [
        UsageChunk(usage=TokenUsage(
            input_tokens=40, output_tokens=7, cache_read_tokens=60, reasoning_tokens=3
        )),
        FinishChunk(reason=MaxTokensFinish()),
    ]
    assert map_usage({"prompt_tokens": 10, "completion_tokens": 1,
                      "prompt_cache_hit_tokens": 4}) == TokenUsage(
        input_tokens=6, output_tokens=1, cache_read_tokens=4
    )


def test_finish_reason_mapping() -> None:
    assert map_finish_reason("stop") == StopFinish()
    assert map_finish_reason("tool_calls") == ToolCallsFinish()
    assert map_finish_reason("length") == MaxTokensFinish()
    assert map_finish_reason("content_filter") == ErrorFinish(
        failure=LlmFailure(message="model stopped: content_filter", code="CONTENT_FILTER")
    )


def test_completed_response_without_content_is_empty_response() -> None:
    chunks = translate([payload({"content": ""}, finish="stop"), "[DONE]"])
    assert chunks == [FinishChunk(reason=ErrorFinish(failure=LlmFailure(
        message="model returned a completed response with no content", code="EMPTY_RESPONSE"
    )))]


def test_malformed_payloads_are_malformed_response() -> None:
    for bad in ["{not json", "[1, 2]", json.dumps({"choices": "x"}),
                json.dumps({"choices": [{"delta": {"tool_calls": "x"}}]}),
                json.dumps({"usage": {"prompt_tokens": -1}})]:
        with pytest.raises(LlmError) as caught:
            translate([bad])
        assert caught.value.code == "MALFORMED_RESPONSE", bad


def test_error_payload_mid_stream_is_classified() -> None:
    with pytest.raises(LlmError) as caught:
        translate([json.dumps({"error": {"code": 429, "message": "too many requests"}})])
    assert (caught.value.code, caught.value.status) == ("RATE_LIMIT", 429)
    with pytest.raises(LlmError) as caught:
        translate([json.dumps({"error": {"message": "upstream died"}})])
    assert caught.value.code == "SERVER"


def test_nothing_is_translated_after_done() -> None:
    translator = ChunkTranslator()
    translator.feed(payload({"content": "a"}))
    translator.feed("[DONE]")
    assert translator.done and translator.feed(payload({"content": "b"})) == []


# -- serialization -------------------------------------------------------------------------


def test_request_body_maps_messages_and_omits_absent_fields() -> None:
    history = [
        UserMessage(id="u1", content=(TextBlock(text="list files"),), source=UserSource()),
        AssistantMessage(
            id="a1",
            content=(
                ReasoningBlock(text="use ls"),
                ToolCallBlock(id="c1", name="bash", arguments='{"command":"ls"}'),
            ),
            source=ModelSource(provider="p", model="m"),
        ),
        ToolResultMessage(
            id="t1",
            content=(ToolResultBlock(tool_call_id="c1", content=(TextBlock(text="a.txt"),)),),
            source=ToolSource(call_id="c1"),
        ),
        ToolResultMessage(
            id="t2",
            content=(ToolResultBlock(tool_call_id="c2", content=()),),
            source=ToolSource(call_id="c2"),
        ),
    ]
    schema = ToolSchema(name="bash", description="run", parameters={"type": "object"})
    body = serialize_request(
        request("p", "deepseek-chat", messages=history, system="be brief", tools=(schema,))
    )
    assert body == {
        "model": "deepseek-chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "reasoning_content": "use ls",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "c2", "content": "(no output)"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {
            "name": "bash", "description": "run", "parameters": {"type": "object"}}}],
    }
    assert "temperature" not in body and "max_tokens" not in body and "thinking" not in body


def test_request_body_optional_fields_and_efforts() -> None:
    body = serialize_request(
        request("p", "m", temperature=0.2, max_tokens=100, stop=("END",), reasoning_effort="high")
    )
    assert body["temperature"] == 0.2 and body["max_tokens"] == 100 and body["stop"] == ["END"]
    assert body["thinking"] == {"type": "enabled"} and body["reasoning_effort"] == "high"
    off = serialize_request(request("p", "m", reasoning_effort="off"))
    assert off["thinking"] == {"type": "disabled"} and "reasoning_effort" not in off
    assert serialize_request(request("p", "m"), thinking="disabled")["thinking"] == {
        "type": "disabled"
    }
    title = serialize_request(request("p", "m", reasoning_effort="high", purpose="session-title"))
    assert title["thinking"] == {"type": "disabled"}
    with pytest.raises(LlmError) as caught:
        serialize_request(request("p", "m", reasoning_effort="turbo"))
    assert caught.value.code == "UNSUPPORTED_REASONING_EFFORT"
    with pytest.raises(LlmError):
        serialize_request(request("p", "m", reasoning_effort="high"), thinking="disabled")


def test_user_message_with_text_and_results_keeps_both() -> None:
    mixed = UserMessage(
        id="u",
        content=(TextBlock(text="note"), ToolResultBlock(tool_call_id="c", content=())),
        source=UserSource(),
    )
    body = serialize_request(request("p", "m", messages=[user("x"), mixed]))
    assert body["messages"][1:] == [
        {"role": "user", "content": "note"},
        {"role": "tool", "tool_call_id": "c", "content": "(no output)"},
    ]


def test_assembled_message_goes_back_on_the_wire_unchanged() -> None:
    """A message assembled from a stream and sent back as history keeps its tool calls."""
    chunks = translate([
        payload({"tool_calls": [{"index": 0, "id": "c1",
                                 "function": {"name": "bash", "arguments": "{}"}}]}),
        payload({}, finish="tool_calls"),
        "[DONE]",
    ])
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)  # type: ignore[arg-type]
    message = assembler.message(provider="p", model="m")
    body = serialize_request(request("p", "m", messages=[user("go"), message]))
    assert body["messages"][1]["tool_calls"][0]["id"] == "c1"


# -- wire helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "detail", "code"),
    [
        (401, "", "AUTH"),
        (403, "", "AUTH"),
        (413, "context_length_exceeded", "INVALID_REQUEST"),
        (429, "request rate limit exceeded", "RATE_LIMIT"),
        (429, "insufficient_quota account credits exhausted", "QUOTA"),
        (402, "Insufficient Balance", "QUOTA"),
        (400, "This model maximum context length is 128000 tokens", "CONTEXT_WINDOW_EXCEEDED"),
        (400, "request too large for model context", "CONTEXT_WINDOW_EXCEEDED"),
        (400, "invalid input: temperature exceeds maximum allowed value", "INVALID_REQUEST"),
        (500, "", "SERVER"),
        (503, "", "SERVER"),
        (418, "", "HTTP_418"),
    ],
)
def test_http_error_codes(status: int, detail: str, code: str) -> None:
    assert http_error_code(status, detail) == code


def test_retry_after_parsing() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after_ms("2", now) == 2000
    future = email.utils.formatdate(now + 3, usegmt=True)
    assert parse_retry_after_ms(future, now) == 3000
    for bad in (None, "0", "9" * 400, "not-a-date", email.utils.formatdate(0, usegmt=True)):
        assert parse_retry_after_ms(bad, now) is None


def test_api_key_check_and_headers() -> None:
    assert check_api_key("  sk-123\n", "KEY") == "sk-123"
    for bad in ("", "   ", "sk 123", "sk-\u00e9"):
        with pytest.raises(LlmError) as caught:
            check_api_key(bad, "KEY")
        assert caught.value.code == "INVALID_CREDENTIAL"
        assert bad.strip() == "" or bad not in str(caught.value)
    assert request_id_of({"x-deepseek-request-id": "d-1"}) == "d-1"
    assert request_id_of({"x-request-id": "r-1", "x-deepseek-request-id": "d-1"}) == "r-1"
    assert user_agent().startswith("dsh-python/")


def test_config_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPSEEK_BASE_URL", raising=False)
    default = settings_of_config(LlmOpenAICompatibleConfig())
    assert default.base_url == "https://api.deepseek.com"
    assert default.display_name == "DeepSeek" and default.model == "deepseek-chat"
    assert default.retry_policy.max_retries == 5
    monkeypatch.setenv("DEEPSEEK_BASE_URL", "http://127.0.0.1:9/v1/")
    from_env = settings_of_config(
        LlmOpenAICompatibleConfig(retry_policy=RetryPolicyConfig(max_retries=2))
    )
    assert from_env.base_url == "http://127.0.0.1:9/v1" and from_env.display_name == "127.0.0.1"
    assert from_env.endpoint == "http://127.0.0.1:9/v1/chat/completions"
    assert from_env.retry_policy.max_retries == 2
    with pytest.raises(ConfigError, match="not an http"):
        settings_of_config(LlmOpenAICompatibleConfig(base_url="api.deepseek.com"))
    with pytest.raises(ConfigError, match="thinking is disabled"):
        settings_of_config(
            LlmOpenAICompatibleConfig(thinking="disabled", reasoning_effort="high")
        )


def test_image_content_is_refused_before_any_io() -> None:
    from dsh_host._session.messages import ImageBlock

    image_user = UserMessage(
        id="u", content=(ImageBlock(attachment={"attachmentId": "a1"}),), source=UserSource()
    )
    with pytest.raises(LlmError) as caught:
        serialize_request(request("p", "m", messages=[image_user]))
    assert caught.value.code == "UNSUPPORTED_CONTENT"
