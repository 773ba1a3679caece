"""The value types of the tools runtime: definitions, executions, decisions, results.

A tool call moves through these objects:

1. the caller (the agent loop, or a composite tool for a nested call) builds a
   :class:`ToolExecutionInput` with the parsed arguments and a
   :class:`~dsh_host._cancel.CancelToken`;
2. the runtime snapshots the arguments once into a :class:`ToolExecution`
   (immutable except for ``signal`` inside ``tools/execute``) and runs the
   pipeline described in :mod:`dsh_host._tools.runtime`;
3. every stage that can end the call produces a :class:`ToolExecutionResult`,
   which is frozen before any listener sees it.

Only ``content``, ``is_error``, ``error.info`` and ``meta`` of a result ever
reach the durable log; ``value`` stays in the process.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

import msgspec
from msgspec import UNSET

from dsh_host._jsonsafe import freeze_json, to_json_builtins
from dsh_host._session.effects import idempotency_key
from dsh_host._session.messages import ContentBlock, TextBlock, ToolSchema, UserMessage
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN

from .errors import ABORTED, ABORTED_BEFORE_DISPATCH, ToolRegistrationError

if TYPE_CHECKING:
    from dsh_host._cancel import CancelToken

__all__ = [
    "STOPPED_OUTCOME_UNKNOWN_TEXT",
    "Accept",
    "Allow",
    "ApprovalOutcome",
    "ApprovalProvider",
    "ApprovalRequest",
    "ApprovalSubject",
    "Ask",
    "Block",
    "Deny",
    "Done",
    "ExecutionMode",
    "NotDone",
    "PostExecuteContext",
    "PostToolDecision",
    "PreToolDecision",
    "ReconcileVerdict",
    "Reconciler",
    "ToolAgent",
    "ToolDefinition",
    "ToolErrorInfo",
    "ToolExecution",
    "ToolExecutionInput",
    "ToolExecutionResult",
    "ToolExecutionToken",
    "ToolFailure",
    "ToolGuard",
    "ToolOutput",
    "ToolProgress",
    "ToolResultEvent",
    "Unknown",
    "aborted_before_dispatch_result",
    "aborted_result",
    "approval_refusal",
    "is_abort",
    "json_output",
    "no_agent_refusal",
    "stopped_result",
    "text_output",
]

#: An approval service's answer (``user-approval``'s README, "request(req) step by step").
ApprovalOutcome: TypeAlias = Literal["allowed-once", "rejected", "cancelled", "unavailable"]


@dataclass(frozen=True, slots=True)
class ApprovalSubject:
    """How the refusal texts name what approval was asked for (one phrase per sentence).

    The call pipeline's ask names the tool (``tool "bash"`` three times); a
    sandbox escalation names the escalation in three slightly different ways.
    """

    rejected: str  #: the user rejected <this>
    asked_for: str  #: approval for <this> was cancelled
    requiring: str  #: <this> requires approval, but ...


def approval_refusal(outcome: str, subject: ApprovalSubject) -> str:
    """The model-visible text for a non-granting approval outcome: the one mapping.

    ``rejected`` / ``cancelled`` / ``unavailable`` each have their sentence;
    ``allowed-once`` (or anything else) is not a refusal and raises TypeError.
    """
    if outcome == "rejected":
        return f"the user rejected {subject.rejected}"
    if outcome == "cancelled":
        return f"approval for {subject.asked_for} was cancelled"
    if outcome == "unavailable":
        return f"{subject.requiring} requires approval, but no approval channel is available"
    raise TypeError(
        f"unreachable: the approval service answered {outcome!r}, which is not a refusing "
        "ApprovalOutcome (rejected, cancelled, unavailable)"
    )


def no_agent_refusal(subject: ApprovalSubject) -> str:
    """The text when approval is needed but the call has no agent to route the ask through."""
    return f"{subject.requiring} requires approval, but the call has no agent to route it through"
#: How a call may be scheduled next to its siblings.
ExecutionMode: TypeAlias = Literal["parallel", "exclusive"]


class ToolAgent(Protocol):
    """What the tools layer needs of an agent (the agent layer sits above it).

    The checkpoint policy flushes ``exec.agent.session`` before a top-level
    body runs; the approval service audits into it.
    """

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Any: ...


class ToolExecutionToken:
    """Opaque identity of one execution; nested calls carry it as ``parent``.

    Compared by identity only and never serialized, so a composite tool can
    mark its sub-calls without handing them its live execution object.
    """

    __slots__ = ("_n",)
    _counter = itertools.count(1)

    def __init__(self) -> None:
        self._n = next(self._counter)

    def __repr__(self) -> str:
        return f"<ToolExecutionToken #{self._n}>"


# --------------------------------------------------------------------------- definitions

#: ``render(args, value) -> content``: the pure projection the model reads.
Renderer: TypeAlias = Callable[[Any, Any], Sequence[ContentBlock]]
#: ``presentation_meta(args, value) -> JSON``: UI payload, computed for top-level calls only.
MetaProjector: TypeAlias = Callable[[Any, Any], Any]
#: A tool body: ``await execute(args, exec) -> canonical JSON value``.
ToolBody: TypeAlias = Callable[[Any, "ToolExecution"], Awaitable[Any]]
#: ``finalize_content(exec, result) -> content | None``: last-mile content transform.
ContentFinalizer: TypeAlias = Callable[
    ["ToolExecution", "ToolExecutionResult"], Sequence[ContentBlock] | None
]
#: A guard: sync, evaluated after ``allow``; a returned string denies the call.
ToolGuard: TypeAlias = Callable[["ToolExecution"], str | None]


@dataclass(frozen=True, slots=True)
class Done:
    """A reconciler's verdict: the call did take effect; ``value`` is its result (the tool's
    output contract applies to it, as to a body's value)."""

    value: Any
    kind: Literal["done"] = "done"


