"""``timeout-policy``: enforce each tool's ``timeoutMs`` budget (DSH's tool-call timeout policy).

One ``tools/execute`` around-dispatch listener. For a call whose tool has a
budget -- the row's ``toolTimeoutMs`` entry for that tool name if there is one,
else the tool's own :attr:`~dsh_host._tools.ToolDefinition.timeout_ms` -- it

1. fuses the caller's token with a deadline token and installs the fused token
   as ``exec.signal`` for the downstream dispatch (the body sees it), restoring
   the caller's token afterwards;
2. arms a timer that aborts the deadline token after the budget. That only
   *asks* the body to stop: the body is awaited, never abandoned (``bash``
   SIGTERMs, then SIGKILLs its process group and waits for it);
3. when the dispatch settles and it was this timer that aborted the call (not
   the caller's own cancellation), replaces the result with ``TOOL_TIMEOUT``:
   ``Error: tool call timed out after <ms>ms`` plus a line saying whether the
   body had started (then it may have partly run: its outcome is unknown) or
   not.

A tool without a budget is delegated untouched. A timeout after the caller
cancelled keeps the runtime's result (``TOOL_OUTCOME_UNKNOWN`` for a started
body, D18); a caller cancelling after the timeout fired keeps ``TOOL_TIMEOUT``
(the first cause wins).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Final

import anyio
import msgspec

from dsh_host.sdk import (
    TOOLS,
    TOOLS_EXECUTE,
    CancelToken,
    Context,
    Plugin,
    TextBlock,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionResult,
    fuse,
)

__all__ = [
    "TOOL_TIMEOUT",
    "TimeoutPolicy",
    "TimeoutPolicyConfig",
    "ToolTimeout",
    "tool_timeout_result",
]

#: The error code of the replacement result (DSH's constant, also the deadline's identity).
TOOL_TIMEOUT: Final = "TOOL_TIMEOUT"
#: Model-visible second line when the body had been invoked.
STARTED_NOTE: Final = (
    "The tool had started, so it may have partly run: its outcome is unknown. Retry only if "
    "the operation is read-only or idempotent; otherwise check its effects first."
)
#: Model-visible second line when the deadline fired before the body was invoked.
NOT_STARTED_NOTE: Final = "The tool did not start. Retry it if it is still needed."

_Budget = Annotated[int, msgspec.Meta(gt=0)]


class TimeoutPolicyConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``timeout-policy`` row (optional; DSH's plugin takes none).

    ``tool_timeout_ms`` (DSH spelling ``toolTimeoutMs`` accepted, D21): tool name -> budget
    in milliseconds. An entry overrides
    the tool's declared ``timeoutMs`` or gives one to a tool that declares
    none. A name no tool has is not an error (tools may register later).
    """

    tool_timeout_ms: dict[str, _Budget] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.tool_timeout_ms:
            if not name.strip():
                raise ValueError("tool_timeout_ms keys must be tool names, got an empty name")


@dataclass(frozen=True, slots=True)
class ToolTimeout:
    """The abort reason a body sees on ``exec.signal`` when its budget ran out."""

    timeout_ms: float

    def __str__(self) -> str:
        return f"tool call timed out after {_ms(self.timeout_ms)}ms"


def _ms(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def tool_timeout_result(timeout_ms: float, *, started: bool) -> ToolExecutionResult:
    """The ``TOOL_TIMEOUT`` result: DSH's message and code, and whether the body had started."""
    message = str(ToolTimeout(timeout_ms))
    note = STARTED_NOTE if started else NOT_STARTED_NOTE
    return ToolExecutionResult.failure(
        message,
        info=ToolErrorInfo("ToolTimeoutError", TOOL_TIMEOUT),
        content=[TextBlock(text=f"Error: {message}\n{note}")],
    )


Next = Callable[[], Awaitable[ToolExecutionResult]]


async def _dispatch_with_deadline(
    next_: Next, deadline: CancelToken, reason: ToolTimeout
) -> ToolExecutionResult:
    """``await next_()`` while a timer aborts ``deadline`` after the budget; never cuts it."""
    result: ToolExecutionResult | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as timers:

        async def fire() -> None:
            await anyio.sleep(reason.timeout_ms / 1000)
            deadline.abort(reason)

        timers.start_soon(fire)
        try:
            result = await next_()
        except Exception as exc:  # re-raised outside, so no task-group wrapping
            error = exc
        timers.cancel_scope.cancel()
    if error is not None:
        raise error
    assert result is not None
    return result


class TimeoutPolicy(Plugin):
    """Entry point ``timeout-policy`` (also ``tool-call-timeout-policy``, DSH's package name)."""

    name = "timeout-policy"
    inject = ("tools",)
    Config = TimeoutPolicyConfig

    def apply(self, ctx: Context, config: TimeoutPolicyConfig) -> None:
        tools = ctx.service(TOOLS)
        overrides = dict(config.tool_timeout_ms)

        def budget_of(name: str) -> float | None:
            if name in overrides:
                return float(overrides[name])
            definition = tools.get(name)
            declared = definition.timeout_ms if definition is not None else None
            if declared is None or not math.isfinite(declared) or declared <= 0:
                return None
            return float(declared)

        async def around_execute(exec_: ToolExecution, next_: Next) -> ToolExecutionResult:
            budget = budget_of(exec_.name)
            if budget is None:
                return await next_()
            reason = ToolTimeout(budget)
            deadline = CancelToken()
            upstream = exec_.signal
            derived, dispose = fuse(upstream, deadline)
            exec_.signal = derived
            try:
                result = await _dispatch_with_deadline(next_, deadline, reason)
            finally:
                dispose()
                exec_.signal = upstream
            if derived.aborted and derived.reason is reason:
                return tool_timeout_result(budget, started=tools.body_started(exec_))
            return result

        ctx.on(TOOLS_EXECUTE, around_execute)
