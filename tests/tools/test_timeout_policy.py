"""The ``timeout-policy`` row (issue 14 item 4, DSH ``guard/timeout-policy``): a tool's budget
asks the body to stop through its token, awaits it, and records ``TOOL_TIMEOUT`` telling the
model whether the call may have partly run. Real hosts; the ``bash`` cases run real processes and
look for them from the host afterwards."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import CancelToken, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._session.events import ToolErrorData, ToolResultData
from dsh_host._session.messages import TextBlock, ToolResultBlock, ToolResultMessage
from dsh_host._tools import ToolErrorInfo, ToolExecution, ToolExecutionResult, ToolRuntime
from dsh_host.errors import ConfigError

from .tools_helpers import call, echo_tool, text_of

# both backends: timeouts
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

TIMEOUT_INFO = ToolErrorInfo("ToolTimeoutError", "TOOL_TIMEOUT")
#: what the runtime records for a started body the caller cancelled (D18)
STOPPED_INFO = ToolErrorInfo("ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN")
STARTED = (
    "The tool had started, so it may have partly run: its outcome is unknown. Retry only if "
    "the operation is read-only or idempotent; otherwise check its effects first."
)
NOT_STARTED = "The tool did not start. Retry it if it is still needed."


@asynccontextmanager
async def policy_host(*rows: Row, **config: Any) -> AsyncIterator[PluginHost]:
    policy = Row(name="timeout-policy", config=config) if config else Row(name="timeout-policy")
    async with open_host([Row(name="tools"), policy, *rows]) as host:
        yield host


def runtime(host: PluginHost) -> ToolRuntime:
    tools: ToolRuntime = host.ctx.tools
    return tools


class Cooperative:
    """A body that waits until its token aborts, then cleans up (and says so)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.cleaned_up = False
        self.reason: Any = None

    async def __call__(self, args: Any, exec: ToolExecution) -> Any:
        self.entered.set()
        self.reason = await exec.signal.wait()
        await anyio.sleep(0.05)  # cleanup takes a moment; the policy must wait for it
        self.cleaned_up = True
        return "stopped cooperatively"


async def test_a_declared_budget_stops_the_body_and_records_tool_timeout() -> None:
    body = Cooperative()
    async with policy_host() as host:
        runtime(host).register(echo_tool("slow", body, timeout_ms=100))
        result = await runtime(host).execute(call("slow"))
    assert body.cleaned_up, "the body was awaited, not abandoned"
    assert str(body.reason) == "tool call timed out after 100ms"
    assert result.is_error
    assert result.error is not None
    assert result.error.message == "tool call timed out after 100ms"
    assert result.error.info == TIMEOUT_INFO
    assert text_of(result) == f"Error: tool call timed out after 100ms\n{STARTED}"


async def test_a_tool_without_a_budget_is_delegated_untouched() -> None:
    body = Cooperative()
    async with policy_host(toolTimeoutMs={"other": 50}) as host:
        runtime(host).register(echo_tool("free", body))
        token = CancelToken()
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                results.append(await runtime(host).execute(call("free", signal=token)))

            results: list[ToolExecutionResult] = []
            tg.start_soon(go)
            await body.entered.wait()
            await anyio.sleep(0.2)  # four times the other tool's budget: nothing fires here
            assert not body.cleaned_up
            token.abort("user")
    [result] = results
    assert result.error is not None and result.error.info == STOPPED_INFO


async def test_a_fast_budgeted_tool_keeps_its_own_result() -> None:
    async with policy_host() as host:
        runtime(host).register(echo_tool("fast", timeout_ms=10_000))
        result = await runtime(host).execute(call("fast", {"text": "ok"}))
    assert not result.is_error and text_of(result) == "ok"


async def test_a_caller_cancel_before_the_deadline_keeps_the_runtime_s_result() -> None:
    body = Cooperative()
    token = CancelToken()
    results: list[ToolExecutionResult] = []
    async with policy_host() as host:
        runtime(host).register(echo_tool("slow", body, timeout_ms=60_000))
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                results.append(await runtime(host).execute(call("slow", signal=token)))

            tg.start_soon(go)
            await body.entered.wait()
            token.abort("user")
    [result] = results
    assert result.error is not None and result.error.info == STOPPED_INFO


async def test_a_caller_cancel_after_the_deadline_keeps_tool_timeout() -> None:
    release = anyio.Event()
    saw_abort = anyio.Event()

    async def slow_cleanup(args: Any, exec: ToolExecution) -> Any:
        await exec.signal.wait()
        saw_abort.set()
        await release.wait()
        return "cleanup complete"

    token = CancelToken()
    results: list[ToolExecutionResult] = []
    async with policy_host() as host:
        runtime(host).register(echo_tool("slow", slow_cleanup, timeout_ms=50))
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                results.append(await runtime(host).execute(call("slow", signal=token)))

            tg.start_soon(go)
            await saw_abort.wait()
            token.abort("user")  # too late to turn the timeout into a user cancel
            release.set()
    [result] = results
    assert result.error is not None and result.error.info == TIMEOUT_INFO