@dataclass(frozen=True, slots=True)
class NotDone:
    """A reconciler's verdict: the call did not take effect (the model may retry it)."""

    kind: Literal["not-done"] = "not-done"


@dataclass(frozen=True, slots=True)
class Unknown:
    """A reconciler's verdict: it cannot tell; the call stays ``TOOL_OUTCOME_UNKNOWN``."""

    reason: str | None = None
    kind: Literal["unknown"] = "unknown"


#: What a reconciler finds out about a call whose outcome the log does not know (D26).
ReconcileVerdict: TypeAlias = Done | NotDone | Unknown
#: ``await reconcile(args, exec) -> verdict``: runs through the same pipeline as the body
#: (pre-execute rules, approval, guards, ``tools/execute`` wrappers), with the call's own id
#: and therefore its idempotency key (D26 in docs/decisions.md).
Reconciler: TypeAlias = Callable[[Any, "ToolExecution"], Awaitable[ReconcileVerdict]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolOutput:
    """The canonical output contract: what a successful body value may be and how it reads.

    ``schema`` (the enforced JSON Schema subset; ``{}`` accepts any JSON value)
    is checked against every successful value before post-execute.
    """

    render: Renderer
    schema: Mapping[str, Any] = field(default_factory=dict)
    presentation_meta: MetaProjector | None = None


def _render_text(_args: Any, value: Any) -> Sequence[ContentBlock]:
    return (TextBlock(text=value),)


def text_output() -> ToolOutput:
    """Output contract of a tool whose value is the text the model reads."""
    return ToolOutput(schema={"type": "string"}, render=_render_text)


def _render_json(_args: Any, value: Any) -> Sequence[ContentBlock]:
    if isinstance(value, str):
        return (TextBlock(text=value),)
    encoded = msgspec.json.encode(to_json_builtins(value, "tool output")).decode()
    return (TextBlock(text=encoded),)


def json_output(schema: Mapping[str, Any] | None = None) -> ToolOutput:
    """Output contract of a tool returning a JSON value, shown to the model as compact JSON."""
    return ToolOutput(schema=dict(schema or {}), render=_render_json)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolDefinition:
    """A registered tool: its model-facing schema plus the body and output contract.

    ``parameters`` is a JSON Schema object (enforced subset, see
    :mod:`dsh_host._tools.schema`); the runtime validates the model's
    arguments against it before calling ``execute``, so a body never sees
    arguments that break its declared shape (violations become
    ``INVALID_ARGS`` results). ``is_concurrency_safe(args)`` opts a call into
    a parallel group only by returning exactly ``True``. ``timeout_ms`` is
    declarative (never sent to the model): the ``timeout-policy`` plugin, when
    composed, aborts the body's token after it and records ``TOOL_TIMEOUT``;
    declare it only for a body that stops when its token aborts. ``reconcile`` finds out
    whether a call left ``TOOL_OUTCOME_UNKNOWN`` by a crash took effect (D26).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    execute: ToolBody
    output: ToolOutput
    finalize_content: ContentFinalizer | None = None
    is_concurrency_safe: Callable[[Any], bool] | None = None
    timeout_ms: int | float | None = None
    reconcile: Reconciler | None = None
    #: the tool changes nothing outside the call (reads only): running it again is safe, so a
    #: fork's effects ledger and ``dsh replay`` let it run (D27 in docs/decisions.md)
    read_only: bool = False

    def schema(self) -> ToolSchema:
        """The model-facing projection: name, description, parameters only (a deep copy)."""
        return ToolSchema(
            name=self.name,
            description=self.description,
            parameters=freeze_json(self.parameters, f'tool "{self.name}" parameters'),
        )


# --------------------------------------------------------------------------- executions


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolExecutionInput:
    """One call as its caller describes it.

    ``arguments`` are the parsed JSON arguments (the raw model string is what
    the ``tool/call`` event records). ``parent`` is the enclosing execution's
    token for a nested call (the checkpoint policy skips those); ``agent`` is
    set by the agent loop.
    """

    call_id: str
    name: str
    arguments: Any
    signal: CancelToken
    agent: ToolAgent | None = None
    parent: ToolExecutionToken | None = None
    root_call_id: str | None = None
    #: the model's raw JSON argument string, when the call came from a model (kept verbatim)
    raw_arguments: str | None = None
    #: the agent loop sets this on a model call whose approval may wait for a person (D19):
    #: with an approval service in ``defer`` mode, an unanswered ask ends the call ``deferred``
    deferrable: bool = False
    #: a decision recorded for this (deferred) call earlier; applied instead of asking again,
    #: after the current ``tools/pre-execute`` rules and approval policy (a denial wins)
    approval_decision: Literal["allowed-once", "rejected"] | None = None
    #: run the tool's ``reconcile`` instead of its body, for the (crashed) call ``call_id``
    #: (D26): every other stage of the pipeline is the body's
    reconcile: bool = False


class ToolExecution:
    """One call inside the pipeline: identity, frozen arguments, cancellation.

    ``arguments`` are the parsed arguments, snapshotted once and deeply frozen;
    ``raw_arguments`` the model's string exactly as ``tool/call`` logged it
    (None for calls that did not come from a model, e.g. nested dispatch).

    Everything is read-only except :attr:`signal`, which a ``tools/execute``
    wrapper may replace for its delegated lifetime (the runtime fuses the
    caller's token back in before the body runs and restores the wrapper's
    afterwards). The object is frozen for good once the call finished, before
    ``tools/result`` observers see it.

    The body receives the same object: :meth:`defer_context` attaches a user
    message that the loop appends after the result (in the next step), and
    :meth:`conclude_turn` ends the turn after this result batch if the call
    succeeds. Side-effecting bodies should forward :attr:`call_id` as an
    idempotency key (D11).
    """

    __slots__ = (
        "__weakref__",
        "_concluded",
        "_deferred",
        "_dispatching",
        "_frozen",
        "_progress",
        "_signal",
        "agent",
        "arguments",
        "call_id",
        "name",
        "parent",
        "raw_arguments",
        "reconciling",
        "root_call_id",
        "token",
    )

    call_id: str
    root_call_id: str
    name: str
    arguments: Any
    agent: ToolAgent | None
    parent: ToolExecutionToken | None
    raw_arguments: str | None
    reconciling: bool  #: the tool's reconciler runs instead of its body (D26)
    token: ToolExecutionToken
    _signal: CancelToken
    _dispatching: bool
    _frozen: bool
    _deferred: list[UserMessage]
    _concluded: bool
    _progress: Callable[[ToolProgress], None] | None

    def __init__(
        self,
        source: ToolExecutionInput,
        arguments: Any,
        progress: Callable[[ToolProgress], None] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "call_id", source.call_id)
        set_(self, "root_call_id", source.root_call_id or source.call_id)
        set_(self, "name", source.name)
        set_(self, "arguments", arguments)
        set_(self, "agent", source.agent)
        set_(self, "parent", source.parent)
        raw = source.raw_arguments
        set_(self, "raw_arguments", raw if isinstance(raw, str) else None)
        set_(self, "reconciling", source.reconcile is True)
        set_(self, "token", ToolExecutionToken())
        set_(self, "_signal", source.signal)
        set_(self, "_dispatching", False)
        set_(self, "_frozen", False)
        set_(self, "_deferred", [])
        set_(self, "_concluded", False)
        set_(self, "_progress", progress)

    @property
    def signal(self) -> CancelToken:
        """The cancellation token visible to this stage (the body sees a fused one)."""
        return self._signal

    @signal.setter
    def signal(self, token: CancelToken) -> None:
        if not self._dispatching or self._frozen:
            raise AttributeError(
                "ToolExecution.signal can only be replaced by a tools/execute wrapper while the "
                "call is being dispatched"
            )
        object.__setattr__(self, "_signal", token)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "signal":
            type(self).signal.__set__(self, value)  # type: ignore[attr-defined]
            return
        raise AttributeError(f"ToolExecution.{name} is read-only")

    def defer_context(self, message: UserMessage) -> None:
        """Attach ``message`` to this call's result; the loop appends it after the results."""
        if self._frozen:
            raise RuntimeError("defer_context() called after the tool call finished")
        self._deferred.append(message)

    def conclude_turn(self) -> None:
        """Mark a successful result of this call as the end of the agent's turn."""
        if self._frozen:
            raise RuntimeError("conclude_turn() called after the tool call finished")
        object.__setattr__(self, "_concluded", True)

    @property
    def reports_progress(self) -> bool:
        """Someone watches this call's live output (a ``tools/progress`` listener existed when
        the call began): a body may skip preparing it otherwise."""
        return self._progress is not None

    def report_progress(self, text: str, stream: Literal["stdout", "stderr"] = "stdout") -> None:
        """Show ``text`` (a piece of the body's live output) to whoever watches the run.

        Nothing is logged and nothing waits: the result is what the log keeps. A no-op once
        the call finished, or where nobody provides the channel (a call outside a runtime).
        """
        if self._progress is not None and not self._frozen and text:
            self._progress(ToolProgress(self, stream, text))

    @property
    def idempotency_key(self) -> str:
        """The key to hand an external system so it applies this call's effect at most once.

        ``dsh-`` and 32 hex digits of SHA-256 over the session id and the call id: both are
        durable before the body runs (the ``tool/call`` is flushed first) and the call id is
        unique in its session (the agent loop owns it), so the key is the same for this call
        in every process that runs it -- a resume, a decision from ``dsh approvals decide``
        -- and differs for every other call of any session. It is a digest, not the ids
        joined, so its length and characters suit any API (a session id may hold ``/``). A
        call outside a session is keyed on its call id alone.
        """
        agent = self.agent
        session_id = getattr(agent.session, "id", None) if agent is not None else None
        return idempotency_key(session_id if isinstance(session_id, str) else "", self.call_id)

    @property
    def finished(self) -> bool:
        """True once the result was published (the object no longer changes)."""
        return self._frozen

    def __repr__(self) -> str:
        nested = f" parent={self.parent!r}" if self.parent is not None else ""
        return f"<ToolExecution {self.name!r} call_id={self.call_id!r}{nested}>"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ToolErrorInfo:
    """Internal failure identity, written to the log as ``tool/result`` ``error: {name, code}``."""

    name: str
    code: str


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """Why a call failed: the message (without the ``Error: `` envelope) and, for coded
    harness errors, their identity."""

    message: str
    info: ToolErrorInfo | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolExecutionResult:
    """The outcome of one call. Failures never carry a value; successes never an error.

    ``value`` is the canonical JSON value of a success (``UNSET`` on failure);
    ``meta`` the tool's presentation payload (``UNSET`` when absent);
    ``additional_contexts`` user messages for the next step, in order.
    """

    is_error: bool
    content: tuple[ContentBlock, ...]
    value: Any = UNSET
    error: ToolFailure | None = None
    meta: Any = UNSET
    additional_contexts: tuple[UserMessage, ...] = ()
    concludes_turn: bool = False

    def __post_init__(self) -> None:
        if self.is_error:
            if self.error is None or self.value is not UNSET or self.concludes_turn:
                raise ToolRegistrationError(
                    "a failed ToolExecutionResult needs an error and carries no value and no "
                    "concludes_turn"
                )
        elif self.error is not None:
            raise ToolRegistrationError("a successful ToolExecutionResult cannot carry an error")

    @classmethod
    def failure(
        cls,
        message: str,
        *,
        info: ToolErrorInfo | None = None,
        content: Sequence[ContentBlock] | None = None,
        additional_contexts: Sequence[UserMessage] = (),
    ) -> ToolExecutionResult:
        """A failure whose model text is ``Error: <message>`` unless ``content`` is given."""
        blocks = tuple(content) if content is not None else (TextBlock(text=f"Error: {message}"),)
        return cls(
            is_error=True,
            content=blocks,
            error=ToolFailure(message, info),
            additional_contexts=tuple(additional_contexts),
        )

    @classmethod
    def success(
        cls,
        value: Any,
        content: Sequence[ContentBlock],
        *,
        meta: Any = UNSET,
        additional_contexts: Sequence[UserMessage] = (),
    ) -> ToolExecutionResult:
        """A success (a ``tools/execute`` wrapper's own result is re-validated by the runtime)."""
        return cls(
            is_error=False,
            value=value,
            content=tuple(content),
            meta=meta,
            additional_contexts=tuple(additional_contexts),
        )


_ABORTED_TEXT: Final = "tool call aborted"
_ABORTED_BEFORE_TEXT: Final = "tool call aborted before dispatch"


def aborted_result(prior: ToolExecutionResult | None = None) -> ToolExecutionResult:
    """Canonical result when cancellation supersedes a body that was invoked (``ABORTED``)."""
    return ToolExecutionResult.failure(
        _ABORTED_TEXT,
        info=ToolErrorInfo("AbortError", ABORTED),
        additional_contexts=prior.additional_contexts if prior is not None else (),
    )


#: Model-visible notice of a body that cancellation stopped while it ran (D18).
STOPPED_OUTCOME_UNKNOWN_TEXT: Final = (
    "The tool call was stopped by a cancellation while it was running. It may have partly run: "
    "its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the "
    "operation is read-only or idempotent; if it may have side effects, first verify external "
    "state or ask the user. Do not retry blindly."
)


def stopped_result(prior: ToolExecutionResult | None = None) -> ToolExecutionResult:
    """The result of a body that had started when its call was cancelled (D18).

    Code ``TOOL_OUTCOME_UNKNOWN`` (as crash repair writes for a call that may
    have run), the notice above, then whatever the body itself returned (the
    output of a stopped command tells the model how far it got). Never a
    success, never "not started".
    """
    content: tuple[ContentBlock, ...] = (TextBlock(text=STOPPED_OUTCOME_UNKNOWN_TEXT),)
    if prior is not None and prior.content and not is_abort(prior):
        content += (TextBlock(text="What the tool returned when it stopped:"), *prior.content)
    return ToolExecutionResult.failure(
        "tool call stopped by cancellation; outcome unknown",
        info=ToolErrorInfo("ToolOutcomeUnknownError", TOOL_OUTCOME_UNKNOWN),
        content=content,
        additional_contexts=prior.additional_contexts if prior is not None else (),
    )


def is_abort(result: ToolExecutionResult) -> bool:
    """Whether ``result`` is a plain ``ABORTED`` error (a body's own "tool call aborted")."""
    info = result.error.info if result.error is not None else None
    return info is not None and info.code == ABORTED


def aborted_before_dispatch_result(
    prior: ToolExecutionResult | None = None,
) -> ToolExecutionResult:
    """Canonical result when cancellation prevented the body (``ABORTED_BEFORE_DISPATCH``).

    The checkpoint policy returns this from ``tools/execute`` when the caller
    cancelled while it was flushing.
    """
    return ToolExecutionResult.failure(
        _ABORTED_BEFORE_TEXT,
        info=ToolErrorInfo("AbortError", ABORTED_BEFORE_DISPATCH),
        additional_contexts=prior.additional_contexts if prior is not None else (),
    )


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Allow:
    """``tools/pre-execute``: run the call (guards still run)."""

    kind: Literal["allow"] = "allow"


@dataclass(frozen=True, slots=True)
class Deny:
    """``tools/pre-execute``: do not run; the model reads ``Error: <reason>``."""

    reason: str
    kind: Literal["deny"] = "deny"


@dataclass(frozen=True, slots=True)
class Ask:
    """``tools/pre-execute``: run only if the approval service answers ``allowed-once``."""

    reason: str | None = None
    kind: Literal["ask"] = "ask"


#: The decision of the ``tools/pre-execute`` waterfall (default :class:`Allow`).
PreToolDecision: TypeAlias = Allow | Deny | Ask


@dataclass(frozen=True, slots=True)
class Accept:
    """``tools/post-execute``: keep the outcome, optionally replacing ``content`` *or* ``value``.

    Replacing ``value`` (successes only) re-validates and re-renders it;
    replacing both is an error. ``additional_contexts`` are appended after the
    result's own.
    """

    content: Sequence[ContentBlock] | None = None
    value: Any = UNSET
    additional_contexts: Sequence[UserMessage] = ()
    kind: Literal["accept"] = "accept"


@dataclass(frozen=True, slots=True)
class Block:
    """``tools/post-execute``: turn the outcome into a failure whose content is ``feedback``.

    Context the body deferred is discarded; only this decision's contexts remain.
    """

    feedback: Sequence[ContentBlock]
    additional_contexts: Sequence[UserMessage] = ()
    kind: Literal["block"] = "block"


#: The decision of the ``tools/post-execute`` waterfall (default ``Accept()``).
PostToolDecision: TypeAlias = Accept | Block


@dataclass(frozen=True, slots=True)
class PostExecuteContext:
    """The argument of ``tools/post-execute`` listeners: the call and its (frozen) outcome."""

    exec: ToolExecution
    result: ToolExecutionResult


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """The argument of ``tools/progress`` observers: a piece of a running call's live output
    (text as it came, possibly mid-line)."""

    exec: ToolExecution
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True, slots=True)
class ToolResultEvent:
    """The argument of ``tools/result`` observers: the frozen call and its final result."""

    exec: ToolExecution
    result: ToolExecutionResult


