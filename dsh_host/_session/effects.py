"""The effects ledger of an abandoned branch: what the world may already have seen.

A fork continues a session from an earlier point; the events after that point stay in the
parent but leave the child's history, and with them the memory that some calls already acted on
the world. :func:`effects_after` reads that branch back out of the parent's log: every call the
model requested after the boundary, with what the log proves about it and the idempotency key
the call's body was given, so a new timeline can tell an external system "this was already
done" instead of repeating the effect or forgetting it.

Status per call, from the same evidence crash repair uses:

* ``done``: a ``tool/result`` that is not a repair closer answers it (the body ran to an
  outcome; ``isError`` says whether that outcome was a failure or a refusal);
* ``unknown``: a durable ``tool/call`` and no honest answer (no result, or repair's
  ``TOOL_OUTCOME_UNKNOWN``): it may have run;
* ``not-started``: no durable ``tool/call`` (or repair's ``TOOL_NOT_STARTED``): it never ran.

A reconciler's verdict (a ``tool/reconciled`` event, D26 in docs/decisions.md) settles an
``unknown`` call: ``done`` makes it ``done``, ``not-done`` makes it ``not-started``; the
effect's ``reconciled`` names the verdict.

The log does not say which tools are read-only (a tool declares it, ``ToolDefinition.read_only``,
in the process that runs it), so every call is listed; a reader that knows its tools filters by
``tool`` (the agent's ledger gate does, D27 in docs/decisions.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from dsh_host._session.events import event_to_builtins
from dsh_host._session.repair import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN

__all__ = ["Effect", "EffectStatus", "effects_after", "idempotency_key"]

EffectStatus = Literal["done", "unknown", "not-started"]

_REPAIR_STATUS: Final[dict[str, EffectStatus]] = {
    TOOL_OUTCOME_UNKNOWN: "unknown",
    TOOL_NOT_STARTED: "not-started",
}


def idempotency_key(session_id: str, call_id: str) -> str:
    """A call's idempotency key: ``dsh-`` and 32 hex digits of SHA-256 over the session id
    and the call id (length-prefixed, so no two pairs collide by concatenation).

    The one definition: the key a tool body receives (``ToolExecution.idempotency_key``) and
    the key an effects ledger names are this function, so they cannot drift apart. An empty
    ``session_id`` keys a call outside any session on its call id alone.
    """
    digest = hashlib.sha256(f"{len(session_id)}:{session_id}:{call_id}".encode())
    return "dsh-" + digest.hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Effect:
    """One call of the abandoned branch."""

    call_id: str
    tool: str
    arguments: str  #: the raw argument string the model sent
    status: EffectStatus
    idempotency_key: str
    requested_seq: int  #: the ``assistant/message`` that asked for it
    call_seq: int | None  #: its durable ``tool/call`` (None: never recorded as started)
    result_seq: int | None  #: its ``tool/result`` (None: no result)
    is_error: bool | None  #: the result's ``isError`` (None: no result)
    reconciled: str | None = None  #: a reconciler's verdict on an unknown call (D26)

    def to_json(self) -> dict[str, Any]:
        return {
            "callId": self.call_id, "tool": self.tool, "arguments": self.arguments,
            "status": self.status, "idempotencyKey": self.idempotency_key,
            "requestedSeq": self.requested_seq, "callSeq": self.call_seq,
            "resultSeq": self.result_seq, "isError": self.is_error,
            "reconciled": self.reconciled,
        }  # fmt: skip


def effects_after(session_id: str, events: Sequence[Any], boundary: int) -> list[Effect]:
    """Every call requested after seq ``boundary`` in ``events`` (a log of ``session_id``),
    in the order the model asked for them, with its status and idempotency key.

    ``events`` are :class:`~dsh_host._session.events.SessionEvent` or their JSON form. Pure.
    """
    order: list[str] = []
    asked: dict[str, tuple[str, str, int]] = {}
    calls: dict[str, int] = {}
    results: dict[str, tuple[int, bool, str | None]] = {}
    verdicts: dict[str, str] = {}
    for raw in events:
        event = raw if isinstance(raw, Mapping) else event_to_builtins(raw)
        seq, kind, data = event.get("seq"), event.get("type"), event.get("data")
        if not isinstance(seq, int) or seq <= boundary or not isinstance(data, Mapping):
            continue
        if kind == "assistant/message":
            message = data.get("message")
            for block in message.get("content", ()) if isinstance(message, Mapping) else ():
                if isinstance(block, Mapping) and block.get("type") == "tool-call":
                    call_id = block.get("id")
                    if isinstance(call_id, str) and call_id not in asked:
                        order.append(call_id)
                        asked[call_id] = (
                            str(block.get("name")),
                            str(block.get("arguments", "")),
                            seq,
                        )
        elif kind == "tool/reconciled" and isinstance(data.get("callId"), str):
            verdict = data.get("verdict")
            if isinstance(verdict, str):
                verdicts[data["callId"]] = verdict
        elif kind == "tool/call" and isinstance(data.get("callId"), str):
            calls.setdefault(data["callId"], seq)
        elif kind == "tool/result":
            message = data.get("message")
            source = message.get("source") if isinstance(message, Mapping) else None
            call_id = source.get("callId") if isinstance(source, Mapping) else None
            if isinstance(call_id, str):
                content = message.get("content", ()) if isinstance(message, Mapping) else ()
                is_error = any(isinstance(b, Mapping) and b.get("isError") is True for b in content)
                error = data.get("error")
                code = error.get("code") if isinstance(error, Mapping) else None
                results[call_id] = (seq, is_error, code if isinstance(code, str) else None)
    ledger: list[Effect] = []
    for call_id in order:
        tool, arguments, requested = asked[call_id]
        call_seq = calls.get(call_id)
        result = results.get(call_id)
        status: EffectStatus
        if result is not None and result[2] in _REPAIR_STATUS:
            status = _REPAIR_STATUS[result[2]]
        elif result is not None:
            status = "done"
        else:
            status = "unknown" if call_seq is not None else "not-started"
        verdict = verdicts.get(call_id)
        if status == "unknown" and verdict == "done":
            status = "done"
        elif status == "unknown" and verdict == "not-done":
            status = "not-started"
        ledger.append(Effect(
            call_id=call_id, tool=tool, arguments=arguments, status=status,
            idempotency_key=idempotency_key(session_id, call_id), requested_seq=requested,
            call_seq=call_seq, result_seq=result[0] if result else None,
            is_error=result[1] if result else None, reconciled=verdict,
        ))  # fmt: skip
    return ledger
