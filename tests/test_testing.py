"""``dsh_host.testing``: the doubles a plugin author tests with boot real hosts and fail loudly.

A plugin under test (``CallCounter``, below) is mounted by class next to a scripted model and an
in-memory store; the agent loop, the tool pipeline and the store are the real ones.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dsh_host import Context, Next, Plugin
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._session.events import CompletedReason, ErrorReason
from dsh_host._session.messages import TextBlock, ToolResultBlock, ToolResultMessage
from dsh_host._tools import (
    TOOLS,
    TOOLS_EXECUTE,
    ToolDefinition,
    ToolExecution,
    ToolExecutionResult,
    text_output,
)
from dsh_host.errors import ConfigError
from dsh_host.testing import (
    FakeClock,
    ScriptedHost,
    memory_store,
    open_test_host,
    plugin_row,
    scripted_model,
)

SEEN: list[str] = []


class CounterConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    label: str = "seen"


class CallCounter(Plugin):
    """What a third-party plugin looks like: middleware around every top-level tool call."""

    name = "call-counter"
    Config = CounterConfig

    def apply(self, ctx: Context, config: CounterConfig) -> None:
        async def around(exec_: ToolExecution, next_: Next[ToolExecutionResult]) -> ToolExecutionResult:
            SEEN.append(f"{config.label} {exec_.name}")
            return await next_()

        ctx.on(TOOLS_EXECUTE, around)


def register_echo(harness: ScriptedHost) -> None:
    async def echo(args: Any, _exec: ToolExecution) -> str:
        return f"echo {args['text']}"

    harness.tools.register(
        ToolDefinition(
            name="echo",
            description="echo the text",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
            execute=echo,
            output=text_output(),
        )
    )


ECHO_THEN_DONE: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
    {"text": "done"},
]


@pytest.mark.anyio
async def test_a_plugin_class_runs_in_a_real_turn_against_the_scripted_model() -> None:
    SEEN.clear()
    config = CounterConfig(label="counted")
    async with open_test_host(plugin_row(CallCounter, config), responses=ECHO_THEN_DONE) as h:
        register_echo(h)
        agent = h.new_agent()
        assert await agent.run_turn("go") == CompletedReason()
        requests = h.model_requests()
        session_id = agent.session.id
        live_types = [event.type for event in agent.session.events]
        stored = await h.host.ctx.service(SESSION_PERSISTENCE).open(session_id, "read")
        load = await stored.read()
        await stored.close()
    assert SEEN == ["counted echo"]  # the plugin's middleware ran around the real call
    assert len(requests) == 2  # the second request carried the tool result back
    [result] = [m for m in requests[1].messages if isinstance(m, ToolResultMessage)]
    [block] = result.content
    assert isinstance(block, ToolResultBlock)
    assert [b.text for b in block.content if isinstance(b, TextBlock)] == ["echo hi"]
    # The store holds what the checkpoint policy flushed (up to the last barrier: the final
    # request), a prefix of the live log with the tool call's result in it.
    stored_types = [event.type for event in load.events]
    assert stored_types == live_types[: len(stored_types)]
    assert "tool/result" in stored_types


@pytest.mark.anyio
async def test_a_plugin_class_is_mounted_by_its_module_path() -> None:
    SEEN.clear()
    async with open_test_host(CallCounter, responses=ECHO_THEN_DONE, store=False) as h:
        register_echo(h)
        await h.new_agent().run_turn("go")
    assert SEEN == ["seen echo"]
    assert plugin_row(CallCounter).name == "test_testing:CallCounter"


@pytest.mark.anyio
async def test_a_script_mistake_fails_the_boot_naming_the_key() -> None:
    bad = scripted_model([{"tool_calls": [{"nme": "echo"}]}])
    with pytest.raises(ConfigError, match=r"responses\[0\]\.tool_calls\[0\]\.nme: unknown key"):
        async with open_test_host(model=bad):
            pass  # pragma: no cover - the boot fails


@pytest.mark.anyio
async def test_an_exhausted_script_is_a_model_error_not_a_hang() -> None:
    async with open_test_host(responses=[{"text": "only one"}], store=False) as h:
        agent = h.new_agent()
        assert await agent.run_turn("first") == CompletedReason()
        ended = await agent.run_turn("second")
    assert isinstance(ended, ErrorReason) and ended.error.code == "SCRIPT_EXHAUSTED"


@pytest.mark.anyio
async def test_named_memory_stores_are_shared_and_fresh_ones_are_not() -> None:
    shared = memory_store("resume-here")
    async with open_test_host(responses=[{"text": "a"}], store=shared) as first:
        agent = first.new_agent(session_id="kept")
        await agent.run_turn("hello")
    async with open_test_host(store=memory_store("resume-here")) as second:
        listed = await second.host.ctx.service(SESSION_PERSISTENCE).list()
        assert [entry.header.id for entry in listed] == ["kept"]
    async with open_test_host() as fresh:
        assert await fresh.host.ctx.service(SESSION_PERSISTENCE).list() == []


@pytest.mark.anyio
async def test_a_fake_clock_makes_a_whole_turn_repeatable() -> None:
    async def times() -> list[int]:
        async with open_test_host(responses=ECHO_THEN_DONE, store=False) as h:
            register_echo(h)
            agent = h.new_agent(session_id="s", clock=FakeClock())
            await agent.run_turn("go")
            return [agent.session.header.created_at, *(e.time for e in agent.session.events)]

    first = await times()
    assert first == await times()
    assert first == list(range(1000, 1000 + len(first)))  # one read per stamp, none from the wall


def test_a_fake_clock_steps_and_advances_but_never_runs_back() -> None:
    clock = FakeClock(start=5, step=10)
    assert [clock(), clock()] == [5, 15]
    clock.advance(100)
    assert clock() == 125 and clock.reads == 3
    with pytest.raises(ValueError, match="never runs back"):
        clock.advance(-1)


def test_a_local_class_is_refused_with_the_fix() -> None:
    class Local(Plugin):
        name = "local"

    with pytest.raises(TypeError, match="define the class at module level"):
        plugin_row(Local)


@pytest.mark.anyio
async def test_pass_responses_or_a_model_not_both() -> None:
    with pytest.raises(TypeError, match="not both"):
        async with open_test_host(model=scripted_model(), responses=[{"text": "x"}]):
            pass  # pragma: no cover - refused before the boot


def test_a_response_that_is_not_a_mapping_is_named() -> None:
    with pytest.raises(TypeError, match=r"responses\[1\] is a str; give a mapping"):
        scripted_model([{"text": "ok"}, "done"])


class WordCountConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class WordCount(Plugin):
    """The example of docs/tools.md, verbatim in substance."""

    name = "word-count"
    inject = ("tools",)
    Config = WordCountConfig

    def apply(self, ctx: Context, config: WordCountConfig) -> None:
        async def count(args: dict[str, str], call: ToolExecution) -> str:
            call.signal.throw_if_aborted()
            return f"{len(args['text'].split())} words"

        ctx.service(TOOLS).register(
            ToolDefinition(
                name="word_count",
                description="Count the words of a text.",
                parameters={"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"], "additionalProperties": False},
                execute=count,
                output=text_output(),
            ),
            owner=ctx,
        )


@pytest.mark.anyio
async def test_the_tools_guide_example_runs() -> None:
    script = [
        {"tool_calls": [{"name": "word_count", "arguments": {"text": "a b c"}}]},
        {"text": "three"},
    ]
    async with open_test_host(WordCount, responses=script, store=False) as harness:
        agent = harness.new_agent()
        await agent.run_turn("count")
        requests = harness.model_requests()
    [result] = [m for m in requests[1].messages if isinstance(m, ToolResultMessage)]
    [block] = result.content
    assert isinstance(block, ToolResultBlock)
    assert [b.text for b in block.content if isinstance(b, TextBlock)] == ["3 words"]