class ApprovalProvider(Protocol):
    """The ``approval`` service (``ctx.get(APPROVAL)``): what the host calls of it.

    ``user-approval`` implements it; the host never imports a plugin, so this is structural.
    ``request`` answers one ask (an outcome such as ``allowed-once``, ``rejected``,
    ``unavailable``, or ``deferred`` for a deferrable request); ``decide`` records a decision for
    a deferred call; ``awaiting_reason`` is the ``turn/end`` reason of a turn that deferred calls.
    Two methods are optional and probed where they are used: ``policy_context(agent) -> str``
    (the prompt's ``approval:policy`` text) and ``recorded_decision_change(session, call_id,
    tool_name) -> str | None`` (what changed since a deferred call was asked, D19).
    """

    async def request(self, req: ApprovalRequest) -> str: ...

    def effective_policy(self, session: Any) -> str: ...

    def decide(
        self,
        agent: Any,
        call_id: str,
        decision: str,
        *,
        reason: str | None = None,
        decided_by: str | None = None,
        args_digest: str | None = None,
    ) -> object: ...

    def awaiting_reason(self, call_ids: tuple[str, ...]) -> object: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRequest:
    """What the tools runtime asks ``ctx.approval.request(req)`` for an ``ask`` decision.

    Deliberately without the arguments: the call is already logged as
    ``tool/call``; answerers correlate by ``call_id``.
    """

    agent: ToolAgent
    tool_name: str
    call_id: str | None = None
    reason: str | None = None
    signal: CancelToken | None = None
    #: ``pre-execute`` when asked before the body could start (logged in ``approval/asked``)
    stage: Literal["pre-execute"] | None = None
    #: True when the caller can wait for a later decision: the service may then answer
    #: ``deferred`` instead of failing closed (D19; only the pipeline's pre-execute ask of a
    #: top-level model call can, never an ask from inside a running body)
    deferrable: bool = False
    #: True when a decision recorded for this call no longer holds (it was made in another
    #: context: sandbox, network, tool definition, composition): nobody is asked, the call is
    #: deferred again for a person to decide in this context (D22; needs ``deferrable``)
    reask: bool = False
