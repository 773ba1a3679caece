"""llm-scripted: the script format, the chunks it streams, its failures."""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest
from dsh_llm_scripted import ScriptedAdapter

from dsh_host import Row, open_host, open_host_from_yaml
from dsh_host._cancel import CancelToken
from dsh_host._llm import assemble
from dsh_host._session import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    LlmFailure,
    MaxTokensFinish,
    ReasoningBlock,
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
from dsh_host.errors import BootError, ConfigError

from .llm_helpers import collect, request, terminal_failure

pytestmark = pytest.mark.anyio

BRIEF_SCRIPT = """\
responses:
  - text: "optional assistant text"
    tool_calls:                 # optional
      - name: bash
        arguments: {command: "echo hi"}
    delay_ms: 0                 # optional, before the first chunk
  - text: "done"
"""


def scripted(path: Path | None = None, **config: object) -> list[Row]:
    if path is not None:
        config["path"] = str(path)
    return [Row(name="llm"), Row(id="model", name="llm-scripted", config=dict(config))]


async def test_the_brief_script_streams_realistic_chunks(tmp_path: Path) -> None:
    script = tmp_path / "script.yml"
    script.write_text(BRIEF_SCRIPT)
    async with open_host(scripted(script)) as host:
        first = await collect(host.ctx.llm.stream(request()))
        args = '{"command":"echo hi"}'
        assert first == [
            BlockStartChunk(index=0, block_type="text"),
            TextDeltaChunk(index=0, text="optional "),
            TextDeltaChunk(index=0, text="assistant "),
            TextDeltaChunk(index=0, text="text"),
            BlockStartChunk(index=1, block_type="tool-call"),
            ToolCallDeltaChunk(index=1, id="call_1_1", name="bash", arguments_delta=args[:5]),
            ToolCallDeltaChunk(index=1, id="call_1_1", arguments_delta=args[5:]),
            BlockEndChunk(index=0, block=TextBlock(text="optional assistant text")),
            BlockEndChunk(
                index=1, block=ToolCallBlock(id="call_1_1", name="bash", arguments=args)
            ),
            UsageChunk(usage=TokenUsage(input_tokens=10, output_tokens=23 + len(args))),
            FinishChunk(reason=ToolCallsFinish()),
        ]
        second = await assemble(host.ctx.llm.stream(request()))
        assert second.blocks() == (TextBlock(text="done"),)
        assert second.finish == StopFinish()
        adapter = host.ctx.llm.adapter_for("scripted")
        assert isinstance(adapter, ScriptedAdapter)
        assert len(adapter.requests) == 2 and adapter.remaining == 0


async def test_exhausted_script_ends_with_an_error_that_says_so(tmp_path: Path) -> None:
    async with open_host(scripted(responses=[{"text": "only one"}])) as host:
        await collect(host.ctx.llm.stream(request()))
        chunks = await collect(host.ctx.llm.stream(request()))
        kind, failure = terminal_failure(chunks)
        assert kind == "error" and len(chunks) == 1
        assert failure.code == "SCRIPT_EXHAUSTED"
        assert "script exhausted" in failure.message
        assert "all 1 responses" in failure.message


async def test_json_script_with_reasoning_raw_arguments_and_pinned_ids(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{
        "reasoning": "let me think",
        "text": "calling",
        "tool_calls": [
            {"name": "read_file", "arguments": '{"path": "a.txt"', "id": "fixed-id"},
            {"name": "bash"},
        ],
        "usage": {"input_tokens": 7, "output_tokens": 3, "reasoning_tokens": 2},
    }]}))
    async with open_host(scripted(script)) as host:
        result = await assemble(host.ctx.llm.stream(request()))
        assert result.blocks() == (
            ReasoningBlock(text="let me think"),
            TextBlock(text="calling"),
            ToolCallBlock(id="fixed-id", name="read_file", arguments='{"path": "a.txt"'),
            ToolCallBlock(id="call_1_2", name="bash", arguments="{}"),
        )
        assert result.usage == TokenUsage(input_tokens=7, output_tokens=3, reasoning_tokens=2)


async def test_same_script_same_chunks() -> None:
    responses = [{"text": "one two three", "tool_calls": [{"name": "x", "arguments": {"a": 1}}]}]
    runs: list[list[StreamChunk]] = []
    for _ in range(2):
        async with open_host(scripted(responses=responses)) as host:
            runs.append(await collect(host.ctx.llm.stream(request())))
    assert runs[0] == runs[1]


async def test_scripted_error_and_max_tokens_entries() -> None:
    responses = [
        {"text": "partial", "error": {"code": "RATE_LIMIT", "message": "slow down",
                                       "status": 429, "retry_after_ms": 1200}},
        {"text": "cut", "tool_calls": [{"name": "bash"}], "finish": "max-tokens"},
    ]
    async with open_host(scripted(responses=responses)) as host:
        chunks = await collect(host.ctx.llm.stream(request()))
        assert chunks[:2] == [
            BlockStartChunk(index=0, block_type="text"), TextDeltaChunk(index=0, text="partial")
        ]
        kind, failure = terminal_failure(chunks)
        assert (kind, failure) == ("error", LlmFailure(
            message="slow down", code="RATE_LIMIT", status=429, provider_retry_after_ms=1200
        ))
        truncated = await assemble(host.ctx.llm.stream(request()))
        assert truncated.finish == MaxTokensFinish()
        assert truncated.blocks() == (TextBlock(text="cut"),)  # the truncated call is dropped


