"""Crash repair: the closers that balance a log whose last turn never ended.

A crash leaves a log that ends inside a turn. Storage never trims it (the turn
may hold much durable work) and never invents events; the *reader* computes
what is missing and whoever holds the write handle appends it (D7):

1. a ``tool/result`` for every call the model requested in the open turn that
   has no result — ``TOOL_OUTCOME_UNKNOWN`` if a ``tool/call`` was durably
   recorded (the tool may have run: do not retry blindly), else
   ``TOOL_NOT_STARTED``. The approval events are evidence too (D19): a call
   whose pre-execute ``approval/asked`` has no ``approval/decided
   {allowed-once}`` cannot have run (the checkpoint policy makes the decision
   durable before the body), so it is ``TOOL_NOT_STARTED`` although its
   ``tool/call`` is durable; so is a call whose durable ``guardrail/asked`` gate has not
   durably passed every guardrail it names (D23). Calls a turn ended ``awaiting-approval`` with are
   pending, not crashed: nothing closes them while no turn is open; the turn
   that applies their decisions carries them, and there only a new
   ``tool/call`` (written just before the body is dispatched) counts as
   "started". Calls of an already closed step count too: the loop
   never closes a step with a call unanswered, but a log written by an older
   dsh (or another writer) may hold one, and the model's next request would
   otherwise carry a tool call with no result (D18);
2. ``step/end`` if a step is open;
3. ``turn/end {reason: {kind: "interrupted"}}``.

:func:`interrupted_turn_closers` is pure and deterministic: the same log always
gives the same closers (seqs continue the log; every closer reuses the last
event's time, never a future one). It never retries a tool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from dsh_host._session.approvals import PRE_EXECUTE_STAGE, awaiting_call_ids
from dsh_host._session.events import (
    ApprovalAsked,
    ApprovalDecided,
    AssistantMessageData,
    InterruptedReason,
    SessionEvent,
    StepEnd,
    ToolCallData,
    ToolResultData,
    TurnEnd,
    TurnStart,
    decode_event,
)
from dsh_host._session.messages import ToolCallBlock
from dsh_host._session.packed import PackedLog, packed_under

__all__ = [
    "GUARDRAIL_GATE_EVENT",
    "GUARDRAIL_VERDICT_EVENT",
    "TOOL_NOT_STARTED",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "call_identity_problems",
    "interrupted_tool_result_id",
    "interrupted_turn_closers",
]

#: Code of a closer for a call that was requested but never recorded as started.
TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
#: Code of a closer for a call that was recorded as started but has no durable result.
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"

#: Model-visible text of a ``TOOL_OUTCOME_UNKNOWN`` closer (exact DSH text).
TOOL_OUTCOME_UNKNOWN_TEXT: Final = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. "
    "Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if "
    "the operation is read-only or idempotent; if it may have side effects, first verify "
    "external state or ask the user. Do not retry blindly."
)
#: Model-visible text of a ``TOOL_NOT_STARTED`` closer (exact DSH text).
TOOL_NOT_STARTED_TEXT: Final = (
    "The tool call was interrupted before the Harness recorded it as started. "
    "Retry it if it is still needed."
)


def interrupted_tool_result_id(call_id: str, seq: int) -> str:
    """The message id of a synthetic result: ``interrupted-tool-result-<callId>-<seq>``."""
    return f"interrupted-tool-result-{call_id}-{seq}"


#: A front-door tool guardrail's gate (D23 in docs/decisions.md): appended (``ignorable``) and
#: made durable after a call's ``tool/call`` and before its guardrails run; ``data`` is
#: ``{turn, callId, guardrails: [names]}``.
GUARDRAIL_GATE_EVENT: Final = "guardrail/asked"
#: One guardrail's verdict (``ignorable``): ``{turn, kind, name, tripwireTriggered, callId?}``.
GUARDRAIL_VERDICT_EVENT: Final = "guardrail/verdict"


class _Pending:
    __slots__ = ("allowed", "call_seq", "carried", "gate", "guards", "step")

    def __init__(self, step: int, *, carried: bool = False) -> None:
        self.step = step
        self.call_seq: int | None = None
        self.carried = carried  # left pending by an awaiting-approval turn
        self.gate: str | None = None  # id of the pre-execute approval/asked after the tool/call
        self.allowed = False  # that ask was decided allowed-once
        #: guardrails gating the call that have not durably passed it (D23)
        self.guards: set[str] = set()

    @property
    def started(self) -> bool:
        """May the body have started? Only with a durable tool/call, no refused approval
        gate and no guardrail gate still deliberating or tripped (D19, D23)."""
        return (
            self.call_seq is not None
            and (self.gate is None or self.allowed)
            and not self.guards
        )


def interrupted_turn_closers(events: Iterable[SessionEvent]) -> list[SessionEvent]:
    """The events that close the open turn at the end of ``events``; ``[]`` if none is open.

    ``events`` must be a contiguous log (``events[i].seq == i`` as loaded), walked once: an
    iterator over a log read page by page will do (``dsh sessions verify``).
    Only the last, open turn is repaired; within it, every unanswered call is
    closed, whether or not its step is still open.

    A session's packed log (a load's, or the ``LogView`` of a session over one) is walked only
    from its last turn end that leaves nothing pending (:func:`_repair_start`, docs/decisions.md
    D46): the fold's state after such an event is its initial state.
    """
    under = packed_under(events)
    if under is not None:
        log, stop = under
        events = log.walk(_repair_start(log, stop), stop)
    last: SessionEvent | None = None
    open_turn: int | None = None
    open_step: int | None = None
    pending: dict[str, _Pending] = {}  # insertion order = transcript order
    carried: dict[str, _Pending] = {}  # what the last awaiting-approval turn left pending
    for event in events:
        last = event
        kind = event.type
        data = event.data
        if kind == "turn/start" and isinstance(data, TurnStart):
            open_turn, open_step = data.turn, None
            pending.clear()
            pending.update(carried)  # this turn applies their decisions
            carried = {}
        elif kind == "turn/end" and isinstance(data, TurnEnd):
            waiting = awaiting_call_ids(data.reason) or ()
            carried = {
                call_id: _Pending(pending[call_id].step, carried=True)
                for call_id in waiting
                if call_id in pending
            }
            open_turn = open_step = None
            pending.clear()
        elif kind == "step/start":
            open_step = data.step
            for carried_entry in pending.values():
                if carried_entry.carried and carried_entry.call_seq is None:
                    carried_entry.step = data.step
        elif kind == "step/end":
            open_step = None  # a closed step's unanswered calls stay pending (defensive)
        elif kind == "assistant/message" and isinstance(data, AssistantMessageData):
            for block in data.message.content:
                if isinstance(block, ToolCallBlock):
                    pending[block.id] = _Pending(data.step)
        elif kind == "tool/call" and isinstance(data, ToolCallData):
            entry = pending.get(data.call_id)
            if entry is not None:
                entry.call_seq = event.seq
                entry.step = data.step
                entry.gate, entry.allowed = None, False
        elif kind == "approval/asked" and isinstance(data, ApprovalAsked):
            entry = pending.get(data.call_id) if isinstance(data.call_id, str) else None
            if (
                entry is not None
                and entry.call_seq is not None
                and entry.gate is None
                and data.stage == PRE_EXECUTE_STAGE
            ):
                entry.gate = data.id
        elif kind == "approval/decided" and isinstance(data, ApprovalDecided):
            for gated in pending.values():
                if gated.gate == data.id:
                    gated.allowed = data.outcome == "allowed-once"
        elif kind == GUARDRAIL_GATE_EVENT and isinstance(data, Mapping):
            entry = pending.get(data.get("callId"))  # type: ignore[arg-type]
            names = data.get("guardrails")
            if entry is not None and entry.call_seq is not None and isinstance(names, Sequence):
                entry.guards = {str(n) for n in names}
        elif kind == GUARDRAIL_VERDICT_EVENT and isinstance(data, Mapping):
            entry = pending.get(data.get("callId"))  # type: ignore[arg-type]
            if entry is not None and data.get("tripwireTriggered") is False:
                entry.guards.discard(str(data.get("name")))
        elif kind == "tool/result" and isinstance(data, ToolResultData):
            pending.pop(data.message.source.call_id, None)
    if open_turn is None or last is None:
        return []
    seq = last.seq + 1
    time = last.time
    closers: list[SessionEvent] = []
    for call_id, entry in pending.items():
        started = entry.started
        # Built as JSON in DSH's key order (repair.ts: envelope surfaceOp before
        # sourceEventSeqs; message id, role, source, content; block type, toolCallId,
        # isError, content), so the closer's bytes equal DSH's, not only its JSON.
        record: dict[str, object] = {
            "type": "tool/result",
            "seq": seq,
            "time": time,
            "data": {
                "turn": open_turn,
                "step": entry.step,
                "message": {
                    "id": interrupted_tool_result_id(call_id, seq),
                    "role": "user",
                    "source": {"kind": "tool", "callId": call_id},
                    "content": [
                        {
                            "type": "tool-result",
                            "toolCallId": call_id,
                            "isError": True,
                            "content": [
                                {
                                    "type": "text",
                                    "text": TOOL_OUTCOME_UNKNOWN_TEXT
                                    if started
                                    else TOOL_NOT_STARTED_TEXT,
                                }
                            ],
                        }
                    ],
                },
                "error": {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN}
                if started
                else {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED},
            },
            "surfaceOp": "append",
        }
        if entry.call_seq is not None:
            record["sourceEventSeqs"] = [entry.call_seq]
        closers.append(decode_event(record, where="repair closer", exact=True))
        seq += 1
    if open_step is not None:
        closers.append(
            SessionEvent(
                type="step/end",
                seq=seq,
                time=time,
                data=StepEnd(turn=open_turn, step=open_step),
            )
        )
        seq += 1
    closers.append(
        SessionEvent(
            type="turn/end",
            seq=seq,
            time=time,
            data=TurnEnd(turn=open_turn, reason=InterruptedReason()),
        )
    )
    return closers


def _repair_start(log: PackedLog, stop: int) -> int:
    """Where the closers' walk of ``log[:stop]`` may start: the last ``turn/end`` before
    ``stop`` that carries no call to the next turn (no awaiting-approval ids), else 0.

    After such an event :func:`interrupted_turn_closers`' state is its initial one (no open
    turn or step, nothing pending or carried; ``last`` is that event itself, and the walk
    starts *at* it), so the closers are those of a walk from 0. An awaiting-approval turn end
    carries its pending calls into the next turn: the search goes on before it."""
    at = log.last_of("turn/end", stop)
    while at is not None:
        data = log[at].data
        if isinstance(data, TurnEnd) and not awaiting_call_ids(data.reason):
            return at
        at = log.last_of("turn/end", at)
    return 0


def call_identity_problems(events: Iterable[SessionEvent]) -> list[str]:
    """What in ``events`` breaks call pairing, which no repair can fix; ``[]`` when nothing does.

    Everything pairs by call id, and the agent loop now makes every id non-empty and unique in
    its session, but a log written before (or by another writer) may hold a model call with an
    empty id (its result is refused by the log, so the call stays unanswered), two calls under
    one id (a result, an approval or a decision then answers either), or a call left without a
    result in a turn that ended (the next request to the model would be refused as unbalanced).
    ``dsh sessions verify`` reports these; crash repair cannot, because it only closes the open
    turn and pairs by the very ids that are ambiguous. ``events`` is a whole log, walked once.
    """
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    answered: set[str] = set()
    closed_unanswered: dict[str, int] = {}  # id -> seq of its assistant/message
    turn_calls: dict[str, int] = {}
    for event in events:
        data = event.data
        if isinstance(data, AssistantMessageData):
            for block in data.message.content:
                if not isinstance(block, ToolCallBlock):
                    continue
                if not block.id:
                    problems.append(f"event {event.seq}: a tool call ({block.name}) has no id")
                elif block.id in first_seen:
                    problems.append(
                        f'event {event.seq}: call id "{block.id}" was already used by event '
                        f"{first_seen[block.id]}"
                    )
                else:
                    first_seen[block.id] = event.seq
                if block.id:
                    turn_calls.setdefault(block.id, event.seq)
        elif isinstance(data, ToolCallData) and not data.call_id:
            problems.append(f"event {event.seq}: a tool/call ({data.name}) has no call id")
        elif isinstance(data, ToolResultData):
            answered.add(data.message.source.call_id)
        elif isinstance(data, TurnEnd):
            # Calls a turn ended awaiting approval for are pending, not lost: a later turn
            # applies their decisions.
            waiting = set(awaiting_call_ids(data.reason) or ())
            for call_id, seq in turn_calls.items():
                if call_id not in answered and call_id not in waiting:
                    closed_unanswered.setdefault(call_id, seq)
            turn_calls = {k: v for k, v in turn_calls.items() if k in waiting}
    for call_id, seq in closed_unanswered.items():
        if call_id not in answered:
            problems.append(f'event {seq}: call "{call_id}" has no tool/result, but its turn ended')
    return problems
