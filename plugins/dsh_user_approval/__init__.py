"""``user-approval``: one-shot, audited, fail-closed approval (``ctx.approval``).

``await ctx.approval.request(req)`` returns exactly ``allowed-once``, ``rejected``,
``cancelled`` or ``unavailable``, and every request leaves an ``approval/asked`` +
``approval/decided`` pair in the agent's session log. No answerer ships here;
no grant is remembered.

The sandbox-escalation helpers (``approve_escalation``, ``SandboxEscalationError``,
``WIDER_MODES`` ...) live in :mod:`dsh_host._tools.escalation`, shared by every
confining tool, which calls ``approve_escalation(ctx.get("approval"), ...)``.
"""

from .errors import (
    OUT_OF_TURN_MESSAGE,
    POLICY_VALUE_MESSAGE,
    ApprovalError,
    ApprovalInvariantError,
    ApprovalOutsideTurnError,
    ApprovalRequestError,
    InvalidApprovalPolicyError,
)
from .invariants import ApprovalAuditChecker, check_approval_invariants
from .plugin import UserApproval, UserApprovalConfig
from .policy import (
    APPROVAL_OUTCOMES,
    APPROVAL_POLICIES,
    ASK_POLICY_SENTENCE,
    DEFER_POLICY_SENTENCE,
    NEVER_POLICY_SENTENCE,
    ApprovalOutcome,
    ApprovalPolicy,
    approval_policy_override,
    args_digest,
    find_tool_call_arguments,
    has_open_turn,
    is_approval_outcome,
    policy_changed_notice,
    set_approval_policy,
)
from .service import ApprovalService, AwaitingApprovalReason

__all__ = [
    "APPROVAL_OUTCOMES",
    "APPROVAL_POLICIES",
    "ASK_POLICY_SENTENCE",
    "DEFER_POLICY_SENTENCE",
    "NEVER_POLICY_SENTENCE",
    "OUT_OF_TURN_MESSAGE",
    "POLICY_VALUE_MESSAGE",
    "ApprovalAuditChecker",
    "ApprovalError",
    "ApprovalInvariantError",
    "ApprovalOutcome",
    "ApprovalOutsideTurnError",
    "ApprovalPolicy",
    "ApprovalRequestError",
    "ApprovalService",
    "AwaitingApprovalReason",
    "InvalidApprovalPolicyError",
    "UserApproval",
    "UserApprovalConfig",
    "approval_policy_override",
    "args_digest",
    "check_approval_invariants",
    "find_tool_call_arguments",
    "has_open_turn",
    "is_approval_outcome",
    "policy_changed_notice",
    "set_approval_policy",
]
