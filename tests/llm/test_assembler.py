"""BlockAssembler and the compact embedded stream (pack/unpack)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host._jsonsafe import json_dec_hook, json_enc_hook
from dsh_host._llm import BlockAssembler, IncompleteBlockError, pack_stream, unpack_stream
from dsh_host._llm.records import StreamPacker
from dsh_host._session import (
    AssistantMessage,
    BlockEndChunk,
    BlockStartChunk,
    ErrorFinish,
    FinishChunk,
    LlmFailure,
    MaxTokensFinish,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolCallsFinish,
    UsageChunk,
)
from dsh_host._session.messages import AssistantStreamRecord, ModelSource

FIXTURE = (
    Path(__file__).resolve().parents[1]
    / "fixtures/dsh-reference/root-none/--home-dev-project--/raw-clean"
)


def text_response(text: str) -> list[StreamChunk]:
    return [
        BlockStartChunk(index=0, block_type="text"),
        *(TextDeltaChunk(index=0, text=char) for char in text),
        BlockEndChunk(index=0, block=TextBlock(text=text)),
        UsageChunk(usage=TokenUsage(input_tokens=10, output_tokens=len(text))),
        FinishChunk(reason=StopFinish()),
    ]


def tool_response(call_id: str, name: str, args: str, text: str | None = None) -> list[StreamChunk]:
    chunks: list[StreamChunk] = []
    index = 0
    if text:
        chunks += [
            BlockStartChunk(index=0, block_type="text"),
            TextDeltaChunk(index=0, text=text),
            BlockEndChunk(index=0, block=TextBlock(text=text)),
        ]
        index = 1
    chunks += [
        BlockStartChunk(index=index, block_type="tool-call"),
        ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=args[:5]),
        ToolCallDeltaChunk(index=index, id=call_id, arguments_delta=args[5:]),
        BlockEndChunk(index=index, block=ToolCallBlock(id=call_id, name=name, arguments=args)),
        UsageChunk(usage=TokenUsage(input_tokens=10, output_tokens=5)),
        FinishChunk(reason=ToolCallsFinish()),
    ]
    return chunks


def feed(chunks: list[StreamChunk]) -> BlockAssembler:
    assembler = BlockAssembler()
    for chunk in chunks:
        assembler.push(chunk)
    return assembler


def test_text_stream_assembles_message_usage_and_finish() -> None:
    assembler = feed(text_response("hello"))
    assert assembler.blocks() == (TextBlock(text="hello"),)
    assert assembler.usage == TokenUsage(input_tokens=10, output_tokens=5)
    assert assembler.finish == StopFinish()
    message = assembler.message(provider="p", model="m", message_id="a-1")
    assert isinstance(message, AssistantMessage)
    assert message.id == "a-1" and message.role == "assistant"
    assert message.source == ModelSource(provider="p", model="m")
    assert message.content == (TextBlock(text="hello"),)


def test_message_is_the_session_wire_type_and_round_trips() -> None:
    message = feed(tool_response("c1", "bash", '{"command":"ls"}', text="run")).message(
        provider="p", model="m"
    )
    data = msgspec.json.encode(message, enc_hook=json_enc_hook)
    assert json.loads(data) == {
        "id": message.id,
        "role": "assistant",
        "content": [
            {"type": "text", "text": "run"},
            {"type": "tool-call", "id": "c1", "name": "bash", "arguments": '{"command":"ls"}'},
        ],
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    assert msgspec.json.decode(data, type=AssistantMessage, dec_hook=json_dec_hook) == message


def test_delta_only_protocol_creates_blocks_from_deltas() -> None:
    assembler = feed([
        ReasoningDeltaChunk(index=0, text="think"),
        ReasoningDeltaChunk(index=0, text="ing"),
        TextDeltaChunk(index=1, text="an"),
        TextDeltaChunk(index=1, text="swer"),
        ToolCallDeltaChunk(index=2, id="x", name="bash", arguments_delta="{}"),
    ])
    assert assembler.blocks() == (
        ReasoningBlock(text="thinking"),
        TextBlock(text="answer"),
        ToolCallBlock(id="x", name="bash", arguments="{}"),
    )
    assert assembler.finish == StopFinish()
    assert not assembler.finished


def test_duplicate_start_ignored_first_close_wins_and_late_deltas_ignored() -> None:
    assembler = feed([
        BlockStartChunk(index=0, block_type="text"),
        BlockStartChunk(index=0, block_type="reasoning"),
        TextDeltaChunk(index=0, text="a"),
        BlockEndChunk(index=0, block=TextBlock(text="authoritative")),
        TextDeltaChunk(index=0, text="late"),
        BlockEndChunk(index=0, block=TextBlock(text="second close")),
    ])
    assert assembler.blocks() == (TextBlock(text="authoritative"),)


def test_blocks_keep_first_seen_order_not_index_order() -> None:
    assembler = feed([
        TextDeltaChunk(index=5, text="first"),
        TextDeltaChunk(index=1, text="second"),
    ])
    assert assembler.blocks() == (TextBlock(text="first"), TextBlock(text="second"))


def test_open_tool_call_without_id_or_name_gets_placeholders() -> None:
    assembler = feed([BlockStartChunk(index=3, block_type="tool-call")])
    assert assembler.blocks() == (ToolCallBlock(id="call-3", name="", arguments=""),)


def test_open_unknown_block_cannot_be_assembled_but_interruption_skips_it() -> None:
    assembler = feed([
        TextDeltaChunk(index=0, text="kept"),
        BlockStartChunk(index=1, block_type="image"),
    ])
    with pytest.raises(IncompleteBlockError, match='incomplete block of type "image" at index 1'):
        assembler.blocks()
    assert assembler.interrupted_blocks() == (TextBlock(text="kept"),)


def test_closed_unknown_block_is_kept() -> None:
    end = BlockEndChunk(index=0, block=ReasoningBlock(text="r"))
    assembler = feed([BlockStartChunk(index=0, block_type="mystery"), end])
    assert assembler.blocks() == (ReasoningBlock(text="r"),)


def test_max_tokens_drops_tool_calls_and_prunes_replay_blocks() -> None:
    chunks = tool_response("c1", "bash", '{"command":"ls"}', text="partial")[:-1]
    replay = {"response": "r-1", "blocks": ["for-text", "for-call"]}
    chunks.append(FinishChunk(reason=MaxTokensFinish(), replay_state=replay))
    assembler = feed(chunks)
    assert assembler.blocks() == (TextBlock(text="partial"),)
    assert dict(assembler.replay_state) == {"response": "r-1", "blocks": ("for-text",)}
    message = assembler.message(provider="p", model="m")
    assert message.content == (TextBlock(text="partial"),)
    assert message.source.replay_state["blocks"] == ("for-text",)  # type: ignore[index]


def test_misaligned_replay_envelope_is_discarded_and_aligned_one_kept() -> None:
    base = text_response("hi")[:-1]
    misaligned = feed([*base, FinishChunk(reason=StopFinish(), replay_state={"blocks": [1, 2]})])
    assert misaligned.replay_state is None
    assert misaligned.message(provider="p", model="m").source.replay_state is msgspec.UNSET
    aligned = feed([*base, FinishChunk(reason=StopFinish(), replay_state={"blocks": [1]})])
    assert aligned.replay_state == {"blocks": [1]}
    opaque = feed([*base, FinishChunk(reason=StopFinish(), replay_state="opaque")])
    assert opaque.replay_state == "opaque"


def test_interrupted_blocks_keep_nonblank_text_and_reasoning_only() -> None:
    assembler = feed([
        ReasoningDeltaChunk(index=0, text="thinking"),
        TextDeltaChunk(index=1, text="   \n"),
        BlockStartChunk(index=2, block_type="tool-call"),
        ToolCallDeltaChunk(index=2, id="c", name="bash", arguments_delta='{"a"'),
        TextDeltaChunk(index=3, text="partial answer"),
    ])
    assert assembler.interrupted_blocks() == (
        ReasoningBlock(text="thinking"),
        TextBlock(text="partial answer"),
    )
    message = assembler.interrupted_message(provider="p", model="m")
    assert message is not None and message.content == assembler.interrupted_blocks()
    assert feed([TextDeltaChunk(index=0, text=" ")]).interrupted_message(
        provider="p", model="m"
    ) is None


def test_error_finish_is_reported() -> None:
    failure = LlmFailure(message="boom", code="SERVER", status=500)
    assembler = feed([TextDeltaChunk(index=0, text="x"), FinishChunk(reason=ErrorFinish(failure=failure))])
    assert assembler.finish == ErrorFinish(failure=failure)
    assert assembler.finished


def test_push_rejects_non_chunks() -> None:
    with pytest.raises(TypeError, match="not a stream chunk"):
        BlockAssembler().push(TextBlock(text="x"))  # type: ignore[arg-type]


# -- embedded stream records -------------------------------------------------------------


def _fixture_message() -> dict[str, Any]:
    for line in (FIXTURE / "session.v3.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "assistant/message":
            return dict(event)
    raise AssertionError("fixture has no assistant/message")


def test_stream_records_match_the_reference_fixture() -> None:
    event = _fixture_message()
    expected = event["data"]["stream"]
    records = msgspec.convert(expected, tuple[AssistantStreamRecord, ...])
    timed = unpack_stream(records)
    assembler = BlockAssembler()
    for time, chunk in timed:
        assembler.push(chunk, time)
    assert json.loads(msgspec.json.encode(assembler.stream_records())) == expected
    message = assembler.message(provider="mock", model="mock", message_id="assistant-1")
    assert json.loads(msgspec.json.encode(message)) == event["data"]["message"]


def test_short_runs_stay_scalar_and_incompatible_runs_split() -> None:
    timed: list[tuple[int, StreamChunk]] = [
        (1, TextDeltaChunk(index=0, text="a")),
        (2, TextDeltaChunk(index=0, text="b")),
        (3, TextDeltaChunk(index=1, text="c")),
        (4, ToolCallDeltaChunk(index=2, id="x", name="n", arguments_delta="1")),
        (5, ToolCallDeltaChunk(index=2, id="x", arguments_delta="2")),
        (6, ToolCallDeltaChunk(index=2, id="x", arguments_delta="3")),
        (7, ToolCallDeltaChunk(index=2, id="x", arguments_delta="4")),
    ]
    records = pack_stream(timed)
    tags = [type(r).__struct_config__.tag for r in records]
    assert tags == ["chunk", "chunk", "chunk", "chunk", "tool-call-chunks"]
    assert unpack_stream(records) == timed


_deltas = st.one_of(
    st.builds(TextDeltaChunk, index=st.integers(0, 2), text=st.text(max_size=3)),
    st.builds(ReasoningDeltaChunk, index=st.integers(0, 2), text=st.text(max_size=3)),
    st.builds(
        ToolCallDeltaChunk,
        index=st.integers(0, 2),
        id=st.sampled_from(["a", "b"]),
        name=st.sampled_from([msgspec.UNSET, "bash"]),
        arguments_delta=st.text(max_size=3),
    ),
    st.builds(BlockStartChunk, index=st.integers(0, 2), block_type=st.sampled_from(["text"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), _deltas), max_size=40))
def test_pack_unpack_is_lossless(timed: list[tuple[int, StreamChunk]]) -> None:
    records = pack_stream(timed)
    assert unpack_stream(records) == timed
    # and the records survive the JSON wire
    wire = msgspec.json.encode(records)
    assert unpack_stream(msgspec.json.decode(wire, type=tuple[AssistantStreamRecord, ...])) == timed


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), _deltas), max_size=40), st.data())
def test_records_read_mid_stream_are_the_records_of_what_came(
    timed: list[tuple[int, StreamChunk]], data: st.DataObject
) -> None:
    """The packer packs as chunks arrive: reading its records part-way (an interrupted
    message) gives exactly the records of the chunks so far, and changes nothing after."""
    cut = data.draw(st.integers(0, len(timed)))
    packer = StreamPacker()
    for time, chunk in timed[:cut]:
        packer.add(time, chunk)
    assert packer.records() == pack_stream(timed[:cut])
    for time, chunk in timed[cut:]:
        packer.add(time, chunk)
    assert packer.records() == pack_stream(timed)
    assert unpack_stream(packer.records()) == timed


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.data())
def test_any_delta_split_assembles_the_same_text(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assembler = feed([TextDeltaChunk(index=0, text=piece) for piece in pieces])
    assert assembler.blocks() == (TextBlock(text=text),)
