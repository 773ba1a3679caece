"""The ``approval`` service: one-shot, audited, fail-closed decisions (spec §1.3–§1.5).

``request(req)`` follows the reference algorithm step by step:

1. **Open turn.** The requesting session must sit inside a turn; otherwise
   :class:`~.errors.ApprovalOutsideTurnError` is raised before anything is
   appended (an audit pair between turns would read as crash-tail garbage).
2. **Mint** a fresh UUID ``id``.
3. **Append ``approval/asked``** ``{id, toolName, callId?, reason?, argsDigest?}``.
   This is the first commit point: if the append raises, ``request`` raises
   and no decision exists.
4. **Decide** (never raises an ordinary exception): an already-aborted
   ``signal`` → ``cancelled``; effective policy ``never`` → ``rejected`` (decided
   *here*, so no listener, however early, can answer instead); otherwise the
   ``approval/request`` waterfall, whose terminal ``next()`` is
   ``unavailable``. An answerer that raises, or returns anything outside the
   vocabulary, yields ``unavailable``. While the answerers run, an abort of
   ``signal`` cancels them (the question is withdrawn) and settles
   ``cancelled``; a grant that races the abort is discarded.
5. **Append ``approval/decided``** ``{id, outcome}`` — the second commit point;
   if it raises, ``request`` raises (the unmatched ``approval/asked`` stays, as
   in DSH) and the outcome is never returned.
6. Return the outcome.

So a grant is only ever returned after both halves of its audit pair are in
the log. Cancellation of the *calling task* (an anyio cancel scope rather than
the request's token) is recorded as ``cancelled`` before it propagates, so the
pair is closed even then (spec §5 open question 6, decided this way).

Beyond DSH: ``approval/asked`` also records ``argsDigest``, the SHA-256 of the
raw argument string of the call's ``tool/call`` event (found by ``callId`` in
the current turn), so the log binds each grant to exactly the arguments that
were logged and presented. The request itself still carries no arguments.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from dsh_host.session.messages import PluginSource, TextBlock, UserMessage, new_message_id
from dsh_host.tools.escalation import approve_escalation

from .errors import ApprovalOutsideTurnError, ApprovalRequestError, InvalidApprovalPolicyError
from .policy import (
    APPROVAL_POLICIES,
    ASK_POLICY_SENTENCE,
    NEVER_POLICY_SENTENCE,
    AppendableSession,
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

if TYPE_CHECKING:
    from dsh_host.cancel import CancelToken
    from dsh_host.context import Context

__all__ = ["ApprovalAgent", "ApprovalRequestLike", "ApprovalService"]

#: The plugin name the live-switch notice is sourced to (spec §1.3).
NOTICE_PLUGIN: Final = "user-approval"

log = logging.getLogger("dsh.approval")


class ApprovalAgent(Protocol):
    """What the service needs of an agent: its id and its session log."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Any: ...


class ApprovalRequestLike(Protocol):
    """The request shape (``dsh_host.tools.ApprovalRequest`` is the concrete one).

    Deliberately without the tool arguments: the call is already logged as
    ``tool/call`` and answerers correlate by ``call_id``.
    """

    @property
    def agent(self) -> Any: ...

    @property
    def tool_name(self) -> str: ...

    @property
    def call_id(self) -> str | None: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def signal(self) -> CancelToken | None: ...


async def _unavailable() -> ApprovalOutcome:
    """The terminal ``next()`` of the answerer chain: nobody claimed the request."""
    return "unavailable"


