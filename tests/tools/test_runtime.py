"""The tools pipeline, stage by stage (dsh_host/_tools/runtime.py's docstring)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from msgspec import UNSET

from dsh_host import AbortError, CancelToken
from dsh_host._loader import PluginHost
from dsh_host._session.messages import TextBlock, UserMessage, UserSource
from dsh_host._tools import (
    Accept,
    Allow,
    ApprovalRequest,
    Ask,
    Block,
    Deny,
    PostExecuteContext,
    ToolDefinition,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionResult,
    ToolOutput,
    ToolRegistrationError,
    ToolResultEvent,
    ToolRuntime,
    UnsupportedSchemaError,
    aborted_before_dispatch_result,
    text_output,
)
from dsh_host._tools.types import STOPPED_OUTCOME_UNKNOWN_TEXT
from dsh_host.errors import DshError

from .tools_helpers import call, echo_tool, text_of

# both backends: cancellation and timeouts
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

BEFORE = ToolErrorInfo("AbortError", "ABORTED_BEFORE_DISPATCH")
# D18: cancellation of a body that had started records its outcome as unknown.
AFTER = ToolErrorInfo("ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN")


def user_message(text: str) -> UserMessage:
    return UserMessage(id=f"ctx-{text}", content=(TextBlock(text=text),), source=UserSource())


class Recorder:
    """Records which pipeline stages ran, in order."""

    def __init__(self, host: PluginHost) -> None:
        self.stages: list[str] = []
        self.results: list[ToolResultEvent] = []
        ctx = host.ctx

        async def pre(exec: ToolExecution, next: Any) -> Any:
            self.stages.append("pre")
            return await next()

        async def around(exec: ToolExecution, next: Any) -> Any:
            self.stages.append("execute")
            return await next()

        async def post(post: PostExecuteContext, next: Any) -> Any:
            self.stages.append("post")
            return await next()

        ctx.on("tools/pre-execute", pre)
        ctx.on("tools/execute", around)
        ctx.on("tools/post-execute", post)
        ctx.on("tools/result", self.results.append)


# --------------------------------------------------------------------------- happy path


async def test_success_runs_every_stage_and_emits_one_result(
    host: PluginHost, tools: ToolRuntime
) -> None:
    seen: list[str] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        seen.append(exec.call_id)
        return f"echo {args['text']}"

    tools.register(echo_tool(body=body))
    rec = Recorder(host)
    result = await tools.execute(call())
    assert not result.is_error
    assert result.value == "echo hi"
    assert text_of(result) == "echo hi"
    assert seen == ["call-1"]
    assert rec.stages == ["pre", "execute", "post"]
    assert len(rec.results) == 1
    assert rec.results[0].result is result
    assert rec.results[0].exec.finished


async def test_arguments_are_frozen_once(tools: ToolRuntime) -> None:
    captured: list[Any] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        captured.append(args)
        with pytest.raises(TypeError):
            args["text"] = "changed"
        return "ok"

    tools.register(echo_tool(body=body))
    original = {"text": "hi"}
    await tools.execute(call(arguments=original))
    original["text"] = "mutated"
    assert captured[0]["text"] == "hi"


# --------------------------------------------------------------------------- failures


async def test_unknown_tool_passes_through_post_execute(
    host: PluginHost, tools: ToolRuntime
) -> None:
    rec = Recorder(host)
    result = await tools.execute(call(name="nope"))
    assert result.is_error
    assert text_of(result) == 'Error: unknown tool "nope"'
    assert result.error is not None
    assert result.error.message == 'unknown tool "nope"'
    assert result.error.info == ToolErrorInfo("ToolNotFoundError", "UNKNOWN_TOOL")
    assert rec.stages == ["pre", "execute", "post"]


async def test_invalid_arguments_name_the_missing_property(tools: ToolRuntime) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(
        echo_tool(
            "read",
            body,
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        )
    )
    result = await tools.execute(call(name="read", arguments={}))
    assert text_of(result) == 'Error: invalid arguments: missing required property "path"'
    assert result.error is not None and result.error.info == ToolErrorInfo(
        "ToolArgsError", "INVALID_ARGS"
    )
    assert ran == []
    # malformed JSON from the model arrives as the raw string and fails validation
    result = await tools.execute(call(name="read", arguments="{not json"))
    assert text_of(result) == 'Error: invalid arguments: "arguments" must be an object'


async def test_thrown_errors_become_results(tools: ToolRuntime) -> None:
    class Coded(DshError):
        code = "MY_CODE"

    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    errors: dict[str, Exception] = {
        "plain": ValueError("bad value"),
        "coded": Coded("coded failure"),
        "hostile": Hostile(),
    }

    async def body(args: Any, exec: ToolExecution) -> Any:
        raise errors[args["text"]]

    tools.register(echo_tool(body=body))
    plain = await tools.execute(call(arguments={"text": "plain"}))
    assert text_of(plain) == "Error: bad value"
    assert plain.error is not None and plain.error.info is None
    coded = await tools.execute(call(arguments={"text": "coded"}))
    assert coded.error is not None and coded.error.info == ToolErrorInfo("Coded", "MY_CODE")
    hostile = await tools.execute(call(arguments={"text": "hostile"}))
    assert text_of(hostile) == "Error: <unprintable thrown value>"


async def test_invalid_output_is_reported_before_post_execute(
    host: PluginHost, tools: ToolRuntime
) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        return 42  # text_output() requires a string

    tools.register(echo_tool(body=body))
    posts: list[ToolExecutionResult] = []

    async def post(p: PostExecuteContext, next: Any) -> Any:
        posts.append(p.result)
        return await next()

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert text_of(result) == 'Error: tool "echo" returned invalid output: "value" must be a string'
    assert posts[0].error is not None
    assert posts[0].error.info == ToolErrorInfo("ToolOutputError", "INVALID_TOOL_OUTPUT")


async def test_non_json_arguments_win_over_a_cancelled_caller(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())
    rec = Recorder(host)
    token = CancelToken()
    token.abort("user")
    result = await tools.execute(call(arguments={"text": float("nan")}, signal=token))
    assert text_of(result) == (
        "Error: tool execution arguments must be losslessly JSON-serializable"
    )
    assert rec.stages == []
    assert len(rec.results) == 1


# --------------------------------------------------------------------------- pre-execute


async def test_deny_skips_execute_but_runs_post(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    rec = Recorder(host)

    async def deny(exec: ToolExecution, next: Any) -> Any:
        return Deny("not today")

    host.ctx.on("tools/pre-execute", deny)
    result = await tools.execute(call())
    assert text_of(result) == "Error: not today"
    assert result.error is not None
    assert result.error.message == "not today" and result.error.info is None
    assert rec.stages == ["pre", "post"]


async def test_mapping_decisions_are_accepted(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())

    async def deny(exec: ToolExecution, next: Any) -> Any:
        return {"kind": "deny", "reason": "by rule"}

    host.ctx.on("tools/pre-execute", deny)
    result = await tools.execute(call())
    assert text_of(result) == "Error: by rule"


async def test_throwing_pre_execute_is_a_final_result(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    rec = Recorder(host)

    async def boom(exec: ToolExecution, next: Any) -> Any:
        raise RuntimeError("gate interrupted")

    host.ctx.on("tools/pre-execute", boom)
    result = await tools.execute(call())
    assert text_of(result) == "Error: gate interrupted"
    assert result.error is not None and result.error.message == "gate interrupted"
    assert rec.stages == ["pre"]  # no execute, no post
    assert len(rec.results) == 1


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("hook says ask", "Error: hook says ask"),
        (None, 'Error: tool "echo" requires approval (not yet supported)'),
    ],
)
async def test_ask_without_approval_fails_closed(
    host: PluginHost, tools: ToolRuntime, reason: str | None, expected: str
) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(echo_tool(body=body))

    async def ask(exec: ToolExecution, next: Any) -> Any:
        return Ask(reason)

    host.ctx.on("tools/pre-execute", ask)
    result = await tools.execute(call())
    assert text_of(result) == expected
    assert ran == []


class FakeAgent:
    id = "agent-1"
    session = None


class FakeApproval:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.requests: list[ApprovalRequest] = []

    async def request(self, req: ApprovalRequest) -> Any:
        self.requests.append(req)
        return self.outcome


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("allowed-once", "ok"),
        ("rejected", 'Error: the user rejected tool "echo"'),
        ("cancelled", 'Error: approval for tool "echo" was cancelled'),
        (
            "unavailable",
            'Error: tool "echo" requires approval, but no approval channel is available',
        ),
    ],
)
async def test_each_approval_outcome_maps_to_its_text(
    host: PluginHost, tools: ToolRuntime, outcome: str, expected: str
) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        return "ok"

    tools.register(echo_tool(body=body))
    approval = FakeApproval(outcome)
    host.ctx.provide("approval", approval)

    async def ask(exec: ToolExecution, next: Any) -> Any:
        return Ask("why")

    host.ctx.on("tools/pre-execute", ask)
    result = await tools.execute(call(agent=FakeAgent()))
    assert text_of(result) == expected
    [request] = approval.requests
    assert (request.tool_name, request.call_id, request.reason) == ("echo", "call-1", "why")


async def test_agentless_ask_denies_without_asking(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    approval = FakeApproval("allowed-once")
    host.ctx.provide("approval", approval)

    async def ask(exec: ToolExecution, next: Any) -> Any:
        return Ask()

    host.ctx.on("tools/pre-execute", ask)
    result = await tools.execute(call())
    assert text_of(result) == (
        'Error: tool "echo" requires approval, but the call has no agent to route it through'
    )
    assert approval.requests == []


async def test_rogue_approval_outcome_is_an_error(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    host.ctx.provide("approval", FakeApproval("allow-always"))

    async def ask(exec: ToolExecution, next: Any) -> Any:
        return Ask()

    host.ctx.on("tools/pre-execute", ask)
    result = await tools.execute(call(agent=FakeAgent()))
    assert result.is_error
    assert "unreachable" in text_of(result)


async def test_guards_are_monotonic(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    order: list[str] = []

    def first(exec: ToolExecution) -> str | None:
        order.append("first")
        return None

    def second(exec: ToolExecution) -> str | None:
        order.append("second")
        return "guarded"

    def third(exec: ToolExecution) -> str | None:
        order.append("third")
        return None

    for guard in (first, second, third):
        tools.guard(guard)

    async def allow(exec: ToolExecution, next: Any) -> Any:
        await next()
        return Allow()  # a later "allow" cannot reopen what a guard closes

    host.ctx.on("tools/pre-execute", allow)
    result = await tools.execute(call())
    assert text_of(result) == "Error: guarded"
    assert order == ["first", "second"]


async def test_guards_do_not_run_after_deny(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    called: list[bool] = []

    def guard(exec: ToolExecution) -> str | None:
        called.append(True)
        return None

    tools.guard(guard)

    async def deny(exec: ToolExecution, next: Any) -> Any:
        return Deny("no")

    host.ctx.on("tools/pre-execute", deny)
    await tools.execute(call())
    assert called == []


# --------------------------------------------------------------------------- cancellation


async def test_pre_aborted_call_runs_no_stage(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())
    rec = Recorder(host)
    token = CancelToken()
    token.abort("user")
    result = await tools.execute(call(signal=token))
    assert text_of(result) == "Error: tool call aborted before dispatch"
    assert result.error is not None and result.error.info == BEFORE
    assert rec.stages == []
    assert len(rec.results) == 1
    assert rec.results[0].exec.signal is token


async def test_cancel_during_pre_execute(host: PluginHost, tools: ToolRuntime) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(echo_tool(body=body))
    token = CancelToken()

    async def cancel_then_allow(exec: ToolExecution, next: Any) -> Any:
        token.abort("user")
        return await next()

    host.ctx.on("tools/pre-execute", cancel_then_allow)
    result = await tools.execute(call(signal=token))
    assert result.error is not None and result.error.info == BEFORE
    assert ran == []


async def test_denial_settling_after_cancel_is_preserved(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())
    token = CancelToken()

    async def cancel_and_deny(exec: ToolExecution, next: Any) -> Any:
        token.abort("user")
        return Deny("still no")

    host.ctx.on("tools/pre-execute", cancel_and_deny)
    result = await tools.execute(call(signal=token))
    assert text_of(result) == "Error: still no"


async def test_cancellation_overtaking_approval(host: PluginHost, tools: ToolRuntime) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(echo_tool(body=body))
    token = CancelToken()

    class WaitingApproval:
        async def request(self, req: ApprovalRequest) -> str:
            assert req.signal is not None
            await req.signal.wait()
            return "cancelled"

    host.ctx.provide("approval", WaitingApproval())

    async def ask(exec: ToolExecution, next: Any) -> Any:
        return Ask()

    host.ctx.on("tools/pre-execute", ask)
    async with anyio.create_task_group() as tg:
        results: list[ToolExecutionResult] = []

        async def run() -> None:
            results.append(await tools.execute(call(signal=token, agent=FakeAgent())))

        tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        token.abort("user")
    assert results[0].error is not None and results[0].error.info == BEFORE
    assert ran == []


async def test_started_body_is_awaited_and_becomes_outcome_unknown(tools: ToolRuntime) -> None:
    token = CancelToken()
    events: list[str] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        events.append("started")
        token.abort("user")
        # uncooperative: keeps going after the abort, and is still awaited
        await anyio.lowlevel.checkpoint()
        events.append("finished")
        return "late success"

    tools.register(echo_tool(body=body))
    result = await tools.execute(call(signal=token))
    assert events == ["started", "finished"]
    # never a success, never "not started": the notice, then what the body returned
    assert [b.text if isinstance(b, TextBlock) else b for b in result.content] == [
        STOPPED_OUTCOME_UNKNOWN_TEXT,
        "What the tool returned when it stopped:",
        "late success",
    ]
    assert result.is_error
    assert result.error is not None and result.error.info == AFTER


async def test_body_error_after_cancel_is_preserved(tools: ToolRuntime) -> None:
    token = CancelToken()

    async def body(args: Any, exec: ToolExecution) -> Any:
        token.abort("user")
        raise RuntimeError("disk full")

    tools.register(echo_tool(body=body))
    result = await tools.execute(call(signal=token))
    assert text_of(result) == "Error: disk full"


async def test_body_that_stops_on_its_abort_is_recorded_outcome_unknown(
    tools: ToolRuntime,
) -> None:
    # A body that started and then gave up because its call was cancelled (it raises
    # AbortError, as bash does after killing its command) may have done part of its work:
    # D18 records that as outcome unknown, never as a plain "aborted".
    token = CancelToken()

    async def body(args: Any, exec: ToolExecution) -> Any:
        token.abort("user")
        raise AbortError()

    tools.register(echo_tool(body=body))
    result = await tools.execute(call(signal=token))
    assert text_of(result) == STOPPED_OUTCOME_UNKNOWN_TEXT
    assert result.error is not None and result.error.info == AFTER


async def test_wrapper_with_aborted_signal_prevents_dispatch(
    host: PluginHost, tools: ToolRuntime
) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(echo_tool(body=body))
    caller = CancelToken()

    async def replace_signal(exec: ToolExecution, next: Any) -> Any:
        original = exec.signal
        dead = CancelToken()
        dead.abort("timeout")
        exec.signal = dead
        try:
            return await next()
        finally:
            exec.signal = original

    host.ctx.on("tools/execute", replace_signal)
    result = await tools.execute(call(signal=caller))
    assert result.error is not None and result.error.info == BEFORE
    assert ran == []
    seen = []
    host.ctx.on("tools/result", lambda event: seen.append(event.exec.signal))
    await tools.execute(call(signal=caller))
    assert seen == [caller]


async def test_caller_cancellation_is_fused_into_a_wrapper_signal(
    host: PluginHost, tools: ToolRuntime
) -> None:
    caller = CancelToken()
    body_tokens: list[CancelToken] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        body_tokens.append(exec.signal)
        caller.abort("user")
        return "x"

    tools.register(echo_tool(body=body))

    async def replace_signal(exec: ToolExecution, next: Any) -> Any:
        exec.signal = CancelToken()
        return await next()

    host.ctx.on("tools/execute", replace_signal)
    result = await tools.execute(call(signal=caller))
    assert body_tokens[0].aborted  # the body saw the caller's abort through the fused token
    assert result.error is not None and result.error.info == AFTER


async def test_wrapper_short_circuit_success_after_cancel(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())
    token = CancelToken()

    async def short(exec: ToolExecution, next: Any) -> Any:
        token.abort("user")
        return ToolExecutionResult.success("cached", [TextBlock(text="cached")])

    host.ctx.on("tools/execute", short)
    result = await tools.execute(call(signal=token))
    assert result.error is not None and result.error.info == BEFORE


async def test_throwing_wrapper_is_final_and_body_never_runs(
    host: PluginHost, tools: ToolRuntime
) -> None:
    ran: list[bool] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append(True)
        return "x"

    tools.register(echo_tool(body=body))
    rec = Recorder(host)

    async def flush_fails(exec: ToolExecution, next: Any) -> Any:
        raise OSError("disk unavailable")

    host.ctx.on("tools/execute", flush_fails)
    result = await tools.execute(call())
    assert text_of(result) == "Error: disk unavailable"
    assert ran == []
    assert rec.stages == ["pre", "execute"]


async def test_checkpoint_style_wrapper_returns_canonical_abort(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())
    token = CancelToken()

    async def checkpoint(exec: ToolExecution, next: Any) -> Any:
        if exec.agent is None or exec.parent is not None:
            return await next()
        token.abort("user")  # cancelled while "flushing"
        if exec.signal.aborted:
            return aborted_before_dispatch_result()
        return await next()

    host.ctx.on("tools/execute", checkpoint)
    result = await tools.execute(call(signal=token, agent=FakeAgent()))
    assert text_of(result) == "Error: tool call aborted before dispatch"


# --------------------------------------------------------------------------- post-execute


async def test_post_execute_replaces_content_but_keeps_value(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())

    async def post(p: PostExecuteContext, next: Any) -> Any:
        return Accept(content=[TextBlock(text="rewritten")])

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert text_of(result) == "rewritten"
    assert result.value == "hi"


async def test_post_execute_value_replacement_rerenders(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())

    async def post(p: PostExecuteContext, next: Any) -> Any:
        return Accept(value="replaced")

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert (result.value, text_of(result)) == ("replaced", "replaced")


async def test_post_execute_both_is_a_type_error(host: PluginHost, tools: ToolRuntime) -> None:
    tools.register(echo_tool())

    async def post(p: PostExecuteContext, next: Any) -> Any:
        return Accept(content=[TextBlock(text="x")], value="y")

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert text_of(result) == (
        "Error: tools/post-execute accept decision cannot replace both value and content"
    )


async def test_post_execute_block_discards_deferred_contexts(
    host: PluginHost, tools: ToolRuntime
) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        exec.defer_context(user_message("from body"))
        return "x"

    tools.register(echo_tool(body=body))

    async def post(p: PostExecuteContext, next: Any) -> Any:
        assert [m.id for m in p.result.additional_contexts] == ["ctx-from body"]
        return Block(
            [TextBlock(text="line one"), TextBlock(text="line two")], [user_message("from policy")]
        )

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert result.is_error
    assert result.value is UNSET
    assert result.error is not None and result.error.message == "line one\nline two"
    assert [m.id for m in result.additional_contexts] == ["ctx-from policy"]


async def test_accept_keeps_contexts_in_order(host: PluginHost, tools: ToolRuntime) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        exec.defer_context(user_message("deferred"))
        return "x"

    tools.register(echo_tool(body=body))

    async def post(p: PostExecuteContext, next: Any) -> Any:
        return Accept(additional_contexts=[user_message("post")])

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert [m.id for m in result.additional_contexts] == ["ctx-deferred", "ctx-post"]


async def test_throwing_post_listener_is_an_error_result(
    host: PluginHost, tools: ToolRuntime
) -> None:
    tools.register(echo_tool())

    async def post(p: PostExecuteContext, next: Any) -> Any:
        raise RuntimeError("policy crashed")

    host.ctx.on("tools/post-execute", post)
    result = await tools.execute(call())
    assert text_of(result) == "Error: policy crashed"


async def test_finalize_content_runs_exactly_once_even_on_failure(
    host: PluginHost, tools: ToolRuntime
) -> None:
    calls: list[bool] = []

    def finalize(exec: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(result.is_error)
        return [TextBlock(text="final: " + text_of(result))]

    tools.register(echo_tool(finalize_content=finalize))

    async def boom(exec: ToolExecution, next: Any) -> Any:
        raise RuntimeError("gate")

    off = host.ctx.on("tools/pre-execute", boom)
    result = await tools.execute(call())
    assert text_of(result) == "final: Error: gate"
    assert calls == [True]
    off()
    calls.clear()

    def raising(exec: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(True)
        raise ValueError("finalizer broke")

    tools.register(echo_tool("other", finalize_content=raising))
    result = await tools.execute(call(name="other"))
    assert text_of(result) == "Error: finalizer broke"
    assert calls == [True]


async def test_concluded_turn_and_presentation_meta(tools: ToolRuntime) -> None:
    async def body(args: Any, exec: ToolExecution) -> Any:
        exec.conclude_turn()
        return {"n": 1}

    definition = ToolDefinition(
        name="done",
        description="",
        parameters={"type": "object"},
        execute=body,
        output=ToolOutput(
            schema={"type": "object"},
            render=lambda args, value: [TextBlock(text="done")],
            presentation_meta=lambda args, value: {"card": value["n"]},
        ),
    )
    tools.register(definition)
    top = await tools.execute(call(name="done", arguments={}))
    assert top.concludes_turn
    assert top.meta == {"card": 1}


async def test_nested_calls_get_no_presentation_meta(tools: ToolRuntime) -> None:
    seen_parents: list[Any] = []

    async def inner(args: Any, exec: ToolExecution) -> Any:
        seen_parents.append(exec.parent)
        return "inner"

    async def outer(args: Any, exec: ToolExecution) -> Any:
        nested = await tools.execute(
            call(
                name="inner",
                arguments={},
                call_id=f"{exec.call_id}:1",
                parent=exec.token,
                root_call_id=exec.root_call_id,
                signal=exec.signal,
            )
        )
        return text_of(nested)

    out = text_output()
    meta_output = ToolOutput(
        schema=out.schema, render=out.render, presentation_meta=lambda a, v: {"m": v}
    )
    tools.register(
        ToolDefinition(
            name="inner",
            description="",
            parameters={"type": "object"},
            execute=inner,
            output=meta_output,
        )
    )
    tools.register(echo_tool("outer", outer))
    metas: list[Any] = []
    tools._ctx.on("tools/result", lambda event: metas.append((event.exec.name, event.result.meta)))
    result = await tools.execute(call(name="outer", arguments={}))
    assert text_of(result) == "inner"
    assert seen_parents[0] is not None
    assert metas == [("inner", UNSET), ("outer", UNSET)]
    direct = await tools.execute(call(name="inner", arguments={}))
    assert direct.meta == {"m": "inner"}


# --------------------------------------------------------------------------- registry


async def test_registration_rules(host: PluginHost, tools: ToolRuntime) -> None:
    changes: list[bool] = []
    host.ctx.on("tools/change", lambda: changes.append(True))
    off = tools.register(echo_tool())
    with pytest.raises(ToolRegistrationError, match='tool "echo" is already registered'):
        tools.register(echo_tool())
    with pytest.raises(ToolRegistrationError, match='tool name "run_code" is reserved'):
        tools.register(echo_tool("run_code"))
    with pytest.raises(ToolRegistrationError, match="timeoutMs must be a positive finite number"):
        tools.register(echo_tool("slow", timeout_ms=0))
    with pytest.raises(UnsupportedSchemaError, match="pattern is not a supported keyword"):
        tools.register(
            echo_tool(
                "bad",
                parameters={
                    "type": "object",
                    "properties": {"p": {"type": "string", "pattern": "x"}},
                },
            )
        )
    with pytest.raises(ToolRegistrationError, match="must declare output"):
        tools.register(
            ToolDefinition(
                name="noout",
                description="",
                parameters={"type": "object"},
                execute=echo_tool().execute,
                output=None,  # type: ignore[arg-type]
            )
        )
    assert tools.names() == ["echo"]
    off()
    assert tools.names() == []
    assert changes == [True, True]


async def test_schemas_are_sorted_and_carry_no_callbacks(tools: ToolRuntime) -> None:
    for name in ("zeta", "alpha", "mid"):
        tools.register(echo_tool(name, timeout_ms=5))
    schemas = tools.schemas()
    assert [s.name for s in schemas] == ["alpha", "mid", "zeta"]
    assert set(type(schemas[0]).__struct_fields__) == {"name", "description", "parameters"}


async def test_registration_is_undone_with_its_plugin(host: PluginHost) -> None:
    from dsh_host import Row

    await host.mount([Row(id="extra", name="tools.tool_plugins:RegistersEcho")])
    assert host.ctx.tools.names() == ["echo"]
    await host.unload("extra")
    assert host.ctx.tools.names() == []


async def test_execution_mode(tools: ToolRuntime) -> None:
    def classifier(args: Any) -> Any:
        if args.get("text") == "boom":
            raise RuntimeError("x")
        return {"yes": True, "truthy": 1}.get(args.get("text", ""), False)

    tools.register(echo_tool(is_concurrency_safe=classifier))
    assert tools.execution_mode(call(arguments={"text": "yes"})) == "parallel"
    assert tools.execution_mode(call(arguments={"text": "truthy"})) == "exclusive"
    assert tools.execution_mode(call(arguments={"text": "boom"})) == "exclusive"
    assert tools.execution_mode(call(arguments={"text": 5})) == "exclusive"  # invalid args
    assert tools.execution_mode(call(name="missing")) == "exclusive"


async def test_signal_is_read_only_outside_dispatch(tools: ToolRuntime) -> None:
    captured: list[ToolExecution] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        captured.append(exec)
        return "x"

    tools.register(echo_tool(body=body))
    await tools.execute(call())
    with pytest.raises(AttributeError):
        captured[0].signal = CancelToken()
    with pytest.raises(AttributeError):
        captured[0].name = "other"
