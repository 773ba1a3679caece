"""The agent loop's event order and turn endings (dsh_host/_agent/loop.py's docstring; D6)."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
from llm.sse_server import (
    SseServer,
    sse,
    text_events,
    tool_call_events,
)
from msgspec import UNSET

from dsh_host import CancelToken, Row, open_host
from dsh_host._agent import (
    CONTEXT_CLEARED,
    CONTEXT_HEADER,
    HARNESS_IDENTITY,
    AgentBusyError,
    AgentConfigError,
    Enter,
    PreStepContext,
    Reject,
    TurnStoppingContext,
)
from dsh_host._session.events import (
    AssistantMessageData,
    BlockedReason,
    CompletedReason,
    ErrorReason,
    MaxTokensReason,
    RequestHeaderData,
    ToolResultData,
    TurnEnd,
)
from dsh_host._session.messages import (
    AssistantMessage,
    PluginSource,
    SystemMessage,
    TextBlock,
    ToolResultBlock,
    ToolResultMessage,
    UserMessage,
)
from dsh_host._tools import ToolDefinition, ToolExecution, text_output
from dsh_host.errors import AbortError

from .agent_helpers import (
    Trace,
    agent_service,
    live_types,
    model_requests,
    register_tool,
    scripted_host,
    tools_of,
)

# both backends: the agent loop
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

TOOL_TURN = [
    {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}, "id": "call-1"}]},
    {"text": "done"},
]

#: A two-step turn with one tool call, as the log records it (v3 shapes:
#: the model stream is embedded in assistant/message; the system prompt is a
#: system/message surface node).
GOLDEN_TOOL_TURN_LOG = [
    "turn/start",
    "step/start",
    "system/message",
    "user/message",
    "request/header",
    "request/context",
    "assistant/message",
    "tool/call",
    "tool/result",
    "step/end",
    "step/start",
    "assistant/message",
    "step/end",
    "turn/end",
]

#: The same turn interleaved with the pipeline dispatches that produce it.
GOLDEN_TOOL_TURN_TRACE = [
    "turn/start",
    "<agent/pre-step>",
    "step/start",
    "system/message",
    "user/message",
    "request/header",
    "request/context",
    "<llm/stream>",
    "assistant/message",
    "tool/call",
    "<tools/pre-execute>",
    "<tools/execute>",
    "<tools/post-execute>",
    "<tools/result>",
    "tool/result",
    "step/end",
    "<agent/pre-step>",
    "step/start",
    "<llm/stream>",
    "assistant/message",
    "step/end",
    "turn/end",
]


async def echo(args: Any, exec: ToolExecution) -> Any:
    return f"echo {args['text']}"


async def test_two_step_tool_turn_golden_sequence() -> None:
    async with scripted_host(TOOL_TURN) as host:
        register_tool(host, "echo", echo)
        trace = Trace(host)
        agent = agent_service(host).create()
        reason = await agent.run_turn("say hi through the tool")
        session = agent.session
        requests = model_requests(host)
    assert reason == CompletedReason()
    assert live_types(session) == GOLDEN_TOOL_TURN_LOG
    assert trace.items == GOLDEN_TOOL_TURN_TRACE
    # two provider requests; the second carries the tool result with the model's call id
    assert len(requests) == 2
    second = requests[1].messages
    result = second[-1]
    assert isinstance(result, ToolResultMessage)
    assert result.content == (
        ToolResultBlock(
            tool_call_id="call-1", content=(TextBlock(text="echo hi"),), is_error=False
        ),
    )
    # derived history: system, user, assistant(tool call), tool result, assistant
    kinds = [type(m).__name__ for m in session.derive_messages()]
    assert kinds == [
        "SystemMessage",
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
    ]
    [tool_result] = [e for e in session.events if e.type == "tool/result"]
    [tool_call] = [e for e in session.events if e.type == "tool/call"]
    assert tool_result.source_event_seqs == (tool_call.seq,)
    assert tool_call.data.arguments == '{"text":"hi"}'
    end = session.events[-1].data
    assert isinstance(end, TurnEnd) and end.turn == 1


async def test_same_run_against_the_loopback_sse_server() -> None:
    script = [
        sse(tool_call_events([("call-1", "echo", '{"text":"hi"}')], fragment=4)),
        sse(text_events("do", "ne")),
    ]
    with SseServer(script) as server:
        rows = [
            Row(name="sessions"),
            Row(name="llm"),
            Row(name="tools"),
            Row(
                name="llm-openai-compatible",
                config={"base_url": server.url, "api_key_env": None},
            ),
            Row(name="agent", config={"provider": "deepseek-official", "model": "deepseek-chat"}),
        ]
        async with open_host(rows) as host:
            register_tool(host, "echo", echo)
            trace = Trace(host)
            agent = agent_service(host).create()
            reason = await agent.run_turn("say hi through the tool")
            session = agent.session
        bodies = [request.body for request in server.requests]
    assert reason == CompletedReason()
    assert live_types(session) == GOLDEN_TOOL_TURN_LOG
    assert trace.items == GOLDEN_TOOL_TURN_TRACE
    assert len(bodies) == 2
    wire = bodies[1]["messages"]
    assert wire[0] == {"role": "system", "content": HARNESS_IDENTITY}
    assert wire[-1] == {"role": "tool", "tool_call_id": "call-1", "content": "echo hi"}
    assert [tool["function"]["name"] for tool in bodies[0]["tools"]] == ["echo"]
    final = session.events[-3].data
    assert isinstance(final, AssistantMessageData)
    assert final.message.content == (TextBlock(text="done"),)


async def test_simple_text_turn() -> None:
    async with scripted_host(
        [{"text": "hello there", "usage": {"input_tokens": 7, "output_tokens": 2}}]
    ) as host:
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
        session = agent.session
    assert reason == CompletedReason()
    assert live_types(session) == [
        "turn/start",
        "step/start",
        "system/message",
        "user/message",
        "request/header",
        "request/context",
        "assistant/message",
        "step/end",
        "turn/end",
    ]
    message_event = session.events[6].data
    assert isinstance(message_event, AssistantMessageData)
    assert message_event.usage is not UNSET and message_event.usage.input_tokens == 7
    assert message_event.stream is not UNSET and len(message_event.stream) > 0
    header = session.events[4].data
    assert isinstance(header, RequestHeaderData) and header.reason == "initial"
    assert header.header.system is UNSET  # v3: the prompt is a system/message
    history = session.derive_messages()
    assert isinstance(history[0], SystemMessage)
    assert isinstance(history[1], UserMessage) and isinstance(history[2], AssistantMessage)


async def test_header_is_logged_once_and_again_only_on_change() -> None:
    responses = [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    async with scripted_host(responses) as host:
        agent = agent_service(host).create()
        await agent.run_turn("first")
        await agent.run_turn("second")
        register_tool(host, "late", echo)  # the tool schemas change the header
        await agent.run_turn("third")
        reasons = [
            e.data.reason for e in agent.session.events if isinstance(e.data, RequestHeaderData)
        ]
    assert reasons == ["initial", "change"]


async def test_an_unregistered_tool_leaves_the_next_request() -> None:
    """The registry's schema tuple is kept between steps (D38) and dropped on unregister."""
    responses = [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    async with scripted_host(responses) as host:
        tools = tools_of(host)
        dispose = tools.register(
            ToolDefinition(
                name="late",
                description="a tool that leaves",
                parameters={"type": "object"},
                execute=echo,
                output=text_output(),
            )
        )
        agent = agent_service(host).create()
        await agent.run_turn("first")
        await agent.run_turn("second")
        dispose()
        await agent.run_turn("third")
        requests = model_requests(host)
        events = agent.session.events
    reasons = [e.data.reason for e in events if isinstance(e.data, RequestHeaderData)]
    assert reasons == ["initial", "change"]
    assert [[t.name for t in r.tools] for r in requests] == [["late"], ["late"], []]


async def test_a_tool_schema_is_the_one_registered() -> None:
    """Changing a registered tool's parameters mapping afterwards changes no request (D38)."""
    parameters: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    async with scripted_host([{"text": "one"}, {"text": "two"}]) as host:
        register_tool(host, "fixed", echo, parameters=parameters)
        agent = agent_service(host).create()
        await agent.run_turn("first")
        parameters["properties"]["b"] = {"type": "integer"}
        await agent.run_turn("second")
        requests = model_requests(host)
        events = agent.session.events
    reasons = [e.data.reason for e in events if isinstance(e.data, RequestHeaderData)]
    assert reasons == ["initial"]
    sent = [dict(r.tools[0].parameters["properties"]) for r in requests]
    assert [sorted(p) for p in sent] == [["a"], ["a"]]


async def test_a_config_change_after_equal_steps_logs_the_header_again() -> None:
    """The loop's header memo (equal parts, same tools) does not hide a changed config."""
    responses = [{"text": "one"}, {"text": "two"}, {"text": "three"}, {"text": "four"}]
    async with scripted_host(responses) as host:
        turns: list[int] = []

        async def warmer(proposal: Any, next: Any) -> Any:
            config = await next()
            turns.append(proposal.turn)
            if proposal.turn >= 3:
                return msgspec.structs.replace(config, temperature=0.5)
            return config

        host.ctx.on("agent/request", warmer)
        agent = agent_service(host).create()
        for prompt in ("first", "second", "third", "fourth"):
            await agent.run_turn(prompt)
        requests = model_requests(host)
        events = agent.session.events
    reasons = [e.data.reason for e in events if isinstance(e.data, RequestHeaderData)]
    assert turns == [1, 2, 3, 4]
    assert reasons == ["initial", "change"]
    assert [r.config.temperature for r in requests] == [UNSET, UNSET, 0.5, 0.5]


async def test_turn_numbers_continue() -> None:
    async with scripted_host([{"text": "a"}, {"text": "b"}]) as host:
        agent = agent_service(host).create()
        await agent.run_turn("one")
        await agent.run_turn("two")
        turns = [e.data.turn for e in agent.session.events if e.type == "turn/start"]
    assert turns == [1, 2]
    assert agent.last_turn == 2


# --------------------------------------------------------------------------- endings


async def test_blocked_by_pre_step() -> None:
    async with scripted_host([{"text": "never"}]) as host:

        async def reject(ctx: PreStepContext, next: Any) -> Any:
            return Reject()

        host.ctx.on("agent/pre-step", reject)
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
        requests = model_requests(host)
        session = agent.session
    assert reason == BlockedReason()
    assert live_types(session) == ["turn/start", "turn/end"]
    assert requests == []


async def test_pre_step_can_rewrite_the_input() -> None:
    async with scripted_host([{"text": "ok"}]) as host:

        async def rewrite(ctx: PreStepContext, next: Any) -> Any:
            decision = await next()
            extra = UserMessage(
                id="extra", content=(TextBlock(text="extra"),), source=ctx.messages[0].source
            )
            return Enter([*decision.messages, extra])

        host.ctx.on("agent/pre-step", rewrite)
        agent = agent_service(host).create()
        await agent.run_turn("hi")
        users = [e.data for e in agent.session.events if e.type == "user/message"]
    assert [u.content[0].text for u in users] == ["hi", "extra"]


async def test_no_input_completes_without_a_step() -> None:
    async with scripted_host([{"text": "never"}]) as host:
        agent = agent_service(host).create()
        reason = await agent.run_turn(None)
        session = agent.session
    assert reason == CompletedReason()
    assert live_types(session) == ["turn/start", "turn/end"]


async def test_error_finish_ends_the_turn_with_the_failure_verbatim() -> None:
    failing = [
        {"text": "partial", "error": {"code": "SERVER", "message": "upstream broke", "status": 503}}
    ]
    async with scripted_host(failing) as host:
        errors: list[Any] = []
        host.ctx.on("agent/error", errors.append)
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
        session = agent.session
    assert isinstance(reason, ErrorReason)
    assert (reason.error.code, reason.error.message, reason.error.status) == (
        "SERVER",
        "upstream broke",
        503,
    )
    types_ = live_types(session)
    assert "assistant/message" not in types_
    assert types_[-4:] == ["request/context", "assistant/attempt", "step/end", "turn/end"]
    assert [(e.turn, e.step) for e in errors] == [(1, 1)]


async def test_request_error_retry_commits_one_message() -> None:
    """The shipped ``llm-retry`` row recovers a rate-limited request (no listener of the test's
    own: that hid that no retry plugin shipped); one message is committed, the input once."""
    responses = [
        {"error": {"code": "RATE_LIMIT", "message": "slow down", "retry_after_ms": 1}},
        {"text": "second time lucky"},
    ]
    retry_row = Row(id="llm-retry", name="@deepseek-ai/dsh-llm-retry")
    async with scripted_host(responses, retry_row) as host:
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
        session = agent.session
    assert reason == CompletedReason()
    [scheduled] = [e.data for e in session.events if e.type == "llm/retry"]
    assert (scheduled.failure.code, scheduled.retry, scheduled.delay_ms) == ("RATE_LIMIT", 1, 1)
    kinds = live_types(session)
    assert kinds.count("llm/retry-started") == 1
    assert kinds.count("assistant/attempt") == 1
    assert kinds.count("assistant/message") == 1
    assert kinds.count("user/message") == 1  # the input is entered once, not per attempt


async def test_max_tokens_is_sticky_and_drops_tool_calls() -> None:
    responses = [
        {
            "text": "cut",
            "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}],
            "finish": "max-tokens",
        },
    ]
    async with scripted_host(responses) as host:
        register_tool(host, "echo", echo)
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
        session = agent.session
    assert reason == MaxTokensReason()
    assert "tool/call" not in live_types(session)


async def test_unknown_model_route_is_an_error() -> None:
    async with scripted_host([{"text": "x"}], provider="nowhere") as host:
        agent = agent_service(host).create()
        reason = await agent.run_turn("hi")
    assert isinstance(reason, ErrorReason)
    assert reason.error.code == "NO_ADAPTER"


async def test_invalid_options_are_refused_before_anything_is_published() -> None:
    async with scripted_host([{"text": "x"}]) as host:
        with pytest.raises(
            AgentConfigError, match="agent maxTokens must be a positive safe integer"
        ):
            agent_service(host).create(max_tokens=0)
        assert host.ctx.sessions.list() == []


async def test_max_tokens_seeds_the_request() -> None:
    async with scripted_host([{"text": "x"}]) as host:
        agent = agent_service(host).create(max_tokens=123)
        await agent.run_turn("hi")
        [request] = model_requests(host)
    assert request.config.max_tokens == 123


# --------------------------------------------------------------------------- tools


async def test_parallel_calls_overlap_but_commit_in_model_order() -> None:
    responses = [
        {
            "tool_calls": [
                {"name": "wait_for_peer", "arguments": {"who": "a"}, "id": "a"},
                {"name": "wait_for_peer", "arguments": {"who": "b"}, "id": "b"},
            ]
        },
        {"text": "both done"},
    ]
    async with scripted_host(responses) as host:
        started: dict[str, anyio.Event] = {"a": anyio.Event(), "b": anyio.Event()}
        finished: list[str] = []

        async def wait_for_peer(args: Any, exec: ToolExecution) -> Any:
            me = args["who"]
            other = "b" if me == "a" else "a"
            started[me].set()
            await started[other].wait()  # deadlocks unless both bodies overlap
            if me == "a":
                await started["b"].wait()
                await anyio.sleep(0.01)
            finished.append(me)
            return me

        register_tool(host, "wait_for_peer", wait_for_peer, parallel=True)
        agent = agent_service(host).create()
        with anyio.fail_after(10):
            reason = await agent.run_turn("go")
        session = agent.session
    assert reason == CompletedReason()
    assert finished == ["b", "a"]  # settled out of order...
    results = [e.data.message.source.call_id for e in session.events if e.type == "tool/result"]
    assert results == ["a", "b"]  # ...committed in model order
    calls = [e.type for e in session.events if e.type in ("tool/call", "tool/result")]
    assert calls == ["tool/call", "tool/call", "tool/result", "tool/result"]


async def test_exclusive_calls_run_one_at_a_time() -> None:
    responses = [
        {"tool_calls": [{"name": "serial", "id": "a"}, {"name": "serial", "id": "b"}]},
        {"text": "done"},
    ]
    async with scripted_host(responses) as host:

        async def serial(args: Any, exec: ToolExecution) -> Any:
            return exec.call_id

        register_tool(host, "serial", serial)
        agent = agent_service(host).create()
        await agent.run_turn("go")
        pairs = [e.type for e in agent.session.events if e.type in ("tool/call", "tool/result")]
    assert pairs == ["tool/call", "tool/result", "tool/call", "tool/result"]


async def test_malformed_arguments_reach_the_tool_as_a_string() -> None:
    responses = [
        {"tool_calls": [{"name": "echo", "arguments": "{not json", "id": "c"}]},
        {"text": "sorry"},
    ]
    async with scripted_host(responses) as host:
        register_tool(
            host,
            "echo",
            echo,
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
        )
        agent = agent_service(host).create()
        await agent.run_turn("go")
        [result] = [e.data for e in agent.session.events if e.type == "tool/result"]
    assert isinstance(result, ToolResultData)
    block = result.message.content[0]
    assert isinstance(block, ToolResultBlock) and block.is_error
    assert block.content == (
        TextBlock(text='Error: invalid arguments: "arguments" must be an object'),
    )


async def test_tool_contexts_enter_the_next_step() -> None:
    responses = [
        {"tool_calls": [{"name": "note", "id": "n"}]},
        {"text": "noted"},
    ]
    async with scripted_host(responses) as host:

        async def note(args: Any, exec: ToolExecution) -> Any:
            exec.defer_context(
                UserMessage(
                    id="ctx-1",
                    content=(TextBlock(text="remember"),),
                    source=PluginSource(plugin="test"),
                )
            )
            return "ok"

        register_tool(host, "note", note)
        agent = agent_service(host).create()
        await agent.run_turn("go")
        kinds = live_types(agent.session)
    second_step = kinds[kinds.index("step/end") + 1 :]
    assert second_step[:2] == ["step/start", "user/message"]


async def test_concluding_tool_ends_the_turn() -> None:
    responses = [{"tool_calls": [{"name": "finish", "id": "f"}]}, {"text": "never asked"}]
    async with scripted_host(responses) as host:

        async def finish(args: Any, exec: ToolExecution) -> Any:
            exec.conclude_turn()
            return "done"

        register_tool(host, "finish", finish)
        agent = agent_service(host).create()
        reason = await agent.run_turn("go")
        requests = model_requests(host)
    assert reason == CompletedReason()
    assert len(requests) == 1


async def test_turn_stopping_steer_continues_the_turn() -> None:
    async with scripted_host([{"text": "first"}, {"text": "second"}]) as host:
        steered: list[int] = []

        async def stopping(ctx: TurnStoppingContext) -> None:
            if not steered:
                steered.append(ctx.turn)
                ctx.agent.steer("one more thing")

        host.ctx.on("agent/turn-stopping", stopping)
        agent = agent_service(host).create()
        reason = await agent.run_turn("go")
        kinds = live_types(agent.session)
    assert reason == CompletedReason()
    assert kinds.count("step/start") == 2
    assert kinds.count("turn/start") == 1


# --------------------------------------------------------------------------- prompt


async def test_runtime_context_snapshot_only_when_it_changes() -> None:
    responses = [{"text": "a"}, {"text": "b"}, {"text": "c"}]
    async with scripted_host(responses, persona="Persona for {{model}}.") as host:
        service = agent_service(host)
        state = {"policy": "careful"}
        off = service.system_prompt.context(
            "test:policy", 150, lambda c: f"Policy: {state['policy']}."
        )
        agent = service.create()
        await agent.run_turn("one")
        await agent.run_turn("two")  # unchanged: no new snapshot
        off()
        await agent.run_turn("three")  # contexts vanished: one "none" snapshot
        snapshots = [
            e.data.content[0].text
            for e in agent.session.events
            if e.type == "user/message" and isinstance(e.data.source, PluginSource)
        ]
        system = [e.data.message for e in agent.session.events if e.type == "system/message"]
    assert snapshots == [f"{CONTEXT_HEADER}\n\nPolicy: careful.", CONTEXT_CLEARED]
    assert len(system) == 1
    assert system[0].content[0].text == f"{HARNESS_IDENTITY}\n\nPersona for scripted."


async def test_changed_system_prompt_replaces_the_head() -> None:
    async with scripted_host([{"text": "a"}, {"text": "b"}]) as host:
        service = agent_service(host)
        agent = service.create()
        await agent.run_turn("one")
        service.system_prompt.section("test:extra", 50, "Be brief.")
        await agent.run_turn("two")
        history = agent.session.derive_messages()
        systems = [e for e in agent.session.events if e.type == "system/message"]
    assert len(systems) == 2
    assert systems[1].source_event_seqs == (systems[0].seq,)
    assert isinstance(history[0], SystemMessage)
    assert history[0].content == (TextBlock(text=f"{HARNESS_IDENTITY}\n\nBe brief."),)
    assert sum(isinstance(m, SystemMessage) for m in history) == 1


# --------------------------------------------------------------------------- misuse


async def test_run_turn_rejects_concurrent_use_and_pre_aborted_tokens() -> None:
    async with scripted_host([{"text": "x", "hang": True}]) as host:
        agent = agent_service(host).create()
        token = CancelToken()
        token.abort("user")
        with pytest.raises(AbortError):
            await agent.run_turn("hi", signal=token)
        assert live_types(agent.session) == []
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run_turn, "hi")
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(AgentBusyError):
                await agent.run_turn("again")
            agent.cancel()
        assert agent.status == "idle"


