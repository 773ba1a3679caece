"""``user-approval``: one-shot, audited, fail-closed approval (``ctx.approval``).

``await ctx.approval.request(req)`` returns exactly ``allowed-once``, ``rejected``,
``cancelled`` or ``unavailable``, and every request leaves an ``approval/asked`` +
``approval/decided`` pair in the agent's session log. No answerer ships here;
no grant is remembered.

The sandbox-escalation helpers (``approve_escalation``, ``SandboxEscalationError``,
``WIDER_MODES`` ...) live in :mod:`dsh_host.tools.escalation`, shared by every
confining tool; they are re-exported here unchanged, and the service offers
``ctx.approval.approve_escalation(...)`` with itself as the approver.
"""

from dsh_host.tools.escalation import (
    ESCALATION_TARGETS,
    NOT_AVAILABLE_MESSAGE,
    WIDER_MODES,
    EscalationApprover,
    EscalationFailure,
    EscalationMode,
    SandboxEscalationError,
    approve_escalation,
    check_escalation_available,
    escalation_hint_marker,
    escalation_reason,
    sandbox_denial_marker,
    validate_escalation_args,
)

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
    "ESCALATION_TARGETS",
    "NEVER_POLICY_SENTENCE",
    "NOT_AVAILABLE_MESSAGE",
    "OUT_OF_TURN_MESSAGE",
    "POLICY_VALUE_MESSAGE",
    "WIDER_MODES",
    "ApprovalAuditChecker",
    "ApprovalError",
    "ApprovalInvariantError",
    "ApprovalOutcome",
    "ApprovalOutsideTurnError",
    "ApprovalPolicy",
    "ApprovalRequestError",
    "ApprovalService",
    "AwaitingApprovalReason",
    "EscalationApprover",
    "EscalationFailure",
    "EscalationMode",
    "InvalidApprovalPolicyError",
    "SandboxEscalationError",
    "UserApproval",
    "UserApprovalConfig",
    "approval_policy_override",
    "approve_escalation",
    "args_digest",
    "check_approval_invariants",
    "check_escalation_available",
    "escalation_hint_marker",
    "escalation_reason",
    "find_tool_call_arguments",
    "has_open_turn",
    "is_approval_outcome",
    "policy_changed_notice",
    "sandbox_denial_marker",
    "set_approval_policy",
    "validate_escalation_args",
]
