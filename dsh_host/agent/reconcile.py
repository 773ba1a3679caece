"""Reconciling calls a crash left ``TOOL_OUTCOME_UNKNOWN`` (D22 in docs/decisions.md).

Crash repair can only say what the log proves: a call with a durable ``tool/call`` and no
result *may* have run. A tool that can find out declares ``reconcile``; on resume, after the
closers are durable (D7 is unchanged: the honest "unknown" is recorded first), each such call
is reconciled through the tools pipeline -- the same ``tools/pre-execute`` rules, approval,
guards and ``tools/execute`` wrappers (sandbox, checkpoint, timeout) as its body, with the
call's own id and therefore its idempotency key. Every verdict is recorded:

* a ``tool/reconciled`` event (beyond DSH, written ``ignorable: true``: DSH keeps it without
  reading it) ``{callId, tool, verdict, idempotencyKey, closerSeq, detail?}``;
* for ``done`` and ``not-done``, a ``tool/result`` that replaces the closer on the surface
  (``surfaceOp: replace`` of exactly that node, citing it). DSH's rule for a tool-result
  rewrite lets only the content change, so the message id, ``isError`` and the
  ``TOOL_OUTCOME_UNKNOWN`` code stay what repair wrote; the text the model reads says what the
  reconciler found and, for ``done``, the recorded result. The human transcript keeps the
  closer (replacements are model-only).

``unknown`` (the reconciler said so, failed, was denied or was refused approval) changes
nothing the model reads: the call stays unknown. Nothing here ever re-runs a tool body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from dsh_host.cancel import CancelToken
from dsh_host.session.effects import idempotency_key
from dsh_host.session.events import SessionEvent, ToolCallData, event_to_builtins
from dsh_host.session.events.envelope import ReplaceOp
from dsh_host.session.repair import TOOL_OUTCOME_UNKNOWN
from dsh_host.tools import RECONCILED_NOT_DONE, ToolExecutionInput, error_message

if TYPE_CHECKING:
    from dsh_host.context import Context

    from .loop import Agent

__all__ = [
    "RECONCILED_DONE_TEXT",
    "RECONCILED_EVENT",
    "RECONCILED_NOT_DONE_TEXT",
    "Reconciliation",
    "reconcile_unknown_calls",
]

_log = logging.getLogger("dsh.agent")

#: The extension event that records a reconciler's verdict (``ignorable: true``).
RECONCILED_EVENT: Final = "tool/reconciled"
#: What the model reads, before the recorded result, for a call found done.
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
class Reconciliation:
    """One reconciled call: the verdict and the events that record it."""

    call_id: str
    tool: str
    verdict: Verdict
    detail: str | None  #: why ``unknown`` (the reconciler's reason, a denial, an error)
    event_seq: int  #: the ``tool/reconciled`` event
    result_seq: int | None  #: the replacing ``tool/result`` (None for ``unknown``)


async def reconcile_unknown_calls(
    ctx: Context, agent: Agent, closers: Sequence[SessionEvent]
) -> list[Reconciliation]:
    """Reconcile every ``TOOL_OUTCOME_UNKNOWN`` closer among ``closers`` (already appended to
    ``agent.session`` and durable) whose tool declares ``reconcile``; flush when any was.

    Calls of tools without a reconciler (or no longer registered) are left as they are.
    """
    tools = ctx.get("tools")
    session = agent.session
    if tools is None:
        return []
    events = session.events
    done: list[Reconciliation] = []
    for closer in closers:
        target = _unknown_call(events, closer)
        if target is None:
            continue
        call_id, name, raw = target
        definition = tools.get(name)
        if definition is None or definition.reconcile is None:
            continue
        verdict, detail, content = await _ask(tools, agent, call_id, name, raw)
        key = idempotency_key(session.id, call_id)
        record: dict[str, Any] = {
            "callId": call_id,
            "tool": name,
            "verdict": verdict,
            "idempotencyKey": key,
            "closerSeq": closer.seq,
        }
        if detail is not None:
            record["detail"] = detail
        marker = session.append(RECONCILED_EVENT, record, ignorable=True)
        result_seq: int | None = None
        if verdict != "unknown":
            data = event_to_builtins(closer)["data"]
            text = RECONCILED_DONE_TEXT if verdict == "done" else RECONCILED_NOT_DONE_TEXT
            blocks: list[Any] = [{"type": "text", "text": text}]
            if verdict == "done":
                blocks.extend(content)
            data["message"]["content"][0]["content"] = blocks
            replaced = session.append(
                "tool/result",
                data,
                surface_op=ReplaceOp(start=closer.seq, end=closer.seq),
                source_event_seqs=[closer.seq],
            )
            result_seq = replaced.seq
        done.append(Reconciliation(call_id, name, verdict, detail, marker.seq, result_seq))
    if done:
        await ctx.sessions.flush(session)
    return done


def _unknown_call(
    events: Sequence[SessionEvent], closer: SessionEvent
) -> tuple[str, str, str] | None:
    """``(call id, tool name, raw arguments)`` of an outcome-unknown closer, else None."""
    if closer.type != "tool/result":
        return None
    plain = event_to_builtins(closer)["data"]
    error = plain.get("error")
    if not isinstance(error, Mapping) or error.get("code") != TOOL_OUTCOME_UNKNOWN:
        return None
    cited = closer.source_event_seqs
    if not isinstance(cited, tuple) or not cited:
        return None
    call = events[cited[0]]
    if not isinstance(call.data, ToolCallData):
        return None
    return call.data.call_id, call.data.name, call.data.arguments


async def _ask(
    tools: Any, agent: Agent, call_id: str, name: str, raw: str
) -> tuple[Verdict, str | None, list[Any]]:
    """Run the reconciler through the pipeline; ``(verdict, detail, result content)``."""
    try:
        arguments = msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError as exc:
        return "unknown", f"the recorded arguments are not JSON: {exc}", []
    try:
        result = await tools.execute(
            ToolExecutionInput(
                call_id=call_id,
                name=name,
                arguments=arguments,
                signal=CancelToken(),
                agent=agent,
                raw_arguments=raw,
                reconcile=True,
            )
        )
    except Exception as exc:  # the pipeline turns failures into results; defensive
        _log.warning("reconciling call %s failed", call_id, exc_info=True)
        return "unknown", error_message(exc), []
    if not result.is_error:
        return "done", None, [msgspec.to_builtins(block) for block in result.content]
    info = result.error.info if result.error is not None else None
    if info is not None and info.code == RECONCILED_NOT_DONE:
        return "not-done", None, []
    message = result.error.message if result.error is not None else "no verdict"
    return "unknown", message, []