async def test_tools_are_sorted_in_the_request() -> None:
    async with scripted_host([{"text": "x"}]) as host:
        for name in ("zeta", "alpha"):
            register_tool(host, name, echo)
        agent = agent_service(host).create()
        await agent.run_turn("hi")
        [request] = model_requests(host)
    assert [tool.name for tool in request.tools] == ["alpha", "zeta"]


async def test_scheduler_failure_ends_the_turn_without_fabricated_results() -> None:
    from dsh_host._tools import ToolDefinition, ToolOutput

    async with scripted_host([{"tool_calls": [{"name": "echo"}]}]) as host:
        ran: list[bool] = []

        async def body(args: Any, exec: ToolExecution) -> Any:
            ran.append(True)
            return "ok"

        # A result the log cannot carry (a text block whose text is not a string): committing
        # it fails inside the scheduler, after the body ran, not inside the tool.
        tools_of(host).register(
            ToolDefinition(
                name="echo",
                description="the echo test tool",
                parameters={"type": "object"},
                execute=body,
                output=ToolOutput(render=lambda _args, _value: (TextBlock(text=7),)),  # type: ignore[arg-type]
            )
        )
        agent = agent_service(host).create()
        reason = await agent.run_turn("go")
        kinds = live_types(agent.session)
        results = [e.data for e in agent.session.events if e.type == "tool/result"]
    assert isinstance(reason, ErrorReason)
    assert reason.error.code == "INVALID_SESSION_EVENT"  # the failure's own code, not UNKNOWN
    assert ran == [True]  # the started body finished before the turn ended
    # No fabricated success: the call is answered as crash repair would answer it.
    assert [r.error.code for r in results] == ["TOOL_OUTCOME_UNKNOWN"]
    assert kinds[-3:] == ["tool/result", "step/end", "turn/end"]


