"""The tools runtime (service ``tools``): registration and the non-bypassable call pipeline.

Every call, whoever makes it, goes through the same stages in the same order
(DSH's stages and order; no path skips one):

1. **Create.** Snapshot the arguments once into frozen JSON and capture the
   tool's ``finalize_content``. Arguments that are not lossless JSON end the
   call at once (this wins even over a cancelled caller).
2. **Pre-abort.** A caller token that is already aborted ends the call with
   ``ABORTED_BEFORE_DISPATCH``; no listener runs.
3. **``tools/pre-execute``** waterfall → ``Allow | Deny | Ask`` (default allow).
   Listeners see the frozen arguments and cannot rewrite them.
4. **Ask** → ``ctx.approval.request(...)`` when an approval service is
   composed; otherwise the call is denied (fail closed).
5. **Guards** (only after allow): synchronous, monotonic — they can deny, never
   allow, so no later listener can reopen what a guard closed.
6. **Re-check the caller's token**; denials that settled after cancellation are
   kept verbatim.
7. **``tools/execute``** around-chain; its innermost step fuses the caller's
   token with whatever token a wrapper installed, validates the arguments
   against ``parameters`` and awaits the body. A started body is never
   abandoned: if the caller cancels, the body is asked to stop (through its
   token) and awaited, and whatever it returns becomes an outcome-unknown
   result (``TOOL_OUTCOME_UNKNOWN``, D18: it may have partly run).
8. **``tools/post-execute``** waterfall → ``Accept | Block``.
9. **Finish**: materialize, apply ``finalize_content`` exactly once, freeze the
   execution, emit **``tools/result``**.

Failures of the *pipeline itself* (a throwing pre-execute listener, guard,
approval service or ``tools/execute`` wrapper) are "final results": they skip
post-execute. Failures of the *tool* (unknown tool, invalid arguments, a body
that raises, invalid output) are ordinary error results and do go through
post-execute.

The agent loop uses the staged view (:meth:`ToolRuntime.prepare`,
:meth:`~ToolRuntime.dispatch`, :meth:`~ToolRuntime.finalize`,
:meth:`~ToolRuntime.finish`) so that policy stages stay in model order while
bodies of parallel-safe calls overlap; :meth:`ToolRuntime.execute` runs the
same stages back to back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from msgspec import UNSET

from dsh_host._cancel import CancelToken, fuse
from dsh_host._jsonsafe import NonJsonValueError, check_json, freeze_json, json_dec_hook
from dsh_host._session.messages import (
    ContentBlock,
    ImageBlock,
    KnownContentBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSchema,
    UserMessage,
    block_type,
)
from dsh_host._session.repair import TOOL_OUTCOME_UNKNOWN
from dsh_host.errors import DshError

from .errors import (
    RECONCILED_NOT_DONE,
    RECONCILED_UNKNOWN,
    ToolArgsError,
    ToolCallWaits,
    ToolNotFoundError,
    ToolOutputError,
    ToolRegistrationError,
)
from .keys import (
    APPROVAL,
    TOOLS_CHANGE,
    TOOLS_EXECUTE,
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    TOOLS_PROGRESS,
    TOOLS_RESULT,
)
from .schema import check_object_schema, check_schema, validate
from .types import (
    Accept,
    Allow,
    ApprovalRequest,
    ApprovalSubject,
    Ask,
    Block,
    ContentFinalizer,
    Deny,
    Done,
    ExecutionMode,
    NotDone,
    PostExecuteContext,
    PostToolDecision,
    PreToolDecision,
    ToolDefinition,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolGuard,
    ToolOutput,
    ToolProgress,
    ToolResultEvent,
    Unknown,
    aborted_before_dispatch_result,
    aborted_result,
    approval_refusal,
    is_abort,
    no_agent_refusal,
    stopped_result,
)

if TYPE_CHECKING:
    from dsh_host._context import Context

__all__ = [
    "RESERVED_TOOL_NAMES",
    "Dispatched",
    "Prepared",
    "ToolRuntime",
    "error_message",
    "error_result",
]

log = logging.getLogger("dsh.tools")

#: Names no tool may take (DSH reserves ``run_code`` for Code Mode).
RESERVED_TOOL_NAMES = frozenset({"run_code"})

_ARGS_NOT_JSON = "tool execution arguments must be losslessly JSON-serializable"
_BLOCK_TYPES = (TextBlock, ReasoningBlock, ImageBlock, ToolCallBlock, ToolResultBlock)


def error_message(error: BaseException) -> str:
    """The human-readable message of a raised exception (never raises itself).

    ``str(error)``, or the class name when that is empty; a hostile exception
    whose ``__str__`` raises reads ``<unprintable thrown value>``.
    """
    try:
        text = str(error)
        return text if text else type(error).__name__
    except Exception:
        return "<unprintable thrown value>"


def _error_info(error: BaseException) -> ToolErrorInfo | None:
    """``{name, code}`` for a coded harness error (any :class:`DshError`), else None."""
    try:
        if isinstance(error, DshError):
            return ToolErrorInfo(type(error).__name__, str(error.code))
    except Exception:
        return None
    return None


def error_result(error: BaseException) -> ToolExecutionResult:
    """The canonical failure for a raised exception: content ``Error: <message>``."""
    return ToolExecutionResult.failure(error_message(error), info=_error_info(error))


@dataclass(frozen=True, slots=True)
class Prepared:
    """Outcome of :meth:`ToolRuntime.prepare`: what the scheduler does next.

    ``dispatch``: run :meth:`ToolRuntime.dispatch`. ``post-result``: the call
    ended before dispatch but still goes through post-execute
    (:meth:`ToolRuntime.finalize`). ``final-result``: the call ended and skips
    post-execute (:meth:`ToolRuntime.finish`). ``deferred`` (only for a
    ``deferrable`` input): its approval waits for a person (D19); the call has
    no result yet, the body has not started, and the caller leaves it pending.
    """

    kind: Literal["dispatch", "post-result", "final-result", "deferred"]
    exec: ToolExecution
    result: ToolExecutionResult | None = None


@dataclass(frozen=True, slots=True)
class Dispatched:
    """Outcome of :meth:`ToolRuntime.dispatch` (``post-result``, ``final-result`` or
    ``deferred``).

    ``deferred`` (only for a ``deferrable`` top-level call): the body raised
    :class:`~.errors.ToolCallWaits`, named in ``waits``; the call stays without a result and
    the caller leaves it pending (D36). ``result`` is then the error a non-deferrable call
    would have got, for nobody to commit.
    """

    kind: Literal["post-result", "final-result", "deferred"]
    result: ToolExecutionResult
    waits: ToolCallWaits | None = None


@dataclass(slots=True)
class _CallState:
    """Registry-private per-call state, kept off the wrapper-visible execution object."""

    caller_signal: CancelToken
    finalizer: ContentFinalizer | None
    body_invoked: bool = False
    body_started: bool = False  # tool.execute was awaited (arguments were valid)
    #: the call may be left without a result (a deferrable top-level call, D19/D36)
    deferrable: bool = False
    #: what the body raised when its call waits on another session (D36)
    waits: ToolCallWaits | None = None
    #: results this runtime normalized for this call (a wrapper's own result is re-validated)
    canonical: list[ToolExecutionResult] = dataclasses.field(default_factory=list)


def _content(value: object, what: str) -> tuple[ContentBlock, ...]:
    """Validate content blocks (typed blocks or their JSON mappings) into a frozen tuple."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a list of content blocks, got {type(value).__name__}")
    blocks: list[ContentBlock] = []
    for index, block in enumerate(value):
        if isinstance(block, Mapping):
            try:
                block = msgspec.convert(dict(block), KnownContentBlock, dec_hook=json_dec_hook)
            except msgspec.ValidationError as exc:
                raise TypeError(f"{what}[{index}] is not a content block: {exc}") from None
        if not isinstance(block, _BLOCK_TYPES):
            raise TypeError(f"{what}[{index}] is not a content block: {block!r}")
        blocks.append(block)
    check_json(blocks, what)
    return tuple(blocks)


