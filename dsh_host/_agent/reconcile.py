"""Reconciling calls a crash left outcome-unknown (D26 in docs/decisions.md).

Crash repair can only say what the log proves: a call with a durable ``tool/call`` and no
result *may* have run. A tool that can find out declares ``reconcile``. On resume, while the
interrupted turn is still open (before its closers), each call repair would close
``TOOL_OUTCOME_UNKNOWN`` whose tool has a reconciler is reconciled through the tools pipeline --
the same ``tools/pre-execute`` rules, approval, guards and ``tools/execute`` wrappers (sandbox,
checkpoint, timeout) as its body, with the call's own id and therefore its idempotency key; an
approval it needs is asked inside that turn (the audit pair is turn-enclosed), without the
``pre-execute`` stage (it gates no body, so repair does not read it as one). Every verdict is a
``tool/reconciled`` event (beyond DSH, written ``ignorable: true``: DSH keeps it without reading
it) ``{callId, tool, verdict, idempotencyKey, callSeq, detail?}``, followed by the call's result:

* ``done``: a successful ``tool/result`` whose content is :data:`RECONCILED_DONE_TEXT` and the
  result the reconciler found (rendered by the tool's output contract);
* ``not-done``: a ``tool/result`` with ``TOOL_NOT_STARTED`` (the model may retry) and
  :data:`RECONCILED_NOT_DONE_TEXT`;
* ``unknown`` (the reconciler said so, failed, or was refused): no result here; repair then
  closes the call ``TOOL_OUTCOME_UNKNOWN`` as always.

Nothing here ever re-runs a tool body. A crash during reconciliation leaves the turn open; the
next resume reconciles what is still unanswered (a reconciler only looks).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from dsh_host._cancel import CancelToken
from dsh_host._session.effects import idempotency_key
from dsh_host._session.events import SessionEvent, ToolCallData
from dsh_host._session.messages import TextBlock
from dsh_host._session.repair import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from dsh_host._tools import (
    RECONCILED_NOT_DONE,
    ToolErrorInfo,
    ToolExecutionInput,
    ToolExecutionResult,
    error_message,
)
from dsh_host._tools.keys import TOOLS

from .scheduler import append_tool_result

if TYPE_CHECKING:
    from dsh_host._context import Context

    from .loop import Agent

__all__ = [
    "RECONCILED_DONE_TEXT",
    "RECONCILED_EVENT",
    "RECONCILED_NOT_DONE_TEXT",
    "Reconcilable",
    "Reconciliation",
    "reconcilable_calls",
    "reconcile_calls",
]

_log = logging.getLogger("dsh.agent")

#: The extension event that records a reconciler's verdict (``ignorable: true``).
RECONCILED_EVENT: Final = "tool/reconciled"
#: What the model reads, before the found result, for a call found done.
RECONCILED_DONE_TEXT: Final = (
    "Reconciled after the interruption: the tool's reconciler found that this call did take "
    "effect, so it must not be repeated. Its result:"
)
#: What the model reads for a call found not done.
RECONCILED_NOT_DONE_TEXT: Final = (
    "Reconciled after the interruption: the tool's reconciler found that this call did not take "
    "effect. Retry it if it is still needed."
)

Verdict = Literal["done", "not-done", "unknown"]


@dataclass(frozen=True, slots=True)
class Reconcilable:
    """A call repair would close outcome-unknown, of a tool that declares ``reconcile``."""

    call_id: str
    tool: str
    arguments: str  #: the raw argument string of its ``tool/call``
    call_seq: int
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """One reconciled call: the verdict and the events that record it."""

    call_id: str
    tool: str
    verdict: Verdict
    detail: str | None  #: why ``unknown`` (the reconciler's reason, a refusal, an error)
    event_seq: int  #: the ``tool/reconciled`` event
    result_seq: int | None  #: the call's ``tool/result`` written here (None for ``unknown``)


def reconcilable_calls(
    ctx: Context, events: Sequence[SessionEvent], closers: Sequence[SessionEvent]
) -> list[Reconcilable]:
    """The outcome-unknown closers among ``closers`` (computed for ``events``) whose tool is
    registered here with a reconciler, in order."""
    tools = ctx.get(TOOLS)
    if tools is None:
        return []
    out: list[Reconcilable] = []
    for closer in closers:
        error = getattr(closer.data, "error", None)
        cited = closer.source_event_seqs
        if getattr(error, "code", None) != TOOL_OUTCOME_UNKNOWN or not isinstance(cited, tuple):
            continue
        call = events[cited[0]] if cited else None
        data = call.data if call is not None else None
        if not isinstance(data, ToolCallData):
            continue
        definition = tools.get(data.name)
        if definition is None or definition.reconcile is None:
            continue
        out.append(Reconcilable(data.call_id, data.name, data.arguments, cited[0], data.turn,
                                data.step))  # fmt: skip
    return out


async def reconcile_calls(
    ctx: Context, agent: Agent, calls: Sequence[Reconcilable]
) -> list[Reconciliation]:
    """Reconcile ``calls`` in ``agent``'s session (its interrupted turn still open); append the
    verdicts and the results found. Nothing is flushed here (the resume flushes with the
    closers)."""
    session = agent.session
    done: list[Reconciliation] = []
    for call in calls:
        verdict, detail, result = await _ask(ctx, agent, call)
        record: dict[str, Any] = {
            "callId": call.call_id,
            "tool": call.tool,
            "verdict": verdict,
            "idempotencyKey": idempotency_key(session.id, call.call_id),
            "callSeq": call.call_seq,
        }
        if detail is not None:
            record["detail"] = detail
        marker = session.append(RECONCILED_EVENT, record, ignorable=True)
        result_seq: int | None = None
        if result is not None:
            append_tool_result(session, call.turn, call.step, call.call_id, result,
                               call.call_seq)  # fmt: skip
            result_seq = session.events[-1].seq
        done.append(Reconciliation(call.call_id, call.tool, verdict, detail, marker.seq,
                                   result_seq))  # fmt: skip
    return done


async def _ask(
    ctx: Context, agent: Agent, call: Reconcilable
) -> tuple[Verdict, str | None, ToolExecutionResult | None]:
    """Run the reconciler through the pipeline: ``(verdict, detail, result to record)``."""
    try:
        arguments = msgspec.json.decode(call.arguments) if call.arguments else {}
    except msgspec.DecodeError as exc:
        return "unknown", f"the recorded arguments are not JSON: {exc}", None
    try:
        found = await ctx.service(TOOLS).execute(
            ToolExecutionInput(
                call_id=call.call_id,
                name=call.tool,
                arguments=arguments,
                signal=CancelToken(),
                agent=agent,
                raw_arguments=call.arguments,
                reconcile=True,
            )
        )
    except Exception as exc:  # the pipeline turns failures into results; defensive
        _log.warning("reconciling call %s failed", call.call_id, exc_info=True)
        return "unknown", error_message(exc), None
    if not found.is_error:
        content = (TextBlock(text=RECONCILED_DONE_TEXT), *found.content)
        return "done", None, dataclasses.replace(found, content=content, additional_contexts=())
    info = found.error.info if found.error is not None else None
    if info is not None and info.code == RECONCILED_NOT_DONE:
        refused = ToolExecutionResult.failure(
            "the reconciler found the call did not take effect",
            info=ToolErrorInfo("ToolNotStartedError", TOOL_NOT_STARTED),
            content=(TextBlock(text=RECONCILED_NOT_DONE_TEXT),),
        )
        return "not-done", None, refused
    return "unknown", found.error.message if found.error is not None else "no verdict", None