async def test_an_agent_continues_a_forked_session() -> None:
    from dsh_host._session.events import ForkedReason

    async with scripted_host([{"text": "first"}, {"text": "in the fork"}]) as host:
        service = agent_service(host)
        parent = service.create()
        await parent.run_turn("hello")
        turn_start = next(e.seq for e in parent.session.events if e.type == "turn/start")
        child_session = host.ctx.sessions.fork(parent.session, boundary=turn_start)
        child = service.create(session=child_session)
        reason = await child.run_turn("continue here")
        events = list(child_session.events)
    ends = [e.data.reason for e in events if e.type == "turn/end"]
    assert ends == [ForkedReason(), CompletedReason()]
    assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2]
    assert reason == CompletedReason()


async def test_the_execution_carries_raw_and_parsed_arguments() -> None:
    responses = [
        {"tool_calls": [{"name": "probe", "arguments": '{"a": [1, 2]}', "id": "c"}]},
        {"text": "ok"},
    ]
    async with scripted_host(responses) as host:
        seen: list[ToolExecution] = []

        async def probe(args: Any, exec: ToolExecution) -> Any:
            seen.append(exec)
            return "ok"

        register_tool(host, "probe", probe)
        agent = agent_service(host).create()
        await agent.run_turn("go")
    [exec] = seen
    assert exec.raw_arguments == '{"a": [1, 2]}'
    assert exec.arguments == {"a": (1, 2)}
    assert exec.call_id == "c" and exec.root_call_id == "c"
    assert exec.agent is agent and exec.parent is None
