"""Errors of the agent layer.

::

    DshError
    └── AgentError
        ├── AgentConfigError        (also ValueError) bad agent options (maxTokens, provider/model)
        ├── AgentBusyError          (also RuntimeError) run_turn while a turn is running
        ├── AgentClosedError        (also RuntimeError) use of a closed agent
        ├── ResumeError             a stored session cannot be resumed (the message says why)
        ├── PromptError             the system prompt could not be assembled or rendered
        ├── ApprovalPendingError    (also RuntimeError) run_turn while calls await approval
        └── ApprovalDecisionError   a deferred decision was refused (not pending, decided, bound)

A *turn* never raises for a failure inside it: the failure is recorded as the
turn's end reason (``turn/end {kind: "error"}``) and returned. These errors
are raised for misuse and for operations around turns (create, resume).
"""

from __future__ import annotations

from dsh_host.errors import DshError

__all__ = [
    "AgentBusyError",
    "AgentClosedError",
    "AgentConfigError",
    "AgentError",
    "ApprovalDecisionError",
    "ApprovalPendingError",
    "PromptError",
    "ResumeError",
]


class AgentError(DshError):
    """Base of the agent layer's errors."""

    code = "AGENT"


class AgentConfigError(AgentError, ValueError):
    """Agent options are invalid (``agent maxTokens must be a positive safe integer``)."""

    code = "AGENT_CONFIG"


class AgentBusyError(AgentError, RuntimeError):
    """Misuse: ``run_turn`` was called while this agent is already running a turn.

    Await the running turn (or cancel it) first; an agent runs one turn at a time.
    """

    code = "AGENT_BUSY"


class AgentClosedError(AgentError, RuntimeError):
    """Misuse: the agent was closed; create or resume a new one."""

    code = "AGENT_CLOSED"


class ResumeError(AgentError):
    """A stored session cannot be resumed (no persistence, live elsewhere, ...)."""

    code = "RESUME"


class PromptError(AgentError):
    """A prompt section or context could not be registered, assembled or interpolated."""

    code = "PROMPT"


class ApprovalPendingError(AgentError, RuntimeError):
    """Misuse: a new turn was started while calls of the last turn await approval (D19).

    The model must never see a call without its result: decide the pending
    calls (``agent.decide``, ``dsh approvals decide``) and continue the turn
    (``agent.continue_turn``) first.
    """

    code = "APPROVAL_PENDING"


class ApprovalDecisionError(AgentError):
    """A deferred approval decision was refused; nothing was recorded (the message says why).

    The call is unknown, not pending, already decided (decisions are one-shot),
    or its logged arguments no longer match the ``argsDigest`` the ask recorded.
    """

    code = "APPROVAL_DECISION"
