"""The ``approval`` service: one-shot, audited, fail-closed decisions (D8, D19).

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
pair is closed even then (a question DSH leaves open, D14).

Beyond DSH: ``approval/asked`` also records ``argsDigest``, the SHA-256 of the
raw argument string of the call's ``tool/call`` event (found by ``callId`` in
the current turn), so the log binds each grant to exactly the arguments that
were logged and presented. The request itself still carries no arguments.

Beyond DSH, deferral (D19): under ``unanswered: defer`` a *deferrable* request
(the tools pipeline's pre-execute ask of a top-level model call) that no live
answerer decides — the waterfall's terminal ``next()``, or an answerer that
returns ``"defer"`` — resolves ``"deferred"`` after step 3: no
``approval/decided`` is appended, the loop ends the turn ``awaiting-approval``
and :meth:`ApprovalService.decide` records the decision later, from any
process. The ``never`` policy still rejects first; a raising answerer still
fails closed (``unavailable``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio

from dsh_host.sdk import (
    APPROVAL_REQUEST,
    AWAITING_APPROVAL,
    TOOLS,
    ApprovalDecisionError,
    DeferredCall,
    PluginSource,
    TextBlock,
    UserMessage,
    Wire,
    context_of_ask,
    deferred_calls,
    new_message_id,
    recorded_terms,
)

from .errors import ApprovalOutsideTurnError, ApprovalRequestError, InvalidApprovalPolicyError
from .policy import (
    APPROVAL_POLICIES,
    ASK_POLICY_SENTENCE,
    DEFER_POLICY_SENTENCE,
    NEVER_POLICY_SENTENCE,
    AppendableSession,
    ApprovalOutcome,
    ApprovalPolicy,
    args_digest,
    find_tool_call_arguments,
    is_approval_outcome,
    open_turn_fold,
    policy_changed_notice,
    policy_override_fold,
    set_approval_policy,
)

if TYPE_CHECKING:
    from dsh_host.sdk import CancelToken, Context

__all__ = ["ApprovalAgent", "ApprovalRequestLike", "ApprovalService", "AwaitingApprovalReason"]

#: What ``request`` returns when the decision was deferred (never logged as an outcome).
DEFERRED: Final = "deferred"
#: What an answerer returns to leave the decision for later (honoured only under ``defer``).
DEFER_ANSWER: Final = "defer"


class AwaitingApprovalReason(
    Wire, frozen=True, kw_only=True, tag=AWAITING_APPROVAL, tag_field="kind"
):
    """``turn/end {kind: "awaiting-approval", callIds}``: calls wait for a decision (D19)."""

    call_ids: tuple[str, ...]  #: the pending calls, in model order

#: The plugin name the live-switch notice is sourced to (as DSH does).
NOTICE_PLUGIN: Final = "user-approval"

log = logging.getLogger("dsh.approval")


class ApprovalAgent(Protocol):
    """What the service needs of an agent: its id and its session log."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Any: ...


