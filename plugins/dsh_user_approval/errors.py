"""Errors of the approval seam.

Two families, kept apart (STYLE §2): *misuse* errors say the caller asked at
the wrong time or with a value outside the vocabulary and also derive from
the matching builtin (``RuntimeError`` / ``TypeError``); the *escalation*
error is operational — it is one tool call's refusal, which the tools runtime
turns into the model-visible ``Error: <message>``::

    DshError
    └── ApprovalError
        ├── ApprovalOutsideTurnError      (RuntimeError) request() while no turn is open
        ├── ApprovalRequestError          (TypeError)    a malformed request (empty tool name)
        ├── InvalidApprovalPolicyError    (TypeError)    a policy outside ``ask`` | ``never``
        ├── ApprovalInvariantError                       an audit event breaks the pairing rules
        └── SandboxEscalationError                       a sandbox escalation was not granted

Every message is the DSH text (approval-and-sandbox.md §1.3, §1.4, §1.6, §1.9),
because tests and logs are compared across the two harnesses.
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal

from dsh_host.errors import DshError

__all__ = [
    "OUT_OF_TURN_MESSAGE",
    "POLICY_VALUE_MESSAGE",
    "ApprovalError",
    "ApprovalInvariantError",
    "ApprovalOutsideTurnError",
    "ApprovalRequestError",
    "EscalationFailure",
    "InvalidApprovalPolicyError",
    "SandboxEscalationError",
]

#: Exact text of :class:`ApprovalOutsideTurnError` (spec §1.4 step 1).
OUT_OF_TURN_MESSAGE: Final = (
    "approval.request() outside an open turn: the approval/asked + approval/decided audit pair "
    "must be turn-enclosed (a bare event between turns is crash-tail garbage on reload). "
    "Ask from inside the turn that needs the decision."
)

#: Exact text of :class:`InvalidApprovalPolicyError` (spec §1.3, write path A).
POLICY_VALUE_MESSAGE: Final = 'approval policy must be one of "ask" or "never"'


class ApprovalError(DshError):
    """Base of the approval seam's errors."""

    code: ClassVar[str] = "APPROVAL"


class ApprovalOutsideTurnError(ApprovalError, RuntimeError):
    """``request()`` was called while the agent's session has no open turn.

    Raised before anything is appended: an audit pair between turns would be
    indistinguishable from a crash tail on reload. Ask from inside the turn
    that needs the decision.
    """

    code = "APPROVAL_OUTSIDE_TURN"

    def __init__(self) -> None:
        super().__init__(OUT_OF_TURN_MESSAGE)


class ApprovalRequestError(ApprovalError, TypeError):
    """The request cannot be audited as given (e.g. an empty ``tool_name``)."""

    code = "INVALID_APPROVAL_REQUEST"


class InvalidApprovalPolicyError(ApprovalError, TypeError):
    """A policy value outside the closed list ``ask`` | ``never``; nothing was appended."""

    code = "INVALID_APPROVAL_POLICY"

    def __init__(self) -> None:
        super().__init__(POLICY_VALUE_MESSAGE)


class ApprovalInvariantError(ApprovalError):
    """An approval audit event breaks the pairing rules (spec §1.6); ``seq`` locates it."""

    code = "APPROVAL_INVARIANT"

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message if seq is None else f"{message} (at seq {seq})")
        self.seq = seq


#: Why an escalation was not granted (the step of the fail-closed sequence that stopped it).
EscalationFailure = Literal[
    "invalid-args",
    "not-available",
    "not-wider",
    "no-approval-service",
    "no-agent",
    "rejected",
    "cancelled",
    "unavailable",
]


class SandboxEscalationError(ApprovalError):
    """A ``sandbox_permissions`` request was refused before anything ran.

    The message is the exact model-visible text of the step that refused it;
    ``failure`` names that step so callers can branch without parsing text.
    """

    code = "SANDBOX_ESCALATION"

    def __init__(self, message: str, failure: EscalationFailure) -> None:
        super().__init__(message)
        self.failure: EscalationFailure = failure
