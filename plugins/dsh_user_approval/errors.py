"""Errors of the approval seam.

*Misuse* errors say the caller asked at the wrong time or with a value
outside the vocabulary and also derive from the matching builtin
(``RuntimeError`` / ``TypeError``)::

    DshError
    └── ApprovalError
        ├── ApprovalOutsideTurnError      (RuntimeError) request() while no turn is open
        ├── ApprovalRequestError          (TypeError)    a malformed request (empty tool name)
        ├── InvalidApprovalPolicyError    (TypeError)    a policy outside ``ask`` | ``never``
        └── ApprovalInvariantError                       an audit event breaks the pairing rules

The *escalation* error is not here: escalation belongs to the sandbox contract
and is shared by every confining tool family, so
``SandboxEscalationError`` (an operational ``ToolError``, code
``SANDBOX_ESCALATION``) lives in :mod:`dsh_host._tools.escalation` and is only
re-exported from this module for callers that imported it from here.

Every message is DSH's text, word for word,
because tests and logs are compared across the two harnesses.
"""

from __future__ import annotations

from typing import ClassVar, Final

from dsh_host.sdk import DshError, EscalationFailure, SandboxEscalationError

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

#: Exact text of :class:`ApprovalOutsideTurnError` (DSH's, word for word).
OUT_OF_TURN_MESSAGE: Final = (
    "approval.request() outside an open turn: the approval/asked + approval/decided audit pair "
    "must be turn-enclosed (a bare event between turns is crash-tail garbage on reload). "
    "Ask from inside the turn that needs the decision."
)

#: Exact text of :class:`InvalidApprovalPolicyError` (DSH's, word for word).
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
    """An approval audit event breaks the pairing rules (``invariants``); ``seq`` locates it."""

    code = "APPROVAL_INVARIANT"

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message if seq is None else f"{message} (at seq {seq})")
        self.seq = seq