class ApprovalRequestLike(Protocol):
    """The request shape (``dsh_host._tools.ApprovalRequest`` is the concrete one).

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


async def _defer() -> str:
    """The terminal ``next()`` under ``defer`` for a deferrable request: nobody decided yet."""
    return DEFER_ANSWER


class ApprovalService:
    """``ctx.approval``: ask, audit, decide; never prompts anyone itself.

    ``default_policy`` is the plugin's configured policy; a session's own
    ``approval/policy`` events override it (the last one wins).
    """

    def __init__(
        self,
        ctx: Context,
        default_policy: ApprovalPolicy = "ask",
        *,
        unanswered: Literal["fail", "defer"] = "fail",
    ) -> None:
        if default_policy not in APPROVAL_POLICIES:
            raise InvalidApprovalPolicyError()
        if unanswered not in ("fail", "defer"):
            raise ValueError(f'unanswered must be "fail" or "defer", not {unanswered!r}')
        self._ctx = ctx
        self._default: ApprovalPolicy = default_policy
        self._unanswered: Literal["fail", "defer"] = unanswered
        # Per-session folds of the log (extended by new events only: read every step).
        self._override = policy_override_fold()
        self._open_turn = open_turn_fold()

    @property
    def unanswered(self) -> Literal["fail", "defer"]:
        """What an ask nobody decides becomes: ``fail`` (unavailable) or ``defer``."""
        return self._unanswered

    # -- policy ---------------------------------------------------------------------------

    @property
    def default_policy(self) -> ApprovalPolicy:
        """The configured policy used by sessions that never switched."""
        return self._default

    def override_of(self, session: AppendableSession) -> ApprovalPolicy | None:
        """The session's own policy (last ``approval/policy``), without the default."""
        return self._override.value(session)

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
        if policy == "never":
            return NEVER_POLICY_SENTENCE
        return DEFER_POLICY_SENTENCE if self._unanswered == "defer" else ASK_POLICY_SENTENCE

    # -- request --------------------------------------------------------------------------

    async def request(self, req: ApprovalRequestLike) -> ApprovalOutcome | Literal["deferred"]:
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
        if not self._open_turn.value(session):
            raise ApprovalOutsideTurnError()
        request_id = str(uuid.uuid4())
        asked: dict[str, Any] = {"id": request_id, "toolName": tool_name}
        if req.call_id is not None:
            asked["callId"] = req.call_id
        if req.reason is not None:
            asked["reason"] = req.reason
        if req.call_id is not None:
            raw = find_tool_call_arguments(session.events, req.call_id)
            if raw is not None:
                asked["argsDigest"] = args_digest(raw)
        if getattr(req, "stage", None) == "pre-execute":
            asked["stage"] = "pre-execute"
        asked.update(self.context(session, tool_name))
        session.append("approval/asked", asked)
        try:
            outcome = await self._decide(req, session)
        except anyio.get_cancelled_exc_class():
            # The calling task was cancelled from outside: close the pair, then propagate.
            _append_contained(session, request_id, "cancelled")
            raise
        if outcome == DEFERRED:
            return DEFERRED  # the decision is recorded later (decide); the ask stays open
        session.append("approval/decided", {"id": request_id, "outcome": outcome})
        return outcome

    async def _decide(
        self, req: ApprovalRequestLike, session: AppendableSession
    ) -> ApprovalOutcome | Literal["deferred"]:
        signal = req.signal
        if signal is not None and signal.aborted:
            return "cancelled"
        if self.effective_policy(session) == "never":
            return "rejected"
        if getattr(req, "reask", False) is True and getattr(req, "deferrable", False) is True:
            # A decision made in another context (D22 in docs/decisions.md): deferred again for
            # a person to decide in this one, whatever the unanswered mode; no answerer is asked.
            return DEFERRED
        if signal is None:
            return await self._ask_answerers(req)
        outcome: ApprovalOutcome | Literal["deferred"] = "cancelled"
        with signal.linked_scope():
            outcome = await self._ask_answerers(req)
        # Withdrawn while (or just as) the answerers ran: a late answer is discarded.
        return "cancelled" if signal.aborted else outcome

    async def _ask_answerers(
        self, req: ApprovalRequestLike
    ) -> ApprovalOutcome | Literal["deferred"]:
        deferrable = self._unanswered == "defer" and getattr(req, "deferrable", False) is True
        terminal = _defer if deferrable else _unavailable
        try:
            # The bus's untyped dispatch: ``req`` may be any ApprovalRequestLike.
            answer: object = await self._ctx.host.bus.waterfall(APPROVAL_REQUEST, req, terminal)
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
        if type(answer) is str and answer == DEFER_ANSWER:
            if deferrable:
                return DEFERRED
            log.warning(
                "approval/request answerer deferred tool %r (call %r), but this request cannot "
                "wait (unanswered mode %r, or asked from inside a running body); resolving "
                "unavailable",
                req.tool_name,
                req.call_id,
                self._unanswered,
            )
            return "unavailable"
        log.warning(
            "approval/request answerer returned %r for tool %r, which is not an approval "
            "outcome (allowed-once, rejected, cancelled, unavailable); resolving unavailable",
            answer,
            req.tool_name,
        )
        return "unavailable"

    # -- deferred decisions (D19) ---------------------------------------------------------

    # -- context ----------------------------------------------------------------------------

    def context(self, session: AppendableSession, tool_name: str) -> dict[str, str]:
        """The context an ask is made in, and a decision holds in (wire names; absent parts are
        left out): the sandbox mode and network of the session's run terms (the runner composes
        every continuation to them), the sha256 of the tool's definition as registered here (name,
        description, parameters) and of the composition's rows. A decision applied where any of
        them differs is refused and the call asked again: what a person allowed was that call,
        with that tool, under that sandbox."""
        out: dict[str, str] = {}
        terms = recorded_terms(session.events)
        if terms is not None:
            if terms.sandbox is not None:
                out["sandboxMode"] = terms.sandbox.mode
                out["network"] = terms.sandbox.network
            out["compositionDigest"] = terms.composition.digest
        tools = self._ctx.get(TOOLS)
        definition = tools.get(tool_name) if tools is not None else None
        if definition is not None:
            schema = {"name": definition.name, "description": definition.description,
                      "parameters": definition.parameters}
            out["toolDigest"] = hashlib.sha256(
                json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str).encode()
            ).hexdigest()
        return out

    def context_change(
        self, session: AppendableSession, tool_name: str, asked: Mapping[str, str]
    ) -> str | None:
        """What changed between the context ``asked`` (recorded by an ask) and now, for people;
        None when nothing did (an ask that recorded no context binds none)."""
        now = self.context(session, tool_name)
        changed = [
            f"{_CONTEXT_LABELS[key]} {value} -> {now.get(key, '(none)')}"
            if key in ("sandboxMode", "network") else f"{_CONTEXT_LABELS[key]} changed"
            for key, value in asked.items()
            if key in _CONTEXT_LABELS and now.get(key) != value
        ]
        return "; ".join(changed) if changed else None

    def recorded_decision_change(
        self, session: AppendableSession, call_id: str, tool_name: str
    ) -> str | None:
        """For the tools pipeline applying a recorded decision: what changed since the deferred
        call ``call_id`` was asked (None: nothing, or it is not a deferred call)."""
        # The continued turn is open, so the call is found by its last pre-execute ask (the
        # one its decision answers), not through deferred_calls (which lists between turns).
        for event in reversed(session.events):
            if event.type != "approval/asked":
                continue
            data = event.data
            if getattr(data, "call_id", None) == call_id and getattr(data, "stage", None) == (
                "pre-execute"
            ):
                return self.context_change(session, tool_name, context_of_ask(data))
        return None

    def awaiting_reason(self, call_ids: tuple[str, ...]) -> AwaitingApprovalReason:
        """The turn-end reason of a turn whose step deferred ``call_ids``."""
        return AwaitingApprovalReason(call_ids=tuple(call_ids))

    def decide(
        self,
        agent: Any,
        call_id: str,
        decision: str,
        *,
        reason: str | None = None,
        decided_by: str | None = None,
        args_digest: str | None = None,
    ) -> DeferredCall:
        """Record one decision for a deferred call (``agent.decide`` calls this, then flushes).

        Refuses (:class:`~dsh_host._agent.errors.ApprovalDecisionError`, nothing
        appended) a call that is not pending in this session, a second decision,
        arguments whose digest no longer matches the ask's ``argsDigest``, and an
        ``args_digest`` that differs from it. Appends ``approval/decided {id,
        outcome, callId, argsDigest, decidedBy, reason?}`` between turns.
        """
        if decision not in ("allow", "deny"):
            raise ApprovalDecisionError(f'a decision is "allow" or "deny", not {decision!r}')
        if reason is not None and not isinstance(reason, str):
            raise ApprovalDecisionError("the reason of a decision must be a string")
        session = agent.session
        calls = deferred_calls(session.events)
        call = next((c for c in calls if c.call_id == call_id), None)
        if call is None:
            waiting = (
                ", ".join(c.call_id for c in calls if c.decision is None and c.waits_on is None)
                or "none"
            )
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}" is not awaiting approval '
                f"(pending: {waiting})"
            )
        if call.waits_on is not None:  # a body that waits has no decision of its own (D36)
            other, ids = call.waits_on
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}" waits on session "{other}" '
                f"(call(s) {', '.join(ids) or 'none'}): decide those (dsh approvals decide "
                f"{other} CALL allow|deny), which continues this session too"
            )
        if call.decision is not None:
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}" was already decided '
                f'({call.decision.outcome}); a decision is one-shot'
            )
        if not call.bound:
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}": its logged arguments do not match '
                "the argsDigest its approval was asked for (the log was changed); refusing to "
                "decide it"
            )
        if args_digest is not None and args_digest != call.asked_digest:
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}": argsDigest {args_digest} is not '
                f"the digest of its logged arguments ({call.asked_digest}); the call changed "
                "since it was shown; list the pending approvals again"
            )
        change = self.context_change(session, call.tool_name, call.asked_context)
        if change is not None:
            raise ApprovalDecisionError(
                f'call "{call_id}" of session "{session.id}": the context changed since it was '
                f"asked ({change}); a decision holds only in the context it was asked in: ask "
                "again (continue the session under its recorded terms, or start a new turn)"
            )
        data: dict[str, Any] = {
            "id": call.ask_id,
            "outcome": "allowed-once" if decision == "allow" else "rejected",
            "callId": call_id,
            "argsDigest": call.asked_digest,
            "decidedBy": decided_by or "library",
        }
        if reason is not None:
            data["reason"] = reason
        data.update(call.asked_context)
        session.append("approval/decided", data)
        decided = next(c for c in deferred_calls(session.events) if c.call_id == call_id)
        return decided


_CONTEXT_LABELS: Final = {
    "sandboxMode": "sandbox",
    "network": "network",
    "toolDigest": "the tool's definition",
    "compositionDigest": "the composition",
}


def _append_contained(
    session: AppendableSession, request_id: str, outcome: ApprovalOutcome
) -> None:
    """Best-effort ``approval/decided`` while a cancellation unwinds (it must keep unwinding)."""
    try:
        session.append("approval/decided", {"id": request_id, "outcome": outcome})
    except Exception as exc:
        log.warning("could not record approval/decided %s for %s: %r", outcome, request_id, exc)
