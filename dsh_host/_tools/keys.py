"""The events of the tool-call pipeline and of approval: one typed key each.

The ``tools`` plugin declares the ``tools/*`` keys; ``approval/request`` is
defined here (its payload and outcome are this layer's types) and declared by
the approval service plugin, which dispatches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._bus import Emit, EventSpec, Waterfall
from dsh_host._context import ServiceKey

if TYPE_CHECKING:
    from .runtime import ToolRuntime
    from .types import (
        ApprovalProvider,
        ApprovalRequest,
        PostExecuteContext,
        PostToolDecision,
        PreToolDecision,
        ToolExecution,
        ToolExecutionResult,
        ToolProgress,
        ToolResultEvent,
    )

__all__ = [
    "APPROVAL",
    "APPROVAL_REQUEST",
    "TOOLS",
    "TOOLS_CHANGE",
    "TOOLS_EVENTS",
    "TOOLS_EXECUTE",
    "TOOLS_POST_EXECUTE",
    "TOOLS_PRE_EXECUTE",
    "TOOLS_PROGRESS",
    "TOOLS_RESULT",
]

#: The ``tools`` service.
TOOLS: ServiceKey[ToolRuntime] = ServiceKey("tools")
#: the approval seam (``user-approval`` provides it); absent, every ask fails closed
APPROVAL: ServiceKey[ApprovalProvider] = ServiceKey("approval")

TOOLS_PRE_EXECUTE: Waterfall[ToolExecution, PreToolDecision] = Waterfall(
    "tools/pre-execute", "(exec) -> PreToolDecision"
)
TOOLS_EXECUTE: Waterfall[ToolExecution, ToolExecutionResult] = Waterfall(
    "tools/execute", "(exec) -> tool result"
)
TOOLS_POST_EXECUTE: Waterfall[PostExecuteContext, PostToolDecision] = Waterfall(
    "tools/post-execute", "(post) -> PostToolDecision"
)
TOOLS_RESULT: Emit[[ToolResultEvent]] = Emit(
    "tools/result", 1, "(result record) after a call settled"
)
TOOLS_CHANGE: Emit[[]] = Emit("tools/change", 0, "() a tool was registered or unregistered")
#: A running tool's live output (``bash``'s stdout and stderr as they come), for a person to
#: watch: never logged (the result is), never waited for, and a listener that fails does not
#: reach the tool (the bus contains it).
TOOLS_PROGRESS: Emit[[ToolProgress]] = Emit(
    "tools/progress", 1, "(progress) a running tool's live output, never logged"
)

#: An answerer resolves to an :data:`~dsh_host._tools.types.ApprovalOutcome` or ``"deferred"``
#: (decided later, D19); the approval service resolves any other answer ``unavailable``.
APPROVAL_REQUEST: Waterfall[ApprovalRequest, str] = Waterfall(
    "approval/request", "(approval request) -> outcome"
)

#: Everything the ``tools`` plugin declares.
TOOLS_EVENTS: tuple[EventSpec, ...] = (
    TOOLS_PRE_EXECUTE,
    TOOLS_EXECUTE,
    TOOLS_POST_EXECUTE,
    TOOLS_RESULT,
    TOOLS_CHANGE,
    TOOLS_PROGRESS,
)