async def test_a_deadline_before_the_body_says_it_did_not_start() -> None:
    ran: list[str] = []

    async def body(args: Any, exec: ToolExecution) -> Any:
        ran.append("body")
        return "ran"

    async with policy_host() as host:
        runtime(host).register(echo_tool("gated", body, timeout_ms=50))

        async def inner(exec: ToolExecution, next_: Any) -> Any:
            await exec.signal.wait()  # an inner wrapper (say a slow checkpoint) eats the budget
            return await next_()

        host.ctx.on("tools/execute", inner)
        result = await runtime(host).execute(call("gated"))
    assert ran == []
    assert result.error is not None and result.error.info == TIMEOUT_INFO
    assert text_of(result) == f"Error: tool call timed out after 50ms\n{NOT_STARTED}"


async def test_the_row_budget_overrides_the_declared_one_and_the_dsh_name_loads() -> None:
    body = Cooperative()
    rows = [
        Row(name="tools"),
        Row(
            name="@deepseek-ai/dsh-tool-call-timeout-policy",
            config={"toolTimeoutMs": {"slow": 80}},
        ),
    ]
    async with open_host(rows) as host:
        runtime(host).register(echo_tool("slow", body, timeout_ms=600_000))
        result = await runtime(host).execute(call("slow"))
    assert text_of(result).startswith("Error: tool call timed out after 80ms\n")


async def test_a_bad_budget_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"timeout-policy.*tool_timeout_ms"):
        async with policy_host(toolTimeoutMs={"bash": 0}):
            pass
    with pytest.raises(ConfigError, match="tool_timeout_ms keys must be tool names"):
        async with policy_host(toolTimeoutMs={" ": 10}):
            pass


# --------------------------------------------------------------------------- real bash


def processes_with(marker: str) -> list[int]:
    """Pids on this host whose command line contains ``marker`` (any pid namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def bash_rows(tmp_path: Path, mode: str) -> list[Row]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    rows = [] if mode == "danger-full-access" else [Row(name="sandbox-local")]
    settings = {"workspace": str(workspace), "sandbox": mode}
    return [*rows, Row(name="builtin-tools", config=settings)]


@pytest.mark.parametrize("mode", ["danger-full-access", "workspace-write"])
async def test_a_sleeping_bash_past_its_budget_is_killed_and_recorded(
    tmp_path: Path, mode: str
) -> None:
    marker = f"6{os.getpid() % 1000}.{abs(hash(str(tmp_path))) % 10**6:06d}"
    started = tmp_path / "ws" / "started"
    async with policy_host(*bash_rows(tmp_path, mode), toolTimeoutMs={"bash": 1500}) as host:
        command = f"echo started > {started}; exec sleep {marker}"
        result = await runtime(host).execute(
            call("bash", {"command": command, "description": "sleep past the budget"})
        )
        still_running = processes_with(marker)
    assert started.read_text() == "started\n", "the body ran before the deadline"
    assert result.error is not None and result.error.info == TIMEOUT_INFO, text_of(result)
    assert text_of(result) == f"Error: tool call timed out after 1500ms\n{STARTED}"
    assert still_running == [], "the sleep process outlived its call"


async def test_bash_s_own_shorter_timeout_keeps_its_output(tmp_path: Path) -> None:
    rows = bash_rows(tmp_path, "danger-full-access")
    async with policy_host(*rows, toolTimeoutMs={"bash": 60_000}) as host:
        result = await runtime(host).execute(
            call(
                "bash",
                {"command": "echo partial; exec sleep 30", "description": "d", "timeoutMs": 300},
            )
        )
    assert not result.is_error
    assert text_of(result).startswith("partial\n")
    assert "[timed out after 300ms]" in text_of(result)


async def test_the_timeout_is_durable_and_the_model_reads_it(tmp_path: Path) -> None:
    responses = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "id": "c1",
                    "arguments": {"command": "exec sleep 30", "description": "wait"},
                }
            ]
        },
        {"text": "the command timed out"},
    ]
    rows = [
        Row(name="sessions"),
        Row(name="llm"),
        *bash_rows(tmp_path, "danger-full-access"),
        Row(id="model", name="llm-scripted", config={"responses": responses}),
        Row(name="agent", config={"provider": "scripted", "model": "scripted"}),
    ]
    async with policy_host(*rows, toolTimeoutMs={"bash": 200}) as host:
        agent = host.ctx.agent.create()
        await agent.run_turn("run it")
        events = list(agent.session.events)
        messages = list(agent.session.derive_messages())
    [result] = [e.data for e in events if e.type == "tool/result"]
    assert isinstance(result, ToolResultData) and isinstance(result.error, ToolErrorData)
    assert (result.error.name, result.error.code) == ("ToolTimeoutError", "TOOL_TIMEOUT")
    [answer] = [m for m in messages if isinstance(m, ToolResultMessage)]
    block = answer.content[0]
    assert isinstance(block, ToolResultBlock) and block.is_error is True
    assert block.content == (TextBlock(text=f"Error: tool call timed out after 200ms\n{STARTED}"),)