class ApprovalService:
    """``ctx.approval``: ask, audit, decide; never prompts anyone itself.

    ``default_policy`` is the plugin's configured policy; a session's own
    ``approval/policy`` events override it (the last one wins).
    """

    def __init__(self, ctx: Context, default_policy: ApprovalPolicy = "ask") -> None:
        if default_policy not in APPROVAL_POLICIES:
            raise InvalidApprovalPolicyError()
        self._ctx = ctx
        self._default: ApprovalPolicy = default_policy

    # -- policy ---------------------------------------------------------------------------

    @property
    def default_policy(self) -> ApprovalPolicy:
        """The configured policy used by sessions that never switched."""
        return self._default

    def override_of(self, session: AppendableSession) -> ApprovalPolicy | None:
        """The session's own policy (last ``approval/policy``), without the default."""
        return approval_policy_override(session.events)

    def effective_policy(self, session: AppendableSession) -> ApprovalPolicy:
        """The policy every ask for ``session`` resolves under right now."""
        return self.override_of(session) or self._default

    def set_policy(self, agent: Any, policy: str) -> None:
        """Write path B, the live switch: log it and tell the model at its next step.

        A no-op (no event, no notice) when ``policy`` already is the effective
        one. Otherwise appends ``approval/policy {policy}`` and queues the
        sourced notice ``The approval policy changed from "<old>" to "<new>"
        (changed by the user).`` through ``agent.inject`` (next step, no wake).
        An invalid value raises before anything changes.
        """
        if policy not in APPROVAL_POLICIES:
            raise InvalidApprovalPolicyError()
        session = agent.session
        previous = self.effective_policy(session)
        if previous == policy:
            return
        inject = getattr(agent, "inject", None)
        if not callable(inject):
            raise TypeError(
                f"approval.set_policy() needs a live agent with inject(message) to queue the "
                f"policy notice; {agent!r} has none (use set_approval_policy(session, policy) "
                "to initialise a session without a notice)"
            )
        set_approval_policy(session, policy)
        inject(
            UserMessage(
                id=new_message_id(),
                content=(TextBlock(text=policy_changed_notice(previous, policy)),),
                source=PluginSource(plugin=NOTICE_PLUGIN),
            )
        )

    def policy_context(self, agent: Any | None) -> str:
        """The ``approval:policy`` runtime-context text (order 115) for ``agent``.

        Empty without an agent (a bare prompt assembly has no session to describe).
        """
        if agent is None:
            return ""
        policy = self.effective_policy(agent.session)
        return NEVER_POLICY_SENTENCE if policy == "never" else ASK_POLICY_SENTENCE

    # -- request --------------------------------------------------------------------------

    async def request(self, req: ApprovalRequestLike) -> ApprovalOutcome:
        """Decide one occurrence; see the module docstring for the exact algorithm.

        Raises :class:`~.errors.ApprovalOutsideTurnError` outside an open turn,
        :class:`~.errors.ApprovalRequestError` for an empty tool name, and
        whatever the session's ``append`` raises for either audit event.
        """
        tool_name = req.tool_name
        if not isinstance(tool_name, str) or not tool_name:
            raise ApprovalRequestError("approval/asked toolName must be non-empty")
        session = getattr(req.agent, "session", None)
        if session is None:
            raise ApprovalRequestError(
                f"approval request for tool {tool_name!r} has no agent with a session to audit "
                "it in; ask on behalf of the agent whose turn needs the decision"
            )
        events = session.events
        if not has_open_turn(events):
            raise ApprovalOutsideTurnError()
        request_id = str(uuid.uuid4())
        asked: dict[str, Any] = {"id": request_id, "toolName": tool_name}
        if req.call_id is not None:
            asked["callId"] = req.call_id
        if req.reason is not None:
            asked["reason"] = req.reason
        if req.call_id is not None:
            raw = find_tool_call_arguments(events, req.call_id)
            if raw is not None:
                asked["argsDigest"] = args_digest(raw)
        session.append("approval/asked", asked)
        try:
            outcome = await self._decide(req, session)
        except anyio.get_cancelled_exc_class():
            # The calling task was cancelled from outside: close the pair, then propagate.
            _append_contained(session, request_id, "cancelled")
            raise
        session.append("approval/decided", {"id": request_id, "outcome": outcome})
        return outcome

    async def _decide(
        self, req: ApprovalRequestLike, session: AppendableSession
    ) -> ApprovalOutcome:
        signal = req.signal
        if signal is not None and signal.aborted:
            return "cancelled"
        if self.effective_policy(session) == "never":
            return "rejected"
        if signal is None:
            return await self._ask_answerers(req)
        outcome: ApprovalOutcome = "cancelled"
        with signal.linked_scope():
            outcome = await self._ask_answerers(req)
        # Withdrawn while (or just as) the answerers ran: a late answer is discarded.
        return "cancelled" if signal.aborted else outcome

    async def _ask_answerers(self, req: ApprovalRequestLike) -> ApprovalOutcome:
        try:
            answer: object = await self._ctx.waterfall("approval/request", req, _unavailable)
        except Exception as exc:
            # A failing answerer fails the *question* closed, never the caller's call open.
            log.warning(
                "approval/request answerer raised for tool %r (call %r); resolving unavailable: %r",
                req.tool_name,
                req.call_id,
                exc,
            )
            return "unavailable"
        if is_approval_outcome(answer):
            return answer
        log.warning(
            "approval/request answerer returned %r for tool %r, which is not an approval "
            "outcome (allowed-once, rejected, cancelled, unavailable); resolving unavailable",
            answer,
            req.tool_name,
        )
        return "unavailable"

    # -- sandbox escalation ---------------------------------------------------------------

    async def approve_escalation(
        self,
        *,
        requested_mode: str,
        justification: str,
        effective_mode: str,
        agent: Any | None,
        call_id: str,
        tool_name: str = "bash",
        subject: str = "command",
        signal: CancelToken | None = None,
    ) -> str:
        """:func:`dsh_host.tools.escalation.approve_escalation` with this service as the approver.

        The shared sequence lives in the host (every confining tool family
        uses it with ``ctx.get("approval")``); this method is a convenience
        for callers that already hold the service.
        """
        return await approve_escalation(
            self,
            requested_mode=requested_mode,
            justification=justification,
            effective_mode=effective_mode,
            agent=agent,
            call_id=call_id,
            tool_name=tool_name,
            subject=subject,
            signal=signal,
        )


def _append_contained(
    session: AppendableSession, request_id: str, outcome: ApprovalOutcome
) -> None:
    """Best-effort ``approval/decided`` while a cancellation unwinds (it must keep unwinding)."""
    try:
        session.append("approval/decided", {"id": request_id, "outcome": outcome})
    except Exception as exc:
        log.warning("could not record approval/decided %s for %s: %r", outcome, request_id, exc)
