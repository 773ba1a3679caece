"""The approval vocabulary and the pure folds over a session log.

The effective policy and the open-turn test are folds over ``session.events``, so a
resumed session needs no catch-up machinery — replaying the log *is* the state.
Both are read often (the policy on every step, for the runtime context), so each
is a :class:`~dsh_host._session.folds.LogFold`: kept per session and extended by the
events appended since the last read, never a rescan of the whole log. The plain
functions fold a given sequence from the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeGuard

from dsh_host.sdk import LogFold, args_digest

from .errors import InvalidApprovalPolicyError

__all__ = [
    "APPROVAL_OUTCOMES",
    "APPROVAL_POLICIES",
    "ASK_POLICY_SENTENCE",
    "DEFER_POLICY_SENTENCE",
    "NEVER_POLICY_SENTENCE",
    "AppendableSession",
    "ApprovalOutcome",
    "ApprovalPolicy",
    "approval_policy_override",
    "args_digest",
    "find_tool_call_arguments",
    "has_open_turn",
    "is_approval_outcome",
    "policy_changed_notice",
    "set_approval_policy",
]

#: One decision: ``allowed-once`` is the only grant; every other value means "do not proceed".
ApprovalOutcome: TypeAlias = Literal["allowed-once", "rejected", "cancelled", "unavailable"]
#: What happens to an ask before any answerer sees it.
ApprovalPolicy: TypeAlias = Literal["ask", "never"]

#: Every outcome, in DSH's order (for normalising answerer returns).
APPROVAL_OUTCOMES: Final[tuple[ApprovalOutcome, ...]] = (
    "allowed-once",
    "rejected",
    "cancelled",
    "unavailable",
)
#: Every policy, in DSH's order (for option lists and validating untrusted strings).
APPROVAL_POLICIES: Final[tuple[ApprovalPolicy, ...]] = ("ask", "never")

#: Runtime-context statement under ``ask`` (DSH's, exact).
ASK_POLICY_SENTENCE: Final = (
    "Approval policy: ask. Operations that require approval may ask through the configured "
    "answerers; without an available answerer, the request fails closed."
)
#: Runtime-context statement under ``ask`` with ``unanswered: defer`` (beyond DSH, D19).
DEFER_POLICY_SENTENCE: Final = (
    "Approval policy: ask. Operations that require approval may ask through the configured "
    "answerers; without an available answerer, the call waits for a person's later decision "
    "and the turn pauses until it is decided."
)
#: Runtime-context statement under ``never`` (DSH's, exact).
NEVER_POLICY_SENTENCE: Final = (
    "Approval prompts are disabled in this session: actions that require approval are rejected "
    "automatically — do not request sandbox escalation (do not set `sandbox_permissions`)."
)


class AppendableSession(Protocol):
    """What the approval seam needs of a session: its log and a synchronous append."""

    @property
    def events(self) -> Sequence[Any]: ...

    def append(self, type: str, data: Any) -> Any: ...


def is_approval_outcome(value: object) -> TypeGuard[ApprovalOutcome]:
    """True for exactly the four outcome strings (a rogue answerer's value is not one)."""
    return type(value) is str and value in APPROVAL_OUTCOMES


def _is_policy(value: object) -> TypeGuard[ApprovalPolicy]:
    return type(value) is str and value in APPROVAL_POLICIES


def _field(data: Any, name: str, wire_name: str | None = None) -> Any:
    """Read a field of event data that may be a typed Struct or frozen JSON."""
    if isinstance(data, Mapping):
        return data.get(wire_name or name)
    return getattr(data, name, None)


def _policy_step(state: ApprovalPolicy | None, event: Any) -> ApprovalPolicy | None:
    """The last ``approval/policy`` decides; one whose ``policy`` is not a policy clears it."""
    if event.type != "approval/policy":
        return state
    policy = _field(event.data, "policy")
    return policy if _is_policy(policy) else None


def _turn_step(state: bool, event: Any) -> bool:
    kind = event.type
    if kind == "turn/start":
        return True
    if kind == "turn/end":
        return False
    return state


def policy_override_fold() -> LogFold[ApprovalPolicy | None]:
    """A per-session fold of :func:`approval_policy_override` (one per service)."""
    return LogFold(None, _policy_step)


def open_turn_fold() -> LogFold[bool]:
    """A per-session fold of :func:`has_open_turn` (one per service)."""
    return LogFold(False, _turn_step)


def approval_policy_override(events: Sequence[Any]) -> ApprovalPolicy | None:
    """The ``policy`` of the last ``approval/policy`` event, or None when the session never
    switched (the caller applies the configured default). ``source`` is ignored."""
    return _POLICY.over(events)


def has_open_turn(events: Sequence[Any]) -> bool:
    """True when the log sits inside a turn: its last ``turn/start`` after its last
    ``turn/end``."""
    return _OPEN_TURN.over(events)


_POLICY: Final = policy_override_fold()
_OPEN_TURN: Final = open_turn_fold()


def set_approval_policy(session: AppendableSession, policy: str) -> None:
    """Write path A: append one ``approval/policy {policy}`` (no model-visible notice).

    Used to initialise a session or by a non-live preset switch. A value
    outside ``ask`` | ``never`` raises :class:`InvalidApprovalPolicyError`
    before anything is appended.
    """
    if not _is_policy(policy):
        raise InvalidApprovalPolicyError()
    session.append("approval/policy", {"policy": policy})


def policy_changed_notice(previous: ApprovalPolicy, policy: ApprovalPolicy) -> str:
    """The exact live-switch notice text (DSH's)."""
    return f'The approval policy changed from "{previous}" to "{policy}" (changed by the user).'


def find_tool_call_arguments(events: Sequence[Any], call_id: str) -> str | None:
    """The raw argument string of the newest ``tool/call`` with ``call_id``, or None.

    Scans back only to the start of the current turn: a call id belongs to
    one step, and an older turn's call with a reused id is not this call.
    """
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type == "turn/start":
            return None
        if event.type == "tool/call" and _field(event.data, "call_id", "callId") == call_id:
            arguments = _field(event.data, "arguments")
            return arguments if isinstance(arguments, str) else None
    return None
