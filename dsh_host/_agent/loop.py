"""The agent loop: one :class:`Agent` drives one session through turns and steps.

A turn appends, in this order (DSH v3 shapes, in DSH's order)::

    turn/start
      agent/pre-step (waterfall; may reject → turn/end {blocked}, no step)
      step/start
        system/message?          the rendered system prompt, when it changed (v3)
        user/message*            the entered input (prompt, steering, tool contexts,
                                 runtime-context snapshot)
        request/header?          initial | resume | change
        request/context?         provider/model/context window, when changed
        ⟨llm/stream⟩
        assistant/message        {message, usage?, stream}   (or assistant/attempt on failure);
                                 each tool call's id is the harness's from here (.call_ids)
        for each tool call, in model order:
          tool/call → ⟨tools pipeline⟩ → tool/result
      step/end                   always, even when the step failed
      … further steps while tool results need a follow-up …
    turn/end {reason}

How a turn ends (``TurnEndReason``, D6; every match needs a default branch):

- ``completed``: the last step answered with text only, a tool result
  concluded the turn, or the first step had no input;
- ``max-tokens``: some step hit the output ceiling (sticky for the turn);
- ``max-turn-requests {limit}``: the turn ran ``max_steps_per_turn`` steps and
  still wanted another (tool results to answer, or steering input); what was
  queued for that step waits for the next turn;
- ``blocked``: an ``agent/pre-step`` listener rejected the step;
- ``aborted {reason}``: the turn's token was cancelled anywhere in the turn;
- ``error {error}``: a model failure that was not retried (verbatim), or any
  other exception (``code: "UNKNOWN"``, message = the error chain);
- ``interrupted`` and ``forked`` are never written by the loop (crash repair
  and fork seeds write them);
- ``budget-exceeded {scope, limit, max, spent, message}`` (added by the
  ``agent`` row): a spend limit of :attr:`AgentOptions.budget` was reached
  before a model request (:mod:`.budget`); no request was made;
- ``awaiting-approval {callIds}`` (added by the ``user-approval`` plugin, D19):
  some call's approval was deferred. The step settled every other call and
  closed; the deferred calls have a ``tool/call`` and an ``approval/asked``
  but no result, and no model request is made until each is decided
  (:meth:`Agent.decide`) and :meth:`Agent.continue_turn` has applied the
  decisions in a new turn (step 1 runs or rejects exactly those calls, with a
  fresh ``tool/call`` before each, then the model is asked as usual). While
  calls wait, :meth:`Agent.run_turn` refuses to start a turn
  (:class:`~.errors.ApprovalPendingError`), so the model never sees a call
  without its result.
  A call whose body raised :class:`~dsh_host._tools.ToolCallWaits` (D36: a
  sub-agent whose child awaits approval) is listed the same way, with a
  ``tool/waits`` record instead of an ask; it has no decision of its own, and
  :meth:`Agent.continue_turn` dispatches it again (the body finds what it waited
  on decided, or waits again).

Cancellation is cooperative (D2): :meth:`Agent.cancel` (or the caller's token)
aborts the turn's :class:`~dsh_host._cancel.CancelToken`; the loop re-checks it
between stages, a model stream is cut and its visible prefix kept
(``assistant/message {interrupted: true}``), and a started tool body is asked
to stop and awaited, never abandoned. A cancellation of the *host* (an anyio
cancel scope around the whole process going away) is not a turn ending: it
propagates, ``step/end`` is still written, and the open turn is left for
crash repair to close as ``interrupted`` on the next resume.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import anyio
import anyio.lowlevel
import msgspec
from msgspec import UNSET

from dsh_host._cancel import CancelToken
from dsh_host._jsonsafe import MAX_SAFE_INTEGER
from dsh_host._llm.assembler import BlockAssembler
from dsh_host._llm.attachments import AttachmentError, is_attachment
from dsh_host._llm.errors import LlmError
from dsh_host._llm.keys import LLM
from dsh_host._llm.types import LlmRequest
from dsh_host._llm.vision import refusal
from dsh_host._sandbox import SandboxMode
from dsh_host._session.approvals import DeferredCall, awaiting_call_ids, deferred_calls
from dsh_host._session.events import (
    AbortedReason,
    AssistantAttemptData,
    AssistantMessageData,
    BlockedReason,
    CompletedReason,
    DisposedCancel,
    ErrorReason,
    HookCancel,
    LegacyCancel,
    MaxTokensReason,
    MaxTurnRequestsReason,
    ParentCancel,
    RequestContextData,
    RequestHeaderData,
    SessionEvent,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnEndCancelCause,
    TurnEndReason,
    TurnStart,
    UserCancel,
)
from dsh_host._session.header import now_ms
from dsh_host._session.keys import SESSIONS, TOKEN_METER
from dsh_host._session.messages import (
    AbortedFinish,
    ContentBlock,
    EpochHeader,
    ErrorFinish,
    LlmCallConfig,
    LlmFailure,
    MaxTokensFinish,
    PluginSource,
    TextBlock,
    ToolCallBlock,
    UserMessage,
    UserSource,
    new_message_id,
)
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._session.request_header import canonical_header, headers_equal
from dsh_host._session.tokens import TokenMeter
from dsh_host._tools.keys import APPROVAL, TOOLS
from dsh_host.errors import DshError

from .budget import BUDGET_NOTICE_SOURCE, Budget, BudgetExceededReason, check_budget
from .call_ids import CallIds
from .errors import (
    AgentBusyError,
    AgentClosedError,
    AgentConfigError,
    ApprovalDecisionError,
    ApprovalPendingError,
)
from .keys import (
    AGENT,
    AGENT_CHUNK,
    AGENT_ERROR,
    AGENT_PRE_STEP,
    AGENT_REQUEST,
    AGENT_REQUEST_ERROR,
    AGENT_STEP_END,
    AGENT_STEP_START,
    AGENT_TURN_END,
    AGENT_TURN_START,
    AGENT_TURN_STOPPING,
)
from .prompt import (
    PromptRenderer,
    RuntimeContextProjection,
    SystemMessageProjection,
    join_context_sections,
    render_context_sections,
    render_prompt,
)
from .scheduler import execute_tool_calls
from .types import (
    AgentErrorEvent,
    AgentOptions,
    ChunkReceived,
    Enter,
    PreStepContext,
    PromptAssembly,
    Reject,
    RequestErrorContext,
    RequestProposal,
    StepEnded,
    StepStarted,
    TurnEnded,
    TurnStarted,
    TurnStoppingContext,
    pre_step_decision,
    request_error_action,
)

if TYPE_CHECKING:
    from dsh_host._context import Context
    from dsh_host._llm.runtime import PreparedCall
    from dsh_host._session.session import Session

    from .reconcile import Reconciliation

_log = logging.getLogger("dsh.agent")

_R = TypeVar("_R")

__all__ = ["Agent", "Prompt", "cancel_cause", "check_options", "error_chain"]

#: What :meth:`Agent.run_turn` accepts as the prompt.
Prompt = str | UserMessage | Sequence[ContentBlock]

_StepEnd = Literal["completed", "max-tokens", "awaiting"] | None


class _BudgetStop(Exception):
    """Raised before a model request when a spend limit is reached; ends the turn with it."""

    def __init__(self, reason: BudgetExceededReason) -> None:
        super().__init__(reason.message)
        self.reason = reason
_CANCEL_KINDS: dict[str, TurnEndCancelCause] = {
    "user": UserCancel(),
    "parent": ParentCancel(),
    "disposed": DisposedCancel(),
    "legacy": LegacyCancel(),
}


def check_options(options: AgentOptions) -> AgentOptions:
    """Validate options at creation (before anything is published)."""
    max_tokens = options.max_tokens
    if max_tokens is not None and (
        type(max_tokens) is not int or not 0 < max_tokens <= MAX_SAFE_INTEGER
    ):
        raise AgentConfigError("agent maxTokens must be a positive safe integer")
    cap = options.max_parallel_tool_calls
    if type(cap) is not int or cap < 1:
        raise AgentConfigError("agent maxParallelToolCalls must be a positive integer")
    limit = options.max_steps_per_turn
    if type(limit) is not int or limit < 1:
        raise AgentConfigError("agent maxStepsPerTurn must be a positive integer")
    budget = options.budget
    if budget is not None:
        if not isinstance(budget, Budget):
            raise AgentConfigError(f"agent budget must be a Budget, got {budget!r}")
        for name in ("turn_max_cost_usd", "turn_max_tokens", "session_max_cost_usd",
                     "session_max_tokens"):  # fmt: skip
            limit = getattr(budget, name)
            if limit is not None and (isinstance(limit, bool) or not limit > 0):
                raise AgentConfigError(f"agent budget {name} must be positive, got {limit!r}")
    for name in ("provider", "model", "reasoning_effort"):
        value = getattr(options, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise AgentConfigError(f"agent {name} must be a non-empty string when given")
    return options


def cancel_cause(reason: object) -> TurnEndCancelCause:
    """The durable cause of a cancellation, from whatever the token was aborted with.

    A cause Struct (``UserCancel()`` ...) is kept; ``"user"`` / ``"parent"`` /
    ``"disposed"`` (or ``{"kind": ...}``) map to theirs; any other string
    becomes ``{kind: "hook", reason}``; anything else is a user cancel.
    """
    if isinstance(reason, UserCancel | ParentCancel | HookCancel | DisposedCancel | LegacyCancel):
        return reason
    if isinstance(reason, Mapping):
        kind = reason.get("kind")
        if kind == "hook" and isinstance(reason.get("reason"), str):
            return HookCancel(reason=reason["reason"])
        if isinstance(kind, str) and kind in _CANCEL_KINDS:
            return _CANCEL_KINDS[kind]
    if isinstance(reason, str) and reason:
        return _CANCEL_KINDS.get(reason) or HookCancel(reason=reason)
    return UserCancel()


def error_chain(error: BaseException) -> str:
    """One line for an exception and its causes: ``outer [a; b]: cause: root``.

    The class name stands in for an empty message; exception-group members are
    listed in brackets; a cause whose text equals the message is skipped; a
    cycle reads ``<circular cause>``.
    """
    seen: set[int] = set()
    parts: list[str] = []
    current: BaseException | None = error
    previous_text: str | None = None
    while current is not None:
        if id(current) in seen:
            parts.append("<circular cause>")
            break
        seen.add(id(current))
        try:
            text = str(current) or type(current).__name__
        except Exception:
            text = type(current).__name__
        if isinstance(current, BaseExceptionGroup):
            text = (
                f"{current.message or type(current).__name__} ["
                + "; ".join(error_chain(member) for member in current.exceptions)
                + "]"
            )
        if text != previous_text:
            parts.append(text)
        previous_text = text
        current = current.__cause__ or (
            current.__context__ if not current.__suppress_context__ else None
        )
    return ": ".join(parts)


def _failure_of_turn(error: BaseException) -> LlmFailure:
    """The ``turn/end {error}`` record: a model failure verbatim, anything else by its own code.

    A persistence failure (``SESSION_WRITE`` ...) keeps its code rather than
    reading as an unknown model failure.
    """
    if isinstance(error, LlmError):
        return error.failure
    code = error.code if isinstance(error, DshError) and error.code else "UNKNOWN"
    return LlmFailure(message=error_chain(error) or "unknown error", code=code)


def _llm_error(failure: LlmFailure) -> LlmError:
    """Re-raise a failure record verbatim as an exception (its facts survive)."""
    return LlmError(
        failure.message,
        failure.code,
        status=failure.status if failure.status is not UNSET else None,
        provider_retry_after_ms=(
            failure.provider_retry_after_ms
            if failure.provider_retry_after_ms is not UNSET
            else None
        ),
        request_id=failure.request_id if failure.request_id is not UNSET else None,
    )


def _as_message(prompt: Prompt) -> UserMessage:
    if isinstance(prompt, UserMessage):
        return prompt
    content: tuple[ContentBlock, ...]
    if isinstance(prompt, str):
        content = (TextBlock(text=prompt),)
    elif isinstance(prompt, Sequence):
        content = tuple(cast("Sequence[ContentBlock]", prompt))
    else:
        raise TypeError(
            f"a prompt is a str, a UserMessage or a list of content blocks, not {prompt!r}"
        )
    return UserMessage(id=new_message_id(), content=content, source=UserSource())


def _request_proposal(header: EpochHeader) -> LlmCallConfig:
    """The logged config minus the fields the adapter filled in (they are re-resolved)."""
    defaults = header.adapter_defaults
    if defaults is UNSET:
        return header.config
    changes: dict[str, Any] = {}
    if defaults.reasoning_effort is True:
        changes["reasoning_effort"] = UNSET
    if defaults.max_tokens is True:
        changes["max_tokens"] = UNSET
    return msgspec.structs.replace(header.config, **changes) if changes else header.config


class Agent:
    """Drives one session through turns (see the module docstring).

    Create one with ``ctx.agent.create(...)`` or ``await ctx.agent.resume(id)``;
    run turns with ``await agent.run_turn("prompt", signal=token)``. An agent
    runs one turn at a time; ``steer`` adds input to the running turn's next
    step (or to the next turn's first step when idle).
    """

    def __init__(
        self,
        ctx: Context,
        session: Session,
        options: AgentOptions,
        *,
        owns_session: bool,
    ) -> None:
        self._ctx = ctx
        self._session = session
        self._options = check_options(options)
        self._owns_session = owns_session
        #: the widest sandbox mode this agent's tool calls may run under (a sub-agent's ceiling,
        #: D24); None: its tools' own modes. Consumers apply it with ``capped_mode``.
        self.sandbox_cap: SandboxMode | None = None
        #: a limit kept outside :attr:`AgentOptions.budget` (a ``subagents`` row's tree budget,
        #: D34): called with the turn before every model request; a reason stops the turn
        self.budget_gate: Callable[[int], BudgetExceededReason | None] | None = None
        self._pending: list[UserMessage] = []
        self._running: anyio.Event | None = None
        self._token: CancelToken | None = None
        self._closed = False
        self._header_logged = False
        #: (logged header, built header) last found equal by ``headers_equal``: a header built
        #: from the same parts is equal to the same logged one without encoding its tools again
        self._header_match: tuple[EpochHeader, EpochHeader] | None = None
        self._runtime_context = RuntimeContextProjection(session)
        self._render_prompt = PromptRenderer()  # the system prompt, re-rendered on change (D49)
        self._call_ids = CallIds(session)
        self._system_message = SystemMessageProjection(session)
        self._last_turn = 0
        self._awaiting: tuple[str, ...] = ()
        self._meter: TokenMeter | None = None
        #: The closers ``ctx.agent.resume`` appended to repair an interrupted turn (durable
        #: before the agent was returned); empty for a created agent or a balanced log.
        self.repairs: tuple[SessionEvent, ...] = ()
        #: what a resume's reconcilers found (D26); set by ``ctx.agent.resume``
        self.reconciled: tuple[Reconciliation, ...] = ()
        for event in reversed(session.events):
            if event.type == "turn/start" and isinstance(event.data, TurnStart):
                self._last_turn = event.data.turn
                break

    # ------------------------------------------------------------------ public surface
    @property
    def id(self) -> str:
        """The agent's id (its session id)."""
        return self._session.id

    @property
    def session(self) -> Session:
        return self._session

    @property
    def options(self) -> AgentOptions:
        return self._options

    @property
    def status(self) -> Literal["idle", "running"]:
        return "running" if self._running is not None else "idle"

    @property
    def last_turn(self) -> int:
        """The number of the last turn started in this session (0 before the first)."""
        return self._last_turn

    @property
    def closed(self) -> bool:
        return self._closed

    def steer(self, message: Prompt) -> None:
        """Queue input for the next step of the running turn (or the next turn when idle).

        An ``agent/turn-stopping`` listener that steers keeps the turn going.
        """
        self._pending.append(_as_message(message))

    def inject(self, message: Prompt) -> None:
        """Queue context for the next step without waking anything (DSH ``inject``).

        This agent has no background driver, so ``inject`` and :meth:`steer`
        queue the same way; the approval service uses this name for its
        policy-change notice.
        """
        self._pending.append(_as_message(message))

    def cancel(self, cause: object = None) -> None:
        """Abort the running turn (no-op when idle); ``cause`` is recorded in ``turn/end``.

        Pass a cause (``UserCancel()``, ``HookCancel(reason=...)``, ``"user"`` ...);
        the default is a user cancel. The turn ends ``aborted`` once every
        started tool body has returned.
        """
        if self._token is not None:
            self._token.abort(cancel_cause(cause) if cause is not None else UserCancel())

    async def wait_idle(self) -> None:
        """Return once no turn is running."""
        while self._running is not None:
            await self._running.wait()

    async def aclose(self) -> None:
        """Cancel a running turn (cause ``disposed``), wait for it, and release the session.

        A session the agent created (or resumed) is flushed (``sessions.flush``:
        durable when a persistence backend is composed; a write error is raised
        here) and then detached from the store. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self.cancel(DisposedCancel())
        with anyio.CancelScope(shield=True):
            await self.wait_idle()
        try:
            if self._owns_session:
                store = self._ctx.get(SESSIONS)
                if store is not None and store.is_live(self._session):
                    with anyio.CancelScope(shield=True):
                        try:
                            # Make the log durable before letting go of it: a write error
                            # surfaces here, to the owner, instead of in a background drain.
                            await store.flush(self._session)
                        finally:
                            store.detach(self._session)
        finally:
            service = self._ctx.get(AGENT)
            forget = getattr(service, "forget", None)
            if callable(forget):
                forget(self)  # the host keeps no closed agent (and so no closed session's log)

    async def run_turn(
        self, prompt: Prompt | None, *, signal: CancelToken | None = None
    ) -> TurnEndReason:
        """Run one turn and return why it ended (the reason is also in ``turn/end``).

        ``prompt`` enters as the first step's ``user/message`` (None: only
        queued steering input enters; with none, the turn completes without a
        step). ``signal`` is the caller's token: aborting it ends the turn
        ``aborted`` just like :meth:`cancel`. A token that is already aborted
        raises :class:`~dsh_host.errors.AbortError` before anything is logged.
        Failures inside the turn do not raise; they are the returned reason.
        """
        self._check_idle()
        waiting = deferred_calls(self._session.events)
        if waiting:
            ids = ", ".join(call.call_id for call in waiting)
            raise ApprovalPendingError(
                f'session "{self.id}" is awaiting approval for call(s) {ids}: decide each '
                "(agent.decide / dsh approvals decide) and continue the turn "
                "(agent.continue_turn) before starting a new one"
            )
        first = [_as_message(prompt)] if prompt is not None else []
        if first:
            await self.refuse_unreadable(first[0])
        return await self._run(first, signal, ())

    async def refuse_unreadable(self, prompt: Prompt) -> None:
        """Raise :class:`~dsh_host._llm.attachments.AttachmentError` when ``prompt`` carries
        attachments and the agent's model takes no images (D31), before anything is logged:
        the turn would spend tokens on a request the model cannot read."""
        prompt = _as_message(prompt)
        if not any(is_attachment(block) for block in prompt.content):
            return
        options, llm = self._options, self._ctx.service(LLM)
        if not options.provider or not options.model or not llm.has_provider(options.provider):
            return  # no route to ask (middleware serves it): the request's own check holds
        info = await llm.resolve_model(options.provider, options.model)
        reason = refusal(info, prompt.content)
        if reason is not None:
            raise AttachmentError(f'session "{self.id}": {reason}')

    async def run_maintenance(
        self,
        task: Callable[[CancelToken], Awaitable[_R]],
        *,
        signal: CancelToken | None = None,
    ) -> _R:
        """Run a non-turn operation (``/compact``) while idle, holding turn admission.

        DSH ``runMaintenance``: raises :class:`~.errors.AgentBusyError` when a turn (or
        another maintenance task) runs, and a turn started meanwhile is refused the same way.
        ``task`` gets the agent-owned token: :meth:`cancel` and ``signal`` abort it.
        """
        self._check_idle()
        if signal is not None:
            signal.throw_if_aborted()
        token = CancelToken()
        unlink = signal.on_abort(token.abort) if signal is not None else None
        self._running = anyio.Event()
        self._token = token
        try:
            return await task(token)
        finally:
            if unlink is not None:
                unlink()
            running, self._running, self._token = self._running, None, None
            running.set()

    # ------------------------------------------------------------------ deferred approvals
    def pending_approvals(self) -> list[DeferredCall]:
        """The calls of the last turn whose approval waits for a decision (D19), in order.

        Empty unless the last turn ended ``awaiting-approval``; a call already
        decided (but not yet applied by :meth:`continue_turn`) is not listed.
        """
        return [
            call
            for call in deferred_calls(self._session.events)
            if call.decision is None and call.waits_on is None
        ]

    async def decide(
        self,
        call_id: str,
        decision: Literal["allow", "deny"],
        *,
        reason: str | None = None,
        decided_by: str | None = None,
        args_digest: str | None = None,
    ) -> DeferredCall:
        """Record a person's decision for one pending call, durably, and return the call.

        The decision is bound to this session, ``call_id`` and the ``argsDigest``
        of the logged arguments (``args_digest``, when given, must equal it:
        what the person was shown is what gets decided). One-shot: a second
        decision for the same call raises :class:`~.errors.ApprovalDecisionError`,
        as do an unknown or not-pending call and arguments that no longer match.
        Appends ``approval/decided`` (with ``decidedBy`` and ``reason``) and
        flushes it; nothing runs until :meth:`continue_turn`.
        """
        self._check_idle()
        approval = self._ctx.get(APPROVAL)
        if approval is None:
            raise ApprovalDecisionError(
                f'cannot decide call "{call_id}": this composition has no approval service '
                "(add a user-approval row)"
            )
        decided = approval.decide(
            self,
            call_id,
            decision,
            reason=reason,
            decided_by=decided_by,
            args_digest=args_digest,
        )
        await self._flush()
        return cast("DeferredCall", decided)

    async def continue_turn(self, *, signal: CancelToken | None = None) -> TurnEndReason:
        """Apply the recorded decisions in a new turn, then continue with the model.

        Every pending call must be decided first; otherwise nothing is written
        and the last turn's ``awaiting-approval`` reason is returned. Step 1 of
        the new turn runs each allowed call exactly once (re-checked against the
        current tool rules and approval policy: a rule that now denies wins) and
        answers each denied one with the rejection text; the loop then makes the
        next model request over the same history. Raises
        :class:`~.errors.ApprovalDecisionError` when nothing awaits approval or
        a decision no longer matches the logged arguments.
        """
        self._check_idle()
        calls = deferred_calls(self._session.events)
        if not calls:
            raise ApprovalDecisionError(
                f'session "{self.id}" has no calls awaiting approval; nothing to continue'
            )
        if any(call.decision is None and call.waits_on is None for call in calls):
            for event in reversed(self._session.events):
                if event.type == "turn/end":
                    return cast("TurnEndReason", event.data.reason)
        for call in calls:
            if call.waits_on is not None:
                continue  # a body that waited (D36): dispatched again, it looks for itself
            decision = call.decision
            assert decision is not None
            if not call.bound or decision.args_digest not in (None, call.logged_digest):
                raise ApprovalDecisionError(
                    f'call "{call.call_id}" ({call.tool_name}): its logged arguments no longer '
                    "match the argsDigest its approval was asked and decided for; refusing to "
                    "apply the decision"
                )
        return await self._run([], signal, tuple(calls))

    def _check_idle(self) -> None:
        if self._closed:
            raise AgentClosedError(f'agent "{self.id}" is closed; create or resume a new agent')
        if self._running is not None:
            raise AgentBusyError(
                f'agent "{self.id}" is already running turn {self._last_turn}; await it or '
                "cancel it first"
            )

    async def _flush(self) -> None:
        store = self._ctx.get(SESSIONS)
        if store is not None and store.is_live(self._session):
            await store.flush(self._session)

    async def _run(
        self,
        first: list[UserMessage],
        signal: CancelToken | None,
        settle: tuple[DeferredCall, ...],
    ) -> TurnEndReason:
        if signal is not None:
            signal.throw_if_aborted()
        token = CancelToken()
        # Linked for this turn only: a long-lived caller token keeps no callback per turn.
        unlink = signal.on_abort(token.abort) if signal is not None else None
        claimed = first + self._pending
        self._pending = []
        self._running = anyio.Event()
        self._token = token
        try:
            return await self._turn(claimed, token, settle)
        finally:
            if unlink is not None:
                unlink()
            running, self._running, self._token = self._running, None, None
            running.set()

    # ------------------------------------------------------------------ events
    # ------------------------------------------------------------------ turn
    async def _turn(
        self,
        first_input: list[UserMessage],
        signal: CancelToken,
        settle: tuple[DeferredCall, ...] = (),
    ) -> TurnEndReason:
        session = self._session
        turn = self._last_turn + 1
        session.append("turn/start", TurnStart(turn=turn))
        self._last_turn = turn
        self._ctx.emit(AGENT_TURN_START, TurnStarted(agent=self, turn=turn))
        reason: TurnEndReason | None = None
        step = 0
        claimed = first_input
        try:
            if settle:
                step = 1
                settled = await self._settle(turn, settle, signal)
                if settled == "awaiting":
                    # A decision made in another context is not used: its call waits again
                    # (D22 in docs/decisions.md), and no model request is made without it.
                    reason = self._awaiting_reason()
                elif settled == "completed":
                    reason = CompletedReason()
                signal.throw_if_aborted()
            while awaiting_call_ids(reason) is None:
                # A schedule point per step: the loop may otherwise run a whole turn without
                # yielding (a scripted model, in-process tools), starving background work such
                # as the persistence backend's write-behind and session binding.
                await anyio.lowlevel.checkpoint()
                signal.throw_if_aborted()
                next_step = step + 1
                decision, assembly = await self._pre_step(turn, next_step, claimed, signal)
                claimed = []
                if isinstance(decision, Reject):
                    reason = BlockedReason()
                    break
                messages = tuple(decision.messages)
                if reason is not None and not messages:
                    break
                if step == 0 and not messages:
                    reason = CompletedReason()
                    break
                signal.throw_if_aborted()
                step = next_step
                session.append("step/start", StepStart(turn=turn, step=step))
                self._ctx.emit(AGENT_STEP_START, StepStarted(agent=self, turn=turn, step=step))
                try:
                    ended = await self._step(turn, step, messages, assembly, signal)
                    if ended == "awaiting":
                        reason = self._awaiting_reason()
                    elif not isinstance(reason, MaxTokensReason):  # max-tokens is sticky
                        if ended == "completed":
                            reason = CompletedReason()
                        elif ended == "max-tokens":
                            reason = MaxTokensReason()
                        else:
                            reason = None
                except BaseException:
                    # No step/end while a call of the step lacks its result (D18): a
                    # scheduler failure, a host cancellation or a KeyboardInterrupt can
                    # leave requested calls unanswered; close them as repair would.
                    self._close_unanswered_calls()
                    raise
                finally:
                    session.append("step/end", StepEnd(turn=turn, step=step))
                    self._ctx.emit(AGENT_STEP_END, StepEnded(agent=self, turn=turn, step=step))
                signal.throw_if_aborted()
                if awaiting_call_ids(reason) is not None:
                    break  # no model request while a call of this turn lacks its result
                if reason is not None and not self._pending:
                    await self._ctx.serial(
                        AGENT_TURN_STOPPING,
                        TurnStoppingContext(agent=self, turn=turn, signal=signal),
                    )
                    signal.throw_if_aborted()
                if reason is not None and not self._pending:
                    break
                # Loop guard: the turn wants another step; the pending input stays queued
                # for the next turn.
                if step >= self._options.max_steps_per_turn:
                    reason = MaxTurnRequestsReason(limit=self._options.max_steps_per_turn)
                    break
                claimed, self._pending = self._pending, []
        except _BudgetStop as stop:
            reason = cast("TurnEndReason", stop.reason)
            self._queue_budget_notice(stop.reason)
        except Exception as error:
            if signal.aborted:
                reason = AbortedReason(reason=cancel_cause(signal.reason))
            else:
                reason = ErrorReason(error=_failure_of_turn(error))
                self._ctx.emit(
                    AGENT_ERROR, AgentErrorEvent(agent=self, turn=turn, step=step, error=error)
                )
        assert reason is not None
        session.append("turn/end", TurnEnd(turn=turn, reason=reason))
        self._ctx.emit(AGENT_TURN_END, TurnEnded(agent=self, turn=turn, reason=reason))
        return reason

    async def _settle(
        self, turn: int, calls: tuple[DeferredCall, ...], signal: CancelToken
    ) -> Literal["completed", "awaiting"] | None:
        """Step 1 of a continued turn: apply each recorded decision (see :meth:`continue_turn`).

        Returns ``completed`` when a result concluded the turn, ``awaiting`` when a call whose
        decision was made in another context was deferred again (D22), else None.
        """
        session = self._session
        session.append("step/start", StepStart(turn=turn, step=1))
        self._ctx.emit(AGENT_STEP_START, StepStarted(agent=self, turn=turn, step=1))
        blocks = [
            ToolCallBlock(id=call.call_id, name=call.tool_name, arguments=call.arguments)
            for call in calls
        ]
        decisions: dict[str, Literal["allowed-once", "rejected"]] = {
            call.call_id: "allowed-once"
            if call.decision is not None and call.decision.outcome == "allowed-once"
            else "rejected"
            for call in calls
            if call.waits_on is None  # a waiting body's call goes through its pipeline again
        }
        deferred: list[str] = []
        try:
            tools = self._ctx.service(TOOLS)
            concluded = await execute_tool_calls(
                self,
                tools,
                turn,
                1,
                blocks,
                signal,
                self._pending.append,
                max_parallel=self._options.max_parallel_tool_calls,
                deferred=deferred,
                decisions=decisions,
            )
            if deferred:
                if signal.aborted:
                    self._close_unanswered_calls()  # the turn ends aborted (D18)
                    return None
                self._awaiting = tuple(deferred)
                return "awaiting"
            return "completed" if concluded else None
        except BaseException:
            self._close_unanswered_calls()
            raise
        finally:
            session.append("step/end", StepEnd(turn=turn, step=1))
            self._ctx.emit(AGENT_STEP_END, StepEnded(agent=self, turn=turn, step=1))

    def _awaiting_reason(self) -> TurnEndReason:
        """The plugin's ``awaiting-approval`` reason for the calls the last step deferred."""
        ids, self._awaiting = self._awaiting, ()
        return cast("TurnEndReason", self._ctx.service(APPROVAL).awaiting_reason(ids))

    def _close_unanswered_calls(self) -> None:
        """Answer every requested call of the open turn that has no ``tool/result``.

        The same results crash repair would write (``TOOL_OUTCOME_UNKNOWN`` for a
        durable ``tool/call``, else ``TOOL_NOT_STARTED``), appended now, by the
        live writer, so the step can close balanced. No body is running: the
        scheduler awaits every started body before it lets a failure out.
        """
        session = self._session
        try:
            for closer in interrupted_turn_closers(session.events):
                if closer.type != "tool/result":
                    continue
                cited = closer.source_event_seqs
                session.append(
                    "tool/result",
                    closer.data,
                    surface_op="append",
                    source_event_seqs=cited if cited is not UNSET else None,
                )
        except Exception:
            # A call the log cannot answer (the failure being handled may be exactly that):
            # the original error is what the turn reports; repair sees the same log.
            _log.warning("could not close the unanswered calls of the step", exc_info=True)

    async def _assemble(self, signal: CancelToken) -> tuple[PromptAssembly, UserMessage | None]:
        """This step's prompt assembly and the runtime-context snapshot to enter (None: the
        retained one is still right)."""
        service = self._ctx.service(AGENT)
        assembly: PromptAssembly = await service.system_prompt.assemble(self, signal)
        signal.throw_if_aborted()
        sections = render_context_sections(assembly)
        return assembly, self._runtime_context.project(join_context_sections(sections), sections)

    async def derive_request(
        self,
        turn: int,
        step: int,
        entered: Sequence[UserMessage],
        recorded: EpochHeader | None,
        signal: CancelToken,
    ) -> LlmRequest:
        """Open step ``step``'s model request again without making it (the harness replay, D32).

        For an agent on a copy of a recorded log that ends at the step's ``step/start``: the
        prompt is assembled and ``entered`` (the step's recorded input) plus the runtime-context
        snapshot rendered now are appended, as :meth:`_step` does, with ``recorded`` (the
        header the step ran under) as the config proposal. Returns the request built. Refused
        on a session a store publishes: the appends would enter a real log.
        """
        store = self._ctx.get(SESSIONS)
        if store is not None and store.is_live(self._session):
            raise AgentConfigError(
                f'derive_request writes into the log it is given, and session "{self.id}" is '
                "live in the store: call it on a detached copy (ctx.agent.detached(Session.restore"
                "(...)))"
            )
        assembly, snapshot = await self._assemble(signal)
        messages = (*entered, snapshot) if snapshot is not None else tuple(entered)
        _prepared, request = await self._open_request(
            turn, step, render_prompt(assembly), messages, assembly, signal, recorded=recorded
        )
        return request

    async def _pre_step(
        self, turn: int, step: int, claimed: list[UserMessage], signal: CancelToken
    ) -> tuple[Enter | Reject, PromptAssembly]:
        assembly, snapshot = await self._assemble(signal)
        default_messages = tuple(claimed) + ((snapshot,) if snapshot is not None else ())

        async def default() -> Enter | Reject:
            return Enter(default_messages)

        proposed = await self._ctx.waterfall(
            AGENT_PRE_STEP,
            PreStepContext(
                agent=self, turn=turn, step=step, messages=tuple(claimed), signal=signal
            ),
            default,
        )
        decision = pre_step_decision(proposed)  # listeners are plugin code: checked at run time
        signal.throw_if_aborted()
        return decision, assembly

    # ------------------------------------------------------------------ step
    async def _step(
        self,
        turn: int,
        step: int,
        messages: tuple[UserMessage, ...],
        assembly: PromptAssembly,
        signal: CancelToken,
    ) -> _StepEnd:
        session = self._session
        signal.throw_if_aborted()
        system = self._render_prompt(assembly)
        first_attempt = True
        retries = 0
        while True:
            prepared, request = await self._open_request(
                turn, step, system, messages if first_attempt else (), assembly, signal
            )
            first_attempt = False
            self._check_budget(turn)
            assembler = BlockAssembler()
            emit = self._ctx.emit
            # Checked at each chunk, as an emit takes its listeners: none (a headless run, the
            # shipped composition) means no ChunkReceived built and no dispatch (D49).
            watched = self._ctx.host.bus.has_listeners
            started = False
            try:
                llm = self._ctx.service(LLM)
                stream = prepared.stream(request) if prepared is not None else llm.stream(request)
                signal.throw_if_aborted()
                started = True
                async with aclosing(stream) as chunks:
                    with signal.linked_scope():
                        async for chunk in chunks:
                            signal.throw_if_aborted()
                            assembler.push(chunk, now_ms())
                            if watched(AGENT_CHUNK):
                                emit(
                                    AGENT_CHUNK,
                                    ChunkReceived(agent=self, turn=turn, step=step, chunk=chunk),
                                )
                signal.throw_if_aborted()
            except Exception:
                if started:
                    self._settle_interrupted(turn, step, request, assembler, signal)
                raise
            finish = assembler.finish
            if isinstance(finish, ErrorFinish | AbortedFinish):
                session.append(
                    "assistant/attempt",
                    AssistantAttemptData(turn=turn, step=step, stream=assembler.stream_records()),
                )
                proposed = await self._ctx.waterfall(
                    AGENT_REQUEST_ERROR,
                    RequestErrorContext(
                        agent=self,
                        turn=turn,
                        step=step,
                        provider=request.provider,
                        failure=finish.failure,
                        retry_policy=prepared.retry_policy if prepared is not None else None,
                        signal=signal,
                        attempt=retries,
                    ),
                    _no_action,
                )
                action = request_error_action(proposed)  # plugin code: checked at run time
                signal.throw_if_aborted()  # cancellation beats a retry
                if action is None:
                    raise _llm_error(finish.failure)
                retries += 1
                continue
            # The one place a model's calls enter the log: from here on the harness owns
            # their ids (unique and non-empty in the session; see .call_ids).
            reply = self._call_ids.own(
                assembler.message(provider=request.provider, model=request.model)
            )
            usage = assembler.usage
            session.append(
                "assistant/message",
                AssistantMessageData(
                    turn=turn,
                    step=step,
                    message=reply,
                    usage=usage if usage is not None else UNSET,
                    stream=assembler.stream_records(),
                ),
                surface_op="append",
            )
            if isinstance(finish, MaxTokensFinish):
                return "max-tokens"
            calls = [block for block in reply.content if isinstance(block, ToolCallBlock)]
            if not calls:
                return "completed"
            tools = self._ctx.service(TOOLS)
            deferred: list[str] = []
            concluded = await execute_tool_calls(
                self,
                tools,
                turn,
                step,
                calls,
                signal,
                self._pending.append,
                max_parallel=self._options.max_parallel_tool_calls,
                deferred=deferred,
            )
            if deferred:
                if signal.aborted:
                    # The turn ends aborted: no call may stay without a result (D18).
                    self._close_unanswered_calls()
                    return None
                self._awaiting = tuple(deferred)
                return "awaiting"
            return "completed" if concluded else None

    def _queue_budget_notice(self, reason: BudgetExceededReason) -> None:
        """Tell the model, at the start of the next turn, why the last one stopped (once)."""
        if any(
            isinstance(m.source, PluginSource) and m.source.plugin == BUDGET_NOTICE_SOURCE
            for m in self._pending
        ):
            return
        self._pending.append(
            UserMessage(
                id=new_message_id(),
                content=(TextBlock(text=f"[{reason.kind_name}] {reason.message}"),),
                source=PluginSource(plugin=BUDGET_NOTICE_SOURCE),
            )
        )

    def _check_budget(self, turn: int) -> None:
        """The spend-limit gate every model request of the loop crosses (retries included)."""
        gate = self.budget_gate
        if gate is not None:
            stop = gate(turn)
            if stop is not None:
                raise _BudgetStop(stop)
        budget = self._options.budget
        if budget is None or not budget.active:
            return
        meter = self._ctx.get(TOKEN_METER)
        if not isinstance(meter, TokenMeter):
            # No token-meter row: a private meter (catalogue prices only) still reads the log.
            if self._meter is None:
                self._meter = TokenMeter()
            meter = self._meter
        stop = check_budget(budget, meter, self._session, turn)
        if stop is not None:
            raise _BudgetStop(stop)

    def _settle_interrupted(
        self,
        turn: int,
        step: int,
        request: LlmRequest,
        assembler: BlockAssembler,
        signal: CancelToken,
    ) -> None:
        """Keep what a cut stream delivered: the visible prefix, or the raw attempt."""
        stream = assembler.stream_records()
        if signal.aborted:
            interrupted = assembler.interrupted_message(
                provider=request.provider, model=request.model
            )
            if interrupted is not None:
                usage = assembler.usage
                self._session.append(
                    "assistant/message",
                    AssistantMessageData(
                        turn=turn,
                        step=step,
                        message=interrupted,
                        usage=usage if usage is not None else UNSET,
                        interrupted=True,
                        stream=stream,
                    ),
                    surface_op="append",
                )
                return
        self._session.append(
            "assistant/attempt", AssistantAttemptData(turn=turn, step=step, stream=stream)
        )

    async def _open_request(
        self,
        turn: int,
        step: int,
        system: str,
        entered: Sequence[UserMessage],
        assembly: PromptAssembly,
        signal: CancelToken,
        *,
        recorded: EpochHeader | None = None,
    ) -> tuple[PreparedCall | None, LlmRequest]:
        """Everything a model request is made of, logged in the step: its config, the system
        prompt, the entered input, the header. The harness replay (:mod:`.harness`, D32) calls
        it on a copy of a recorded log with the header that step ran under as ``recorded``."""
        config, prepared = await self._prepare_request(turn, step, signal, recorded=recorded)
        projected = self._system_message.project(system, turn, step)
        if projected is not None:
            data, op, cited = projected
            self._session.append("system/message", data, surface_op=op, source_event_seqs=cited)
        for message in entered:
            self._session.append("user/message", message, surface_op="append")
        return prepared, self._build_request(config, prepared, assembly, signal)

    async def _prepare_request(
        self, turn: int, step: int, signal: CancelToken, *, recorded: EpochHeader | None = None
    ) -> tuple[LlmCallConfig, PreparedCall | None]:
        """The call config for this request (``agent/request``) and its prepared route."""
        session = self._session
        options = self._options
        persisted = session.request_header()
        provider = options.provider or ""
        model = options.model or ""
        if recorded is not None:
            seed = _request_proposal(recorded)
        elif self._header_logged and persisted is not None:
            seed = _request_proposal(persisted)
        else:
            effort: Any = options.reasoning_effort
            if effort is None and persisted is not None:
                cfg = persisted.config
                marked = (
                    persisted.adapter_defaults is not UNSET
                    and persisted.adapter_defaults.reasoning_effort is True
                )
                if cfg.provider == provider and cfg.model == model and not marked:
                    effort = cfg.reasoning_effort
            seed = LlmCallConfig(
                provider=provider,
                model=model,
                reasoning_effort=effort if effort is not None else UNSET,
                max_tokens=options.max_tokens if options.max_tokens is not None else UNSET,
            )

        async def default() -> LlmCallConfig:
            return seed

        config = await self._ctx.waterfall(
            AGENT_REQUEST,
            RequestProposal(agent=self, turn=turn, step=step, signal=signal),
            default,
        )
        signal.throw_if_aborted()
        if not isinstance(config, LlmCallConfig):
            raise TypeError(f"agent/request must resolve to an LlmCallConfig, got {config!r}")
        if not config.provider or not config.model:
            raise AgentConfigError(
                f'agent "{self.id}" has no provider/model: set AgentOptions.provider and '
                "AgentOptions.model or supply both via the agent/request waterfall"
            )
        llm = self._ctx.service(LLM)
        prepared: PreparedCall | None = None
        try:
            prepared = await llm.prepare_call(config, signal)
            config = prepared.config
        except LlmError as error:
            if error.code != "NO_ADAPTER":  # middleware may serve an unrouted provider
                raise
        signal.throw_if_aborted()
        return config, prepared

    def _build_request(
        self,
        config: LlmCallConfig,
        prepared: PreparedCall | None,
        assembly: PromptAssembly,
        signal: CancelToken,
    ) -> LlmRequest:
        """Log the request envelope when it changed and build the frozen request."""
        session = self._session
        tools = tuple(assembly.tools)
        defaults = prepared.adapter_defaults if prepared is not None else UNSET
        header = canonical_header(
            EpochHeader(config=config, adapter_defaults=defaults, tools=tools or UNSET)
        )
        baseline = session.request_header()
        if not self._header_logged:
            session.append(
                "request/header",
                RequestHeaderData(
                    header=header, reason="initial" if baseline is None else "resume"
                ),
            )
            self._header_logged = True
        elif baseline is None or not self._same_header(baseline, header):
            session.append("request/header", RequestHeaderData(header=header, reason="change"))
        window = prepared.context_window if prepared is not None else None
        context = RequestContextData(
            provider=config.provider,
            model=config.model,
            context_window=window if window is not None else UNSET,
        )
        previous = session.request_context()
        if previous is None or (previous.provider, previous.model, previous.context_window) != (
            context.provider,
            context.model,
            context.context_window,
        ):
            session.append("request/context", context)
        signal.throw_if_aborted()
        return LlmRequest(
            config=header.config,
            # The view is an immutable O(1) snapshot: a tuple copy would cost
            # O(history) per request (LlmRequest keeps a MessagesView as is).
            messages=session.derive_messages(),
            tools=tools,
            signal=signal,
            session=session,
            agent_loop=True,
        )

    def _same_header(self, baseline: EpochHeader, header: EpochHeader) -> bool:
        """``headers_equal(baseline, header)``, skipping the tool schemas' encoding when the
        same logged header was found equal to one built from the same parts at an earlier step.

        Equality is transitive: ``header`` with the same config, defaults and system as the
        earlier one, and the very same tool schema objects (the registry hands out one frozen
        tuple until a tool is registered or unregistered, docs/decisions.md D38), equals the
        logged header exactly when the earlier one did. Anything else compares in full.
        """
        match = self._header_match
        if match is not None and match[0] is baseline and _same_parts(match[1], header):
            return True
        equal = headers_equal(baseline, header)
        self._header_match = (baseline, header) if equal else None
        return equal

    def __repr__(self) -> str:
        return f"<Agent {self.id!r} {self.status} last_turn={self._last_turn}>"


def _same_parts(a: EpochHeader, b: EpochHeader) -> bool:
    """The same config, defaults and system, and the same tool schema objects in order."""
    if a.config != b.config or a.adapter_defaults != b.adapter_defaults or a.system != b.system:
        return False
    tools_a = () if a.tools is UNSET else a.tools
    tools_b = () if b.tools is UNSET else b.tools
    return len(tools_a) == len(tools_b) and all(
        x is y for x, y in zip(tools_a, tools_b, strict=True)
    )


async def _no_action() -> None:
    return None