async def test_hang_waits_for_cancellation_and_reports_aborted() -> None:
    async with open_host(scripted(responses=[{"text": "thinking about it", "hang": True}])) as host:
        token = CancelToken()
        chunks: list[StreamChunk] = []

        async def pull() -> None:
            async with aclosing(host.ctx.llm.stream(request(signal=token))) as stream:
                async for chunk in stream:
                    chunks.append(chunk)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(pull)
                await anyio.wait_all_tasks_blocked()
                # the whole opening streamed, then the response hangs (no block-end, no finish)
                assert [type(c).__name__ for c in chunks] == [
                    "BlockStartChunk", "TextDeltaChunk", "TextDeltaChunk", "TextDeltaChunk"
                ]
                token.abort("user")
        kind, failure = terminal_failure(chunks)
        assert (kind, failure.code) == ("aborted", "ABORTED")
        assert len(chunks) == 5


async def test_abort_between_chunks_stops_the_stream() -> None:
    async with open_host(scripted(responses=[{"text": "thinking about it"}])) as host:
        token = CancelToken()
        chunks: list[StreamChunk] = []
        async with aclosing(host.ctx.llm.stream(request(signal=token))) as stream:
            async for chunk in stream:
                chunks.append(chunk)
                if isinstance(chunk, TextDeltaChunk) and chunk.text == "about ":
                    token.abort("user")
        kind, failure = terminal_failure(chunks)
        assert (kind, failure.code) == ("aborted", "ABORTED")
        # the signal is checked before every chunk: nothing is delivered after the abort
        assert [c for c in chunks if isinstance(c, TextDeltaChunk)][-1].text == "about "


async def test_delay_is_cut_short_by_cancellation() -> None:
    async with open_host(scripted(responses=[{"text": "late", "delay_ms": 3_600_000}])) as host:
        token = CancelToken()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                async def pull() -> None:
                    chunks = await collect(host.ctx.llm.stream(request(signal=token)))
                    assert terminal_failure(chunks)[0] == "aborted" and len(chunks) == 1

                tg.start_soon(pull)
                await anyio.wait_all_tasks_blocked()
                token.abort("user")


async def test_inline_responses_from_a_yaml_composition(tmp_path: Path) -> None:
    config = tmp_path / "dsh.yml"
    config.write_text(
        "- name: llm\n"
        "- name: llm-scripted\n"
        "  config:\n"
        "    provider: demo\n"
        "    responses:\n"
        "      - text: hello from yaml\n"
    )
    async with open_host_from_yaml(config) as host:
        result = await assemble(host.ctx.llm.stream(request("demo")))
        assert result.blocks() == (TextBlock(text="hello from yaml"),)
        assert host.ctx.llm.list_providers()[0].default_model == "scripted"


async def test_script_errors_name_the_file_and_key_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(BootError, match=r"nope\.yml does not exist"):
        async with open_host(scripted(missing)):
            pass

    typo = tmp_path / "typo.yml"
    typo.write_text("responses:\n  - text: hi\n    tool_calls:\n      - nme: bash\n")
    with pytest.raises(BootError, match=r"typo\.yml: responses\[0\]\.tool_calls\[0\]\.nme: unknown key"):
        async with open_host(scripted(typo)):
            pass

    empty = tmp_path / "empty.yml"
    empty.write_text("responses:\n  - text: ok\n  - delay_ms: 5\n")
    with pytest.raises(BootError, match=r"responses\[1\] is empty"):
        async with open_host(scripted(empty)):
            pass

    bad_yaml = tmp_path / "bad.yml"
    bad_yaml.write_text("responses: [\n")
    with pytest.raises(BootError, match="not valid YAML/JSON"):
        async with open_host(scripted(bad_yaml)):
            pass

    with pytest.raises(BootError, match="exactly one of `path`"):
        async with open_host(scripted()):
            pass

    with pytest.raises(ConfigError, match=r"config\.responses\[0\]\.delay_ms"):
        async with open_host(scripted(responses=[{"text": "x", "delay_ms": -1}])):
            pass


async def test_two_scripted_rows_need_two_provider_names() -> None:
    rows = [
        Row(name="llm"),
        Row(id="a", name="llm-scripted", config={"responses": [{"text": "a"}]}),
        Row(id="b", name="llm-scripted", config={"responses": [{"text": "b"}]}),
    ]
    with pytest.raises(BootError, match='provider "scripted" is already registered'):
        async with open_host(rows):
            pass
    rows[2] = Row(id="b", name="llm-scripted",
                  config={"provider": "second", "responses": [{"text": "b"}]})
    async with open_host(rows) as host:
        result = await assemble(host.ctx.llm.stream(request("second")))
        assert result.blocks() == (TextBlock(text="b"),)


async def test_reasoning_efforts_are_refused_unless_configured() -> None:
    async with open_host(scripted(responses=[{"text": "x"}])) as host:
        chunks = await collect(host.ctx.llm.stream(request(reasoning_effort="high")))
        assert terminal_failure(chunks)[1].code == "UNSUPPORTED_REASONING_EFFORT"
    async with open_host(
        scripted(responses=[{"text": "x"}], reasoning_efforts=["low", "high"])
    ) as host:
        result = await assemble(host.ctx.llm.stream(request(reasoning_effort="high")))
        assert result.blocks() == (TextBlock(text="x"),)