def _contexts(value: object, what: str) -> tuple[UserMessage, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a list of user messages")
    for index, message in enumerate(value):
        if not isinstance(message, UserMessage):
            raise TypeError(f"{what}[{index}] must be a UserMessage, got {message!r}")
    return tuple(value)


def _pre_decision(value: object) -> PreToolDecision:
    """Accept the typed decisions and their ``{"kind": ...}`` mappings."""
    if isinstance(value, Allow | Deny | Ask):
        return value
    if isinstance(value, Mapping):
        kind = value.get("kind")
        if kind == "allow":
            return Allow()
        if kind == "deny" and isinstance(value.get("reason"), str):
            return Deny(value["reason"])
        if kind == "ask":
            reason = value.get("reason")
            if reason is None or isinstance(reason, str):
                return Ask(reason)
    raise TypeError(
        f"tools/pre-execute must resolve to Allow(), Deny(reason) or Ask(reason?), got {value!r}"
    )


def _post_decision(value: object) -> PostToolDecision:
    if isinstance(value, Accept | Block):
        return value
    if isinstance(value, Mapping):
        kind = value.get("kind")
        contexts = value.get("additionalContexts", value.get("additional_contexts", ()))
        if kind == "block" and "feedback" in value:
            return Block(value["feedback"], contexts)
        if kind == "accept":
            if "content" in value and "value" in value:
                raise TypeError(
                    "tools/post-execute accept decision cannot replace both value and content"
                )
            return Accept(
                content=value.get("content"),
                value=value["value"] if "value" in value else UNSET,
                additional_contexts=contexts,
            )
    raise TypeError(
        f"tools/post-execute must resolve to Accept(...) or Block(feedback), got {value!r}"
    )


def _blocked_message(feedback: Sequence[ContentBlock]) -> str:
    text = "\n".join(
        block.text if isinstance(block, TextBlock) else f"[{block_type(block)} content]"
        for block in feedback
    )
    return text if text else "tool result blocked by post-execute policy"


class ToolRuntime:
    """The ``tools`` service: a registry of tools and guards plus the call pipeline.

    Registrations return a disposer; pass ``owner=ctx`` to tie them to the
    calling plugin's lifetime (they are undone when that plugin unloads).
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._tools: dict[str, ToolDefinition] = {}
        #: the model-facing schemas, frozen once per registration (docs/decisions.md D38);
        #: None after a register or unregister, rebuilt by the next :meth:`schemas`
        self._frozen: dict[str, ToolSchema] = {}
        self._schemas: tuple[ToolSchema, ...] | None = None
        self._guards: list[ToolGuard] = []
        self._states: weakref.WeakKeyDictionary[ToolExecution, _CallState] = (
            weakref.WeakKeyDictionary()
        )

    # ------------------------------------------------------------------ registry
    def register(
        self, definition: ToolDefinition, *, owner: Context | None = None
    ) -> Callable[[], None]:
        """Register ``definition``; returns the disposer that unregisters it.

        Raises :class:`ToolRegistrationError` (or :class:`UnsupportedSchemaError`)
        for a malformed definition, a reserved name or a duplicate.
        """
        schema = self._check_definition(definition)
        name = definition.name
        if name in self._tools:
            raise ToolRegistrationError(
                f'tool "{name}" is already registered; unregister the existing tool first or '
                "choose another name"
            )
        self._tools[name] = definition
        self._frozen[name] = schema
        self._schemas = None
        self._ctx.emit(TOOLS_CHANGE)

        def unregister() -> None:
            if self._tools.get(name) is definition:
                del self._tools[name]
                del self._frozen[name]
                self._schemas = None
                self._ctx.emit(TOOLS_CHANGE)

        if owner is not None:
            owner.effect(unregister, f"tool {name}")
        return unregister

    @staticmethod
    def _check_definition(definition: ToolDefinition) -> ToolSchema:
        """Check ``definition``; its model-facing schema (frozen) when it is well formed."""
        if not isinstance(definition, ToolDefinition):
            raise ToolRegistrationError(
                f"tools.register() takes a ToolDefinition, got {type(definition).__name__}"
            )
        name = definition.name
        if not isinstance(name, str) or not name:
            raise ToolRegistrationError("a tool name must be a non-empty string")
        if name in RESERVED_TOOL_NAMES:
            raise ToolRegistrationError(f'tool name "{name}" is reserved')
        if not isinstance(definition.description, str):
            raise ToolRegistrationError(f'tool "{name}" description must be a string')
        output = definition.output
        if (
            not isinstance(output, ToolOutput)
            or not callable(output.render)
            or not (output.presentation_meta is None or callable(output.presentation_meta))
        ):
            raise ToolRegistrationError(
                f'tool "{name}" must declare output {{ schema, render, presentationMeta? }}'
            )
        timeout = definition.timeout_ms
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ToolRegistrationError(f'tool "{name}" timeoutMs must be a positive finite number')
        if not callable(definition.execute):
            raise ToolRegistrationError(f'tool "{name}" execute must be an async callable')
        if definition.reconcile is not None and not callable(definition.reconcile):
            raise ToolRegistrationError(f'tool "{name}" reconcile must be an async callable')
        check_object_schema(definition.parameters, f'tool "{name}" parameters')
        check_schema(output.schema, f'tool "{name}" output.schema')
        try:
            return definition.schema()
        except NonJsonValueError as exc:
            raise ToolRegistrationError(str(exc)) from None

    def get(self, name: str) -> ToolDefinition | None:
        """The registered tool of that name, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Registered tool names, sorted."""
        return sorted(self._tools)

    def schemas(self) -> tuple[ToolSchema, ...]:
        """The model-facing schemas (name, description, parameters), sorted by name.

        Sorted rather than in registration order so the request header, and
        with it the provider's prompt cache, does not depend on plugin load order.
        Each schema is the deep frozen copy taken when its tool was registered (what
        registration checked), and the tuple is the same object until a tool is
        registered or unregistered (docs/decisions.md D38): a step whose tools did not
        change neither copies them nor re-encodes them to compare request headers.
        """
        schemas = self._schemas
        if schemas is None:
            frozen = self._frozen
            schemas = self._schemas = tuple(frozen[name] for name in sorted(frozen))
        return schemas

    def guard(self, guard: ToolGuard, *, owner: Context | None = None) -> Callable[[], None]:
        """Add a monotonic guard: ``guard(exec) -> reason | None`` runs after ``allow``."""
        if not callable(guard):
            raise ToolRegistrationError("a tool guard must be a callable")
        self._guards.append(guard)

        def remove() -> None:
            try:
                self._guards.remove(guard)
            except ValueError:
                pass

        if owner is not None:
            owner.effect(remove, "tool guard")
        return remove

    def execution_mode(self, call: ToolExecutionInput) -> ExecutionMode:
        """``parallel`` only when the tool's ``is_concurrency_safe(args)`` returns exactly True.

        Unknown tools, invalid arguments, an undeclared classifier, a raising
        one, or any other answer are ``exclusive``.
        """
        tool = self._tools.get(call.name)
        if tool is None or tool.is_concurrency_safe is None:
            return "exclusive"
        try:
            if validate(tool.parameters, call.arguments):
                return "exclusive"
            return "parallel" if tool.is_concurrency_safe(call.arguments) is True else "exclusive"
        except Exception:
            return "exclusive"

    # ------------------------------------------------------------------ pipeline
    async def execute(self, call: ToolExecutionInput) -> ToolExecutionResult:
        """Run the whole pipeline for one call; never raises for a failed call.

        Composite tools dispatch nested calls through here with
        ``parent=exec.token`` (and ``root_call_id=exec.root_call_id``).
        """
        if call.deferrable:  # a whole-pipeline run cannot leave a call waiting
            call = dataclasses.replace(call, deferrable=False)
        prepared = await self.prepare(call)
        if prepared.kind == "final-result":
            assert prepared.result is not None
            return self.finish(prepared.exec, prepared.result)
        if prepared.kind == "post-result":
            assert prepared.result is not None
            return await self.finalize(prepared.exec, prepared.result)
        dispatched = await self.dispatch(prepared.exec)
        if dispatched.kind == "final-result":
            return self.finish(prepared.exec, dispatched.result)
        return await self.finalize(prepared.exec, dispatched.result)

    def _create(self, call: ToolExecutionInput) -> tuple[ToolExecution, ToolExecutionResult | None]:
        tool = self._tools.get(call.name)
        finalizer = tool.finalize_content if tool is not None else None
        try:
            arguments = freeze_json(call.arguments, "tool execution arguments")
            failure = None
        except NonJsonValueError:
            arguments = None
            failure = ToolExecutionResult.failure(_ARGS_NOT_JSON)
        # The live-output channel only when someone watches (a terminal's transcript): a body
        # then need not decode its output twice for nobody.
        watched = bool(self._ctx.host.bus.listeners(TOOLS_PROGRESS))
        execution = ToolExecution(call, arguments, self._report_progress if watched else None)
        self._states[execution] = _CallState(
            call.signal, finalizer, deferrable=call.deferrable and call.parent is None
        )
        return execution, failure

    def _report_progress(self, progress: ToolProgress) -> None:
        self._ctx.emit(TOOLS_PROGRESS, progress)

    async def prepare(self, call: ToolExecutionInput) -> Prepared:
        """Stages 1-6: snapshot, pre-abort, pre-execute, approval, guards, abort re-check."""
        execution, failure = self._create(call)
        if failure is not None:
            return Prepared("final-result", execution, failure)
        if self._state(execution).caller_signal.aborted:
            return Prepared("final-result", execution, aborted_before_dispatch_result())
        try:
            proposed = await self._ctx.waterfall(TOOLS_PRE_EXECUTE, execution, _allow)
            gate = _pre_decision(proposed)  # listeners are plugin code: checked at run time
            approval_cancelled = False
            decision: PreToolDecision = gate
            recorded = call.approval_decision
            changed = self._context_change(execution, gate, recorded)
            if changed is not None:
                # Allowed in another context (sandbox, network, tool, composition): that
                # decision does not hold here. The one place every continuation crosses (CLI,
                # chat, Agent.continue_turn, serve): the call is deferred again, never asked
                # inline and never run (D22 in docs/decisions.md).
                gate = Ask(f"the context changed since this call was allowed ({changed}); "
                           "decide it again")
                recorded = None
            if recorded is not None and not isinstance(gate, Deny):
                # A decision recorded for a deferred call: a denying rule wins (above), the
                # user's "no" wins over a rule that now allows, the policy is re-checked.
                decision = self._apply_recorded(execution, gate, recorded)
            elif isinstance(gate, Ask) and changed is not None and not (
                call.deferrable and execution.parent is None
            ):
                decision = Deny(f'tool "{execution.name}": {gate.reason}; it cannot wait for a '
                                "decision here, so it did not run")
            elif isinstance(gate, Ask):
                asked = await self._ask(
                    execution, gate, deferrable=call.deferrable, reask=changed is not None
                )
                if asked is None:
                    return Prepared("deferred", execution)
                decision, approval_cancelled = asked
            if approval_cancelled and self._caller_cancelled(execution):
                return Prepared("post-result", execution, aborted_before_dispatch_result())
            reason = self._guard_reason(execution) if isinstance(decision, Allow) else None
            if isinstance(decision, Deny):
                reason = decision.reason
            if reason is not None:
                return Prepared("post-result", execution, ToolExecutionResult.failure(reason))
            if self._caller_cancelled(execution):
                return Prepared("post-result", execution, aborted_before_dispatch_result())
            return Prepared("dispatch", execution)
        except Exception as exc:
            return Prepared("final-result", execution, error_result(exc))

    def _context_change(
        self, execution: ToolExecution, gate: PreToolDecision, recorded: str | None
    ) -> str | None:
        """What changed since a recorded "allowed-once" was asked (None: nothing, or nothing to
        check: no recorded allow, a call that needs no approval now, no approval service)."""
        if recorded != "allowed-once" or not isinstance(gate, Ask) or execution.agent is None:
            return None
        approval = self._ctx.get(APPROVAL)
        check = getattr(approval, "recorded_decision_change", None)
        if not callable(check):
            return None
        change = check(execution.agent.session, execution.call_id, execution.name)
        return change if isinstance(change, str) else None

    def _apply_recorded(
        self, execution: ToolExecution, gate: PreToolDecision, recorded: str
    ) -> PreToolDecision:
        """The decision a deferred call gets now: the recorded one, re-checked (D19)."""
        name = execution.name
        if recorded != "allowed-once":
            return Deny(f'the user rejected tool "{name}"')
        if isinstance(gate, Ask):
            approval = self._ctx.get(APPROVAL)
            if approval is None:
                return Deny(
                    f'tool "{name}" requires approval, but no approval channel is available'
                )
            agent = execution.agent
            if agent is None or approval.effective_policy(agent.session) == "never":
                return Deny(f'the user rejected tool "{name}"')
        return Allow()

    async def _ask(
        self, execution: ToolExecution, ask: Ask, *, deferrable: bool = False, reask: bool = False
    ) -> tuple[PreToolDecision, bool] | None:
        """Resolve ``ask`` through the approval seam; fail closed without one.

        None: the service deferred the decision (only when ``deferrable``).
        """
        name = execution.name
        approval = self._ctx.get(APPROVAL)
        if approval is None:
            return Deny(ask.reason or f'tool "{name}" requires approval (not yet supported)'), False
        subject = ApprovalSubject(
            rejected=f'tool "{name}"', asked_for=f'tool "{name}"', requiring=f'tool "{name}"'
        )
        if execution.agent is None:
            return Deny(no_agent_refusal(subject)), False
        outcome = await approval.request(
            ApprovalRequest(
                agent=execution.agent,
                tool_name=name,
                call_id=execution.call_id,
                reason=ask.reason,
                signal=execution.signal,
                # a reconciler's ask is not a gate before the body (that may have run): crash
                # repair must not read it as one (D26)
                stage=None if execution.reconciling else "pre-execute",
                deferrable=deferrable and execution.parent is None,
                reask=reask,
            )
        )
        if outcome == "deferred" and deferrable and execution.parent is None:
            return None
        if reask and outcome == "allowed-once":
            # An approval service that asked anyway (a decision made inline, without the log's
            # deferral): not the re-decision D22 asks for; fail closed.
            return Deny(approval_refusal("unavailable", subject)), False
        if outcome == "allowed-once":
            return Allow(), False
        return Deny(approval_refusal(outcome, subject)), outcome == "cancelled"

    def _guard_reason(self, execution: ToolExecution) -> str | None:
        for guard in list(self._guards):
            reason = guard(execution)
            if reason is not None:
                if not isinstance(reason, str):
                    raise TypeError(f"a tool guard returned {reason!r}; guards return str | None")
                return reason
        return None

    async def dispatch(self, execution: ToolExecution) -> Dispatched:
        """Stage 7: the ``tools/execute`` around-chain and the body."""
        state = self._state(execution)
        object.__setattr__(execution, "_dispatching", True)
        try:
            result = await self._ctx.waterfall(
                TOOLS_EXECUTE, execution, lambda: self._run_body(execution)
            )
            normalized = self._normalize_dispatch_result(execution, result)
            deferred = tuple(execution._deferred)
            if deferred:
                normalized = self._canonical(
                    execution,
                    dataclasses.replace(
                        normalized, additional_contexts=deferred + normalized.additional_contexts
                    ),
                )
            if state.caller_signal.aborted and (
                not normalized.is_error or (state.body_started and is_abort(normalized))
            ):
                normalized = self._cancellation_result(state, normalized)
            elif state.waits is not None and state.deferrable and normalized.is_error:
                return Dispatched("deferred", normalized, state.waits)  # no result (D36)
            return Dispatched("post-result", normalized)
        except Exception as exc:
            return Dispatched("final-result", error_result(exc))
        finally:
            object.__setattr__(execution, "_dispatching", False)
            object.__setattr__(execution, "_signal", state.caller_signal)

    async def _run_body(self, execution: ToolExecution) -> ToolExecutionResult:
        """The innermost ``tools/execute`` step: fuse tokens, validate, await the body."""
        state = self._state(execution)
        wrapper_signal = execution.signal
        fused, dispose = fuse(state.caller_signal, wrapper_signal)
        if fused.aborted:
            dispose()
            return aborted_before_dispatch_result()
        object.__setattr__(execution, "_signal", fused)
        try:
            tool = self._tools.get(execution.name)
            if tool is None:
                raise ToolNotFoundError(execution.name)
            state.body_invoked = True
            violations = validate(tool.parameters, execution.arguments)
            if violations:
                raise ToolArgsError(violations)
            state.body_started = True
            if execution.reconciling:
                result = await self._reconcile(execution, tool)
            else:
                returned = await tool.execute(execution.arguments, execution)
                result = self._success(execution, tool, returned)
            return stopped_result(result) if fused.aborted else result
        except Exception as exc:
            if isinstance(exc, ToolCallWaits):
                state.waits = exc
            return error_result(exc)
        finally:
            dispose()
            object.__setattr__(execution, "_signal", wrapper_signal)

    async def _reconcile(
        self, execution: ToolExecution, tool: ToolDefinition
    ) -> ToolExecutionResult:
        """The reconciler in the body's place (D26): ``Done`` is a success whose value meets
        the tool's output contract; ``NotDone`` / ``Unknown`` are failures with their codes."""
        if tool.reconcile is None:
            raise ToolRegistrationError(f'tool "{tool.name}" declares no reconcile')
        verdict = await tool.reconcile(execution.arguments, execution)
        if isinstance(verdict, Done):
            return self._success(execution, tool, verdict.value)
        if isinstance(verdict, NotDone):
            return ToolExecutionResult.failure(
                "the reconciler found the call did not take effect",
                info=ToolErrorInfo("ReconciledNotDone", RECONCILED_NOT_DONE),
            )
        if isinstance(verdict, Unknown):
            return ToolExecutionResult.failure(
                verdict.reason or "the reconciler could not tell whether the call took effect",
                info=ToolErrorInfo("ReconciledUnknown", RECONCILED_UNKNOWN),
            )
        raise TypeError(
            f'tool "{tool.name}" reconcile returned {verdict!r}; return Done(value), NotDone() '
            "or Unknown(reason)"
        )

    def _success(
        self, execution: ToolExecution, tool: ToolDefinition, candidate: object
    ) -> ToolExecutionResult:
        """Snapshot, validate, render and (top-level only) project a body value."""
        name = tool.name
        try:
            value = freeze_json(candidate, f'tool "{name}" value')
        except NonJsonValueError:
            raise ToolOutputError(name, ["value is not lossless JSON"]) from None
        violations = validate(tool.output.schema, value, "value")
        if violations:
            raise ToolOutputError(name, violations)
        try:
            rendered = tool.output.render(execution.arguments, value)
        except Exception as exc:
            raise ToolOutputError(name, [f"output.render failed: {error_message(exc)}"]) from exc
        try:
            content = _content(rendered, f'tool "{name}" output.render result')
        except (TypeError, NonJsonValueError) as exc:
            raise ToolOutputError(name, [f"output.render returned {error_message(exc)}"]) from None
        meta: Any = UNSET
        if execution.parent is None and tool.output.presentation_meta is not None:
            try:
                projected = tool.output.presentation_meta(execution.arguments, value)
            except Exception as exc:
                raise ToolOutputError(
                    name, [f"output.presentationMeta failed: {error_message(exc)}"]
                ) from exc
            try:
                meta = freeze_json(projected, f'tool "{name}" presentation meta')
            except NonJsonValueError:
                raise ToolOutputError(
                    name, ["output.presentationMeta returned non-lossless JSON"]
                ) from None
        return self._canonical(
            execution,
            ToolExecutionResult(
                is_error=False,
                value=value,
                content=content,
                meta=meta,
                concludes_turn=execution._concluded,
            ),
        )

    def _normalize_dispatch_result(
        self, execution: ToolExecution, result: object
    ) -> ToolExecutionResult:
        """Accept the runtime's own result as is; re-validate a wrapper-authored one."""
        if not isinstance(result, ToolExecutionResult):
            raise TypeError(
                f"a tools/execute listener returned {result!r}; it must return a "
                "ToolExecutionResult (usually the value of `await next()`)"
            )
        state = self._state(execution)
        if any(known is result for known in state.canonical):
            return result
        if result.is_error:
            return self._canonical(
                execution,
                dataclasses.replace(result, content=_content(result.content, "result content")),
            )
        tool = self._tools.get(execution.name)
        if tool is None:
            raise ToolNotFoundError(execution.name)
        normalized = self._success(execution, tool, result.value)
        return self._canonical(
            execution,
            dataclasses.replace(normalized, additional_contexts=result.additional_contexts),
        )

    async def finalize(
        self, execution: ToolExecution, result: ToolExecutionResult
    ) -> ToolExecutionResult:
        """Stages 8-9: ``tools/post-execute``, then :meth:`finish`."""
        state = self._state(execution)
        try:
            post = await self._post_execute(execution, result)
            if state.caller_signal.aborted and not post.is_error:
                post = self._cancellation_result(state, post)
            return self.finish(execution, post)
        except Exception as exc:
            return self.finish(execution, error_result(exc))

    async def _post_execute(
        self, execution: ToolExecution, result: ToolExecutionResult
    ) -> ToolExecutionResult:
        proposed = await self._ctx.waterfall(
            TOOLS_POST_EXECUTE, PostExecuteContext(execution, result), _accept
        )
        decision = _post_decision(proposed)  # listeners are plugin code: checked at run time
        decision_contexts = _contexts(decision.additional_contexts, "decision additional_contexts")
        if isinstance(decision, Block):
            feedback = _content(decision.feedback, "block feedback")
            return self._canonical(
                execution,
                ToolExecutionResult.failure(
                    _blocked_message(feedback),
                    content=feedback,
                    additional_contexts=decision_contexts,
                ),
            )
        if decision.content is not None and decision.value is not UNSET:
            raise TypeError(
                "tools/post-execute accept decision cannot replace both value and content"
            )
        contexts = result.additional_contexts + decision_contexts
        if decision.value is not UNSET:
            if result.is_error:
                raise TypeError("tools/post-execute cannot replace the value of a failed result")
            tool = self._tools.get(execution.name)
            if tool is None:
                raise ToolNotFoundError(execution.name)
            replaced = self._success(execution, tool, decision.value)
            return self._canonical(
                execution, dataclasses.replace(replaced, additional_contexts=contexts)
            )
        updated = result
        if decision.content is not None:
            updated = dataclasses.replace(
                updated, content=_content(decision.content, "post-execute content")
            )
        if decision_contexts:
            updated = dataclasses.replace(updated, additional_contexts=contexts)
        return self._canonical(execution, updated)

    def finish(self, execution: ToolExecution, result: ToolExecutionResult) -> ToolExecutionResult:
        """Stage 9 alone: materialize, ``finalize_content`` once, freeze, emit ``tools/result``."""
        state = self._states.get(execution)
        try:
            final = self._materialize(result)
        except Exception as exc:
            final = self._materialize(error_result(exc))
        finalizer = state.finalizer if state is not None else None
        if state is not None:
            state.finalizer = None  # exactly once, even if finish were called again
        if finalizer is not None:
            try:
                replacement = finalizer(execution, final)
                if replacement is not None:
                    final = self._materialize(
                        dataclasses.replace(
                            final, content=_content(replacement, "finalize_content result")
                        )
                    )
            except Exception as exc:
                final = self._materialize(error_result(exc))
        object.__setattr__(execution, "_frozen", True)
        self._ctx.emit(TOOLS_RESULT, ToolResultEvent(execution, final))
        return final

    @staticmethod
    def _materialize(result: ToolExecutionResult) -> ToolExecutionResult:
        """Check the durable projection is lossless JSON and freeze ``meta``."""
        content = _content(result.content, "tool result content")
        meta = result.meta
        if meta is not UNSET:
            meta = freeze_json(meta, "tool result meta")
        contexts = _contexts(result.additional_contexts, "tool result additional_contexts")
        if result.error is not None and not isinstance(result.error.message, str):
            raise TypeError("tool result error message must be a string")
        return dataclasses.replace(result, content=content, meta=meta, additional_contexts=contexts)

    # ------------------------------------------------------------------ helpers
    def _state(self, execution: ToolExecution) -> _CallState:
        state = self._states.get(execution)
        if state is None:
            raise RuntimeError(
                "tools runtime invariant violated: this ToolExecution was not created by "
                "ToolRuntime.prepare()"
            )
        return state

    def body_started(self, execution: ToolExecution) -> bool:
        """True once the tool's body was invoked for this call (it may have had effects).

        A ``tools/execute`` wrapper that ends a call early reads it to tell the
        model whether the call may have partly run.
        """
        return self._state(execution).body_started

    def _caller_cancelled(self, execution: ToolExecution) -> bool:
        return self._state(execution).caller_signal.aborted

    def _canonical(
        self, execution: ToolExecution, result: ToolExecutionResult
    ) -> ToolExecutionResult:
        self._state(execution).canonical.append(result)
        return result

    @staticmethod
    def _cancellation_result(state: _CallState, prior: ToolExecutionResult) -> ToolExecutionResult:
        if state.body_started:
            if prior.error is not None and prior.error.info is not None and (
                prior.error.info.code == TOOL_OUTCOME_UNKNOWN
            ):
                return prior  # already says so (the body's own stop, or a wrapper's)
            return stopped_result(prior)
        if state.body_invoked:
            return aborted_result(prior)
        return aborted_before_dispatch_result(prior)


async def _allow() -> PreToolDecision:
    return Allow()


async def _accept() -> PostToolDecision:
    return Accept()
