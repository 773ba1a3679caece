"""The plugin author's surface is typed: mypy --strict checks listeners and services (issue 17).

One mypy run over three files: the README's plugin example (must be clean), a plugin that uses
every typed accessor correctly (must be clean), and one with a wrong listener or service type
on each marked line (each must be reported, and nothing else).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from docs.test_readme import block_starting_with

REPO = Path(__file__).resolve().parents[2]

GOOD = '''
from collections.abc import AsyncIterator

from dsh_host import Context, Emit, Next, Plugin, StreamNext
from dsh_host._agent import AGENT, AGENT_PRE_STEP, AGENT_TURN_STOPPING, AgentService
from dsh_host._agent import PreStepContext, PreStepDecision, TurnStoppingContext
from dsh_host._llm import LLM, LLM_STREAM, LlmRequest, LlmRuntime
from dsh_host._session import SESSION_EVENT, SESSION_FLUSH, SESSIONS, Session, SessionEvent
from dsh_host._session import SessionStore
from dsh_host._session.messages import StreamChunk
from dsh_host._tools import TOOLS, TOOLS_EXECUTE, ToolExecution, ToolExecutionResult, ToolRuntime

PINGED: Emit[[str, int]] = Emit("good/pinged", 2)


class Good(Plugin):
    name = "good"

    def apply(self, ctx: Context, config: object) -> None:
        runtime: ToolRuntime = ctx.service(TOOLS)
        store: SessionStore = ctx.service(SESSIONS)
        llm: LlmRuntime | None = ctx.get(LLM)
        agents: AgentService | None = ctx.get(AGENT)
        untyped = ctx.tools  # attribute access still works (Any)
        del runtime, store, llm, agents, untyped

        async def around(exec_: ToolExecution, next_: Next[ToolExecutionResult]) -> ToolExecutionResult:
            return await next_()

        def observe(session: Session, event: SessionEvent) -> None:
            pass

        async def flushed(session: Session) -> None:
            pass

        async def pre_step(ctx_: PreStepContext, next_: Next[PreStepDecision]) -> PreStepDecision:
            return await next_()

        async def stopping(turn: TurnStoppingContext) -> None:
            pass

        def relay(request: LlmRequest, next_: StreamNext[StreamChunk]) -> AsyncIterator[StreamChunk]:
            return next_()

        def pinged(text: str, count: int) -> None:
            pass

        ctx.on(TOOLS_EXECUTE, around)
        ctx.on(SESSION_EVENT, observe)
        ctx.on(SESSION_FLUSH, flushed)
        ctx.on(AGENT_PRE_STEP, pre_step)
        ctx.on(AGENT_TURN_STOPPING, stopping)
        ctx.on(LLM_STREAM, relay)
        ctx.declare_event(PINGED)
        ctx.on(PINGED, pinged)
        ctx.emit(PINGED, "hi", 1)
        ctx.on("tools/execute", around)  # by name: untyped, still accepted
'''

BAD = '''
from dsh_host import Context, Emit, Next, Plugin
from dsh_host._session import SESSION_EVENT, Session
from dsh_host._tools import TOOLS, TOOLS_EXECUTE, ToolExecution, ToolExecutionResult

PINGED: Emit[[str]] = Emit("bad/pinged", 1)


class Bad(Plugin):
    name = "bad"

    def apply(self, ctx: Context, config: object) -> None:
        async def returns_text(exec_: ToolExecution, next_: Next[ToolExecutionResult]) -> str:
            return "no"

        async def forgot_next(exec_: ToolExecution) -> ToolExecutionResult:
            raise NotImplementedError

        def one_argument(session: Session) -> None:
            pass

        ctx.on(TOOLS_EXECUTE, returns_text)  # BAD
        ctx.on(TOOLS_EXECUTE, forgot_next)  # BAD
        ctx.on(SESSION_EVENT, one_argument)  # BAD
        count: int = ctx.service(TOOLS)  # BAD
        ctx.emit(PINGED, 3)  # BAD
'''


def test_mypy_strict_checks_the_typed_plugin_surface(tmp_path: Path) -> None:
    (tmp_path / "readme_tool_audit.py").write_text(block_starting_with("# tool_audit.py"))
    (tmp_path / "good_plugin.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad_plugin.py").write_text(textwrap.dedent(BAD))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--no-color-output",
            "--cache-dir",
            # Its own cache: test_quality's mypy run may write .mypy_cache at the same time
            # (another xdist worker), and mypy's cache is not safe for concurrent writers.
            str(REPO / ".mypy_cache" / "typed-plugins-test"),
            "readme_tool_audit.py",
            "good_plugin.py",
            "bad_plugin.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert errors, result.stdout + result.stderr  # mypy ran and reported something
    assert not [e for e in errors if not e.startswith("bad_plugin.py:")], result.stdout
    bad_lines = {
        number
        for number, line in enumerate(textwrap.dedent(BAD).splitlines(), start=1)
        if line.endswith("# BAD")
    }
    reported = {int(m.group(1)) for e in errors if (m := re.match(r"bad_plugin\.py:(\d+):", e))}
    assert reported == bad_lines, result.stdout
