"""Sandbox escalation through approval: one wider mode for exactly one call.

A confining tool (``bash``; later a filesystem tool) may be asked by the model to retry a denied
command under a *strictly wider* sandbox mode (``sandbox_permissions`` + ``justification``).
Approval only chooses that mode for this one call: the call still runs under the granted mode's
confinement (unless the grant is ``danger-full-access``, which is no sandbox). Nothing is
persisted; the next call is back at its session's own mode.

Why this lives in the host's tools layer: DSH gives escalation to the *sandbox contract*,
shared by every tool family that enforces it, so the families cannot drift apart in ordering or
texts. Plugins never import each other, so the shared home has to be below them all. It knows the
sandbox vocabulary (:mod:`dsh_host._sandbox`) and the approval request shape
(:class:`~dsh_host._tools.types.ApprovalRequest`) and nothing of the approval plugin: the tool
hands in ``ctx.get("approval")`` as a structural approver (or None when none is composed).

:func:`approve_escalation` is the ordered fail-closed sequence; each step raises
:class:`SandboxEscalationError` with the exact model-visible text, and nothing executes on any
raise:

1. the requested mode is not in ``WIDER_MODES[effective_mode]`` (no one is asked);
2. no approval service is composed;
3. the call has no agent;
4. ask ``approver.request(ApprovalRequest(agent, tool_name, call_id, reason="escalate sandbox to
   <mode>: <justification>", signal))`` — a second audit pair in the session log;
5. map the outcome: ``allowed-once`` → the granted mode; the three others → their distinct
   texts; anything else → an ``unreachable`` error.

Before that sequence a tool checks the argument pairing (:func:`validate_escalation_args`, which
a JSON schema cannot express) and its composition guard (:func:`check_escalation_available`: the
fields are not advertised without confinement, but schema validation only checks advertised keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

from dsh_host._sandbox import SandboxMode

from .errors import ToolError
from .types import ApprovalRequest, ApprovalSubject, approval_refusal, no_agent_refusal

if TYPE_CHECKING:
    from dsh_host._cancel import CancelToken

    from .types import ToolAgent

__all__ = [
    "ESCALATION_TARGETS",
    "NOT_AVAILABLE_MESSAGE",
    "SANDBOX_ESCALATION",
    "WIDER_MODES",
    "EscalationApprover",
    "EscalationFailure",
    "EscalationMode",
    "SandboxEscalationError",
    "approve_escalation",
    "check_escalation_available",
    "escalation_hint_marker",
    "escalation_reason",
    "sandbox_denial_marker",
    "validate_escalation_args",
]

#: A sandbox mode (the vocabulary of ``ctx.sandbox``), under the name escalation callers know.
EscalationMode: TypeAlias = SandboxMode

#: The error code every refused escalation carries (``error: {name, code}`` in ``tool/result``).
SANDBOX_ESCALATION: Final = "SANDBOX_ESCALATION"

#: What a call whose effective mode is the key may escalate *to* (strictly wider only).
#: Nothing is wider than ``danger-full-access``; an unknown mode has no wider modes.
WIDER_MODES: Final[Mapping[str, tuple[SandboxMode, ...]]] = {
    "read-only": ("workspace-write", "danger-full-access"),
    "workspace-write": ("danger-full-access",),
}

#: The schema enum of ``sandbox_permissions``: every mode a call could escalate to
#: (``read-only`` is the floor). Never cut down to the composition default, because the
#: effective mode is per call; strict widening is checked at execution.
ESCALATION_TARGETS: Final[tuple[SandboxMode, ...]] = ("workspace-write", "danger-full-access")

#: The composition guard text: the model sent ``sandbox_permissions`` to a non-confining tool.
NOT_AVAILABLE_MESSAGE: Final = (
    "sandbox_permissions is not available in this composition (no sandboxing executor to escalate)"
)

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


class SandboxEscalationError(ToolError):
    """A ``sandbox_permissions`` request was refused before anything ran.

    An operational error of one tool call: the tools runtime renders it as
    ``Error: <message>`` with ``error: {name: "SandboxEscalationError", code:
    "SANDBOX_ESCALATION"}``. The message is the exact DSH text of the step that
    refused it; ``failure`` names that step so callers can branch without
    parsing text.
    """

    code = SANDBOX_ESCALATION

    def __init__(self, message: str, failure: EscalationFailure) -> None:
        super().__init__(message)
        self.failure: EscalationFailure = failure


class EscalationApprover(Protocol):
    """The one method of ``ctx.approval`` escalation needs (structural: no plugin import)."""

    async def request(self, req: ApprovalRequest) -> str: ...


def validate_escalation_args(sandbox_permissions: Any, justification: Any) -> None:
    """The pairing a JSON schema cannot express; checked before anything else.

    ``None`` means "argument absent". An ask without a reason, or a reason that
    drives nothing, is a malformed request, so both travel together and the
    justification must be a sentence. Raises :class:`SandboxEscalationError`
    (failure ``invalid-args``) with the exact DSH text.
    """
    if sandbox_permissions is not None and justification is None:
        raise SandboxEscalationError(
            "invalid escalation: sandbox_permissions requires a justification", "invalid-args"
        )
    if justification is not None and sandbox_permissions is None:
        raise SandboxEscalationError(
            "invalid escalation: justification is only valid together with sandbox_permissions",
            "invalid-args",
        )
    if justification is not None and (
        not isinstance(justification, str) or not justification.strip()
    ):
        raise SandboxEscalationError(
            "invalid justification: expected a non-empty sentence", "invalid-args"
        )


def check_escalation_available(confining: bool) -> None:
    """Raise the composition-guard error when the tool does not confine.

    The escalation fields are only advertised when the tool confines, but a
    model can still send unadvertised keys; with nothing to widen, the request
    is refused rather than silently ignored.
    """
    if not confining:
        raise SandboxEscalationError(NOT_AVAILABLE_MESSAGE, "not-available")


def escalation_reason(mode: str, justification: str) -> str:
    """The audit reason of an escalation ask (what ``approval/asked`` records)."""
    return f"escalate sandbox to {mode}: {justification}"


def sandbox_denial_marker(mode: str) -> str:
    """The model-facing marker of a sandbox-denied file effect (shared by every tool family)."""
    return f"[sandbox: file access denied under {mode} mode]"


def escalation_hint_marker(subject: str) -> str:
    """The same-turn retry hint that rides a denial when escalation is advertised.

    It sits at the decision point so the sanctioned retry does not depend on
    the model recalling the tool description. ``subject`` is ``command`` for
    bash and ``operation`` for a filesystem tool.
    """
    return (
        f"[sandbox: escalation available — retry this exact {subject} once with "
        "sandbox_permissions (the narrowest wider mode that suffices) + justification; the "
        "approval prompt asks the user]"
    )


async def approve_escalation(
    approver: EscalationApprover | None,
    *,
    requested_mode: str,
    justification: str,
    effective_mode: str,
    agent: ToolAgent | None,
    call_id: str,
    tool_name: str = "bash",
    subject: str = "command",
    signal: CancelToken | None = None,
) -> SandboxMode:
    """Resolve one escalation before anything runs; return the granted mode or raise.

    ``approver`` is ``ctx.get("approval")`` (None when not composed);
    ``effective_mode`` is the call's standing mode; ``subject`` is ``command``
    for bash and ``operation`` for a filesystem tool. Stamp the returned mode
    onto this call's policy only.
    """
    mode = requested_mode
    wider = WIDER_MODES.get(effective_mode, ()) if isinstance(effective_mode, str) else ()
    granted = next((m for m in wider if m == mode), None)
    if granted is None:
        raise SandboxEscalationError(
            f'sandbox escalation to "{mode}" is not strictly wider than this call\'s current '
            f'"{effective_mode}" mode',
            "not-wider",
        )
    if approver is None:
        raise SandboxEscalationError(
            f'sandbox escalation to "{mode}" requires approval, but no approval service is '
            "composed",
            "no-approval-service",
        )
    named = ApprovalSubject(
        rejected=f'escalating this {subject} to "{mode}"',
        asked_for=f'escalating to "{mode}"',
        requiring=f'sandbox escalation to "{mode}"',
    )
    if agent is None:
        raise SandboxEscalationError(no_agent_refusal(named), "no-agent")
    outcome = await approver.request(
        ApprovalRequest(
            agent=agent,
            tool_name=tool_name,
            call_id=call_id,
            reason=escalation_reason(mode, justification),
            signal=signal,
        )
    )
    if outcome == "allowed-once":
        return granted
    text = approval_refusal(outcome, named)  # raises TypeError for a non-outcome
    failure: EscalationFailure = "unavailable"
    if outcome == "rejected":
        failure = "rejected"
    elif outcome == "cancelled":
        failure = "cancelled"
    raise SandboxEscalationError(text, failure)
