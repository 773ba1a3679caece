"""Sandbox escalation through approval: one wider mode for exactly one call (spec §1.9).

A confining tool (``bash``; later a filesystem tool) may be asked by the model
to retry a denied command under a *strictly wider* sandbox mode
(``sandbox_permissions`` + ``justification``). Approval only chooses that mode
for this one call: the call still runs under the granted mode's confinement
(unless the grant is ``danger-full-access``, which is no sandbox). Nothing is
persisted; the next call is back at its session's own mode.

:func:`approve_escalation` is the ordered fail-closed sequence; each step
raises :class:`~.errors.SandboxEscalationError` with the exact model-visible
text, and nothing executes on any raise:

1. the requested mode is not in ``WIDER_MODES[effective_mode]`` (no one is asked);
2. no approval service is composed;
3. the call has no agent;
4. ask ``approval.request(agent, tool_name, call_id, reason="escalate sandbox to
   <mode>: <justification>", signal)`` — a second audit pair in the log;
5. map the outcome: ``allowed-once`` → the granted mode; the three others →
   their distinct texts; anything else → an ``unreachable`` error.

This module imports nothing from other plugins and takes the approver as a
parameter, so a tool can use it whether or not ``ctx.approval`` is composed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

from dsh_host.tools.types import ApprovalRequest

from .errors import SandboxEscalationError

if TYPE_CHECKING:
    from dsh_host.cancel import CancelToken

__all__ = [
    "ESCALATION_TARGETS",
    "NOT_AVAILABLE_MESSAGE",
    "WIDER_MODES",
    "EscalationApprover",
    "EscalationMode",
    "approve_escalation",
    "check_escalation_available",
    "escalation_hint_marker",
    "escalation_reason",
    "sandbox_denial_marker",
    "validate_escalation_args",
]

#: A sandbox mode (the vocabulary of ``ctx.sandbox``; kept local so no plugin imports another).
EscalationMode: TypeAlias = Literal["read-only", "workspace-write", "danger-full-access"]

#: What a call whose effective mode is the key may escalate *to* (strictly wider only).
#: Nothing is wider than ``danger-full-access``; an unknown mode has no wider modes.
WIDER_MODES: Final[Mapping[str, tuple[EscalationMode, ...]]] = {
    "read-only": ("workspace-write", "danger-full-access"),
    "workspace-write": ("danger-full-access",),
}

#: The schema enum of ``sandbox_permissions``: every mode a call could escalate to
#: (``read-only`` is the floor). Never cut down to the composition default, because the
#: effective mode is per session; strict widening is checked at execution.
ESCALATION_TARGETS: Final[tuple[EscalationMode, ...]] = ("workspace-write", "danger-full-access")

#: The composition guard text: the model sent ``sandbox_permissions`` to a non-confining bash.
NOT_AVAILABLE_MESSAGE: Final = (
    "sandbox_permissions is not available in this composition (no sandboxing executor to "
    "escalate)"
)


class EscalationApprover(Protocol):
    """The one method of ``ctx.approval`` escalation needs."""

    async def request(self, req: Any) -> str: ...


def validate_escalation_args(sandbox_permissions: Any, justification: Any) -> None:
    """The pairing a JSON schema cannot express; checked before anything else.

    ``None`` means "argument absent". Raises :class:`SandboxEscalationError`
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
    """Raise the composition-guard error when the executor does not confine."""
    if not confining:
        raise SandboxEscalationError(NOT_AVAILABLE_MESSAGE, "not-available")


def escalation_reason(mode: str, justification: str) -> str:
    """The audit reason of an escalation ask (what ``approval/asked`` records)."""
    return f"escalate sandbox to {mode}: {justification}"


def sandbox_denial_marker(mode: str) -> str:
    """The model-facing marker of a sandbox-denied file effect."""
    return f"[sandbox: file access denied under {mode} mode]"


def escalation_hint_marker(subject: str) -> str:
    """The same-turn retry hint that rides a denial when escalation is advertised."""
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
    agent: Any | None,
    call_id: str,
    tool_name: str = "bash",
    subject: str = "command",
    signal: CancelToken | None = None,
) -> EscalationMode:
    """Resolve one escalation before anything runs; return the granted mode or raise.

    ``approver`` is ``ctx.get("approval")`` (None when not composed);
    ``effective_mode`` is the call's standing mode (session override, else the
    composition default); ``subject`` is ``command`` for bash and ``operation``
    for a filesystem tool. Stamp the returned mode onto this call's policy only.
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
    if agent is None:
        raise SandboxEscalationError(
            f'sandbox escalation to "{mode}" requires approval, but the call has no agent to '
            "route it through",
            "no-agent",
        )
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
    if outcome == "rejected":
        raise SandboxEscalationError(
            f'the user rejected escalating this {subject} to "{mode}"', "rejected"
        )
    if outcome == "cancelled":
        raise SandboxEscalationError(
            f'approval for escalating to "{mode}" was cancelled', "cancelled"
        )
    if outcome == "unavailable":
        raise SandboxEscalationError(
            f'sandbox escalation to "{mode}" requires approval, but no approval channel is '
            "available",
            "unavailable",
        )
    raise TypeError(f"unreachable variant in EscalationOutcome: {outcome!r}")
