"""What the ``subagents`` plugin reads from logs, without I/O: a child's recorded state, the
closers a repair answers a delegating or handoff call with, the handoff in force, the
delegations of a log and the steps of a turn (D24, D34). The plugin (``plugin.py``) does the
I/O and holds the state; everything here is a pure function of events, so it is tested on logs.
"""


from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from dsh_host.sdk import (
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    WAITS_EVENT,
    AssistantMessageData,
    SessionEvent,
    TextBlock,
    ToolCallBlock,
    ToolCallData,
    ToolCallWaits,
    ToolError,
    ToolResultData,
    TurnEnd,
    TurnStart,
    awaiting_call_ids,
    capped_mode,
    decode_event,
    deferred_calls,
    interrupted_tool_result_id,
)

from .config import ChildAgentConfig

#: The model-facing delegation tool (DSH's ``tool-subagent`` is named ``subagent`` too).
TOOL_NAME: Final = "subagent"
#: The model-facing handoff tool: the rest of the turn goes to another declared agent (D34).
HANDOFF_TOOL: Final = "handoff"
#: The session's record of a handoff (ignorable: DSH reads past it; its tool call and result
#: are ordinary DSH events). The agent answering a turn is the last one this names in the turn.
HANDOFF_EVENT: Final = "dsh-subagents/handoff"
#: The prefix of a typed child's output tool (``output_<agent name>``, D34).
OUTPUT_TOOL_PREFIX: Final = "output_"
_SUMMARY_TEXT_CHARS: Final = 400


def output_tool(agent: str) -> str:
    """The tool a typed child gives its output through."""
    return f"{OUTPUT_TOOL_PREFIX}{agent}"


def child_session_id(parent_id: str, call_id: str) -> str:
    """The child session of ``call_id`` in ``parent_id`` (D24): derivable, no index needed."""
    return f"{parent_id}--{call_id}"


def depth_of(session: Any) -> int:
    depth = getattr(getattr(session, "header", None), "delegation_depth", 0)
    return depth if isinstance(depth, int) else 0


# -- reading a child's log --------------------------------------------------------------------


class ChildState:
    """What a child's log says about its one delegated turn."""

    __slots__ = (
        "answer", "detail", "ended", "reason", "started", "summary", "undecided", "waiting"
    )

    def __init__(
        self,
        *,
        started: bool,
        ended: bool,
        reason: str,
        answer: str,
        summary: str,
        detail: str = "",
        waiting: tuple[str, ...] = (),
        undecided: tuple[str, ...] = (),
    ) -> None:
        self.started = started  #: a turn was durably opened (its first request may have run)
        self.ended = ended  #: the turn ended on its own (a turn/end written by the live loop)
        self.reason = reason  #: the turn/end reason kind ("" when it did not end)
        self.detail = detail  #: the turn/end reason's message, when it has one
        self.waiting = waiting  #: the call ids an ``awaiting-approval`` end lists
        #: of those, the asks nobody decided yet (D36: the rest are decided, not applied)
        self.undecided = undecided
        self.answer = answer  #: the last assistant text of the turn
        self.summary = summary  #: one paragraph: what the child did

    @property
    def completed(self) -> bool:
        return self.ended and self.reason == "completed"


def reason_field(reason: Any, key: str) -> str:
    """A turn/end reason's ``key`` (e.g. ``kind``), whether it is typed or its plain JSON."""
    plain = reason if isinstance(reason, Mapping) else msgspec.to_builtins(reason)
    value = plain.get(key) if isinstance(plain, Mapping) else None
    return value if isinstance(value, str) else ""


def reason_kind(reason: Any) -> str:
    return reason_field(reason, "kind")


def child_state(events: Sequence[SessionEvent], output: str | None = None) -> ChildState:
    """Read the child's last turn from its log (as stored, before any repair closers).

    ``output``: a typed child's output tool; its answer is then the arguments (as compact
    JSON) of the last call of that tool with a successful result, and a turn that completed
    without one did not give its output (reason ``no-output``).
    """
    started = False
    ended = False
    reason = ""
    detail = ""
    waiting: tuple[str, ...] = ()
    answer = ""
    calls: Counter[str] = Counter()
    answered = 0
    outputs: dict[str, str] = {}  #: output call id -> its raw arguments
    typed: str | None = None
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            started, ended, reason, detail, answer = True, False, "", "", ""
            waiting = ()
            calls.clear()
            answered = 0
            outputs.clear()
            typed = None
        elif isinstance(data, TurnEnd):
            ended = True
            reason = reason_kind(data.reason)
            detail = reason_field(data.reason, "message")
            waiting = awaiting_call_ids(data.reason) or ()
        elif isinstance(data, AssistantMessageData):
            text = "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
            if text:
                answer = text
        elif isinstance(data, ToolCallData):
            calls[data.name] += 1
            if output is not None and data.name == output:
                outputs[data.call_id] = data.arguments
        elif isinstance(data, ToolResultData):
            answered += 1
            raw = outputs.get(data.message.source.call_id)
            blocks = data.message.content
            if raw is not None and blocks and not getattr(blocks[0], "is_error", False):
                typed = msgspec.json.encode(msgspec.json.decode(raw)).decode()
    done = ", ".join(f"{name} x{count}" for name, count in sorted(calls.items())) or "none"
    last = answer if len(answer) <= _SUMMARY_TEXT_CHARS else answer[:_SUMMARY_TEXT_CHARS] + "…"
    summary = (
        f"It started {sum(calls.values())} tool call(s) ({done}), {answered} with a recorded "
        f"result; its last text was: {last!r}."
        if started
        else "It never started a turn."
    )
    if output is not None:
        if typed is not None:
            answer = typed
        elif ended and reason == "completed":
            reason = "no-output"
            detail = f"it answered in text instead of calling {output}"
    undecided = tuple(
        call.call_id
        for call in (deferred_calls(events) if waiting else ())
        if call.decision is None and call.waits_on is None
    )
    return ChildState(
        started=started,
        ended=ended,
        reason=reason,
        answer=answer,
        summary=summary,
        detail=detail,
        waiting=waiting,
        undecided=undecided,
    )


def unfinished_text(agent: str, child_id: str, state: ChildState) -> str:
    why = f" ({state.detail})" if state.detail else ""
    if state.waiting and not state.undecided:  # decided, never applied (D36)
        why = (
            f" (its call(s) {', '.join(state.waiting)} are decided but the decisions were not "
            f"applied: `dsh approvals continue {child_id}` applies them and continues the "
            "child; this delegation is over)"
        )
    elif state.waiting:  # D19: the child's calls wait for a person; say who decides and how
        ids = ", ".join(state.waiting)
        why = (
            f" (its call(s) {ids} wait for an approval decision: `dsh approvals decide "
            f"{child_id} CALL allow|deny` continues the child; this delegation is over)"
        )
    return (
        f'sub-agent "{agent}" (child session {child_id}) ended its turn "{state.reason}"{why} '
        f"without completing. {state.summary}"
    )


def answer_text(agent: str, child_id: str, state: ChildState) -> str:
    """A delegating call's result from its child's ended turn: the answer, or it waits on the
    child's deferred approvals (D36), or the error naming what the child did."""
    if state.completed:
        return state.answer
    if state.waiting:
        raise ToolCallWaits(
            unfinished_text(agent, child_id, state), session_id=child_id, call_ids=state.waiting
        )
    raise ToolError(unfinished_text(agent, child_id, state))


def waited_on(events: Sequence[SessionEvent], call_id: str, child_id: str) -> bool:
    """True when ``call_id`` of this log was left waiting on ``child_id`` (a ``tool/waits``)."""
    for event in events:
        if event.type == WAITS_EVENT:
            fields = event_fields(event)
            if fields.get("callId") == call_id and fields.get("sessionId") == child_id:
                return True
    return False


def child_cap(declared: ChildAgentConfig, parent: Any) -> Any:
    """A child's sandbox ceiling: never wider than the parent (D24), the declared mode under
    the parent's own cap."""
    parent_cap = getattr(parent, "sandbox_cap", None)
    if declared.sandbox is not None and parent_cap is not None:
        return capped_mode(declared.sandbox, parent)
    return declared.sandbox or parent_cap


# -- repair -----------------------------------------------------------------------------------


def delegation_closer(
    closer: SessionEvent, *, agent: str, child_id: str, state: ChildState | None
) -> SessionEvent:
    """The result a delegating call gets on resume, from its child's state (D24).

    ``state`` None: the child session was never stored, so nothing of the delegation ran
    (``TOOL_NOT_STARTED``); a child that never opened a turn is the same (no child model
    request precedes that flush). A completed child's answer is the call's result; a child
    that ended otherwise gives the error text its live call would have given; an interrupted
    child gives ``TOOL_OUTCOME_UNKNOWN`` with the child id and a summary of what it did.
    """
    is_error = True
    error: dict[str, str] | None
    if state is None or not state.started:
        text = f'{TOOL_NOT_STARTED_TEXT}\n(sub-agent "{agent}": the child session {child_id} ' + (
            "was never stored.)" if state is None else "never started a turn.)"
        )
        error = {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED}
    elif state.completed:
        text, is_error, error = state.answer, False, None
    elif state.ended:
        text = f"Error: {unfinished_text(agent, child_id, state)}"
        error = {"name": "SubagentUnfinishedError", "code": "SUBAGENT_UNFINISHED"}
    else:
        text = (
            f'{TOOL_OUTCOME_UNKNOWN_TEXT}\nThe sub-agent "{agent}" was interrupted: its log is '
            f"child session {child_id} (`dsh sessions show {child_id}`). {state.summary}"
        )
        error = {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN}
    return result_closer(closer, text=text, is_error=is_error, error=error)


def result_closer(
    closer: SessionEvent, *, text: str, is_error: bool, error: dict[str, str] | None
) -> SessionEvent:
    """``closer`` (a repair ``tool/result``) with this text: same call, same seq (D24)."""
    data = closer.data
    assert isinstance(data, ToolResultData)
    call_id = data.message.source.call_id
    record: dict[str, Any] = {
        "type": "tool/result",
        "seq": closer.seq,
        "time": closer.time,
        "data": {
            "turn": data.turn,
            "step": data.step,
            "message": {
                "id": interrupted_tool_result_id(call_id, closer.seq),
                "role": "user",
                "source": {"kind": "tool", "callId": call_id},
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": call_id,
                        "isError": is_error,
                        "content": [{"type": "text", "text": text}],
                    }
                ],
            },
        },
        "surfaceOp": "append",
    }
    if error is not None:
        record["data"]["error"] = error
    cited = closer.source_event_seqs
    if isinstance(cited, tuple | list):
        record["sourceEventSeqs"] = list(cited)
    return decode_event(record, where="subagent repair closer", exact=True)


def handoff_text(target: str) -> str:
    return (
        f'Transferred to agent "{target}": it answers the rest of this turn with its own '
        "instructions and tools."
    )


def handoff_closer(closer: SessionEvent, *, target: str, recorded: bool) -> SessionEvent:
    """The result a handoff call gets on resume (D34).

    The handoff's only effect is its record in this log: with the record durable the handoff
    happened (the live call's text); without it nothing happened (``TOOL_NOT_STARTED``).
    """
    if recorded:
        return result_closer(closer, text=handoff_text(target), is_error=False, error=None)
    text = (
        f'{TOOL_NOT_STARTED_TEXT}\n(the handoff to "{target}" was never recorded: the turn '
        "stayed with the agent that called it.)"
    )
    error = {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED}
    return result_closer(closer, text=text, is_error=True, error=error)


def event_fields(event: SessionEvent) -> Mapping[str, Any]:
    """An ignorable event's data as a mapping (live: the dict appended; loaded: opaque JSON)."""
    data = event.data
    if isinstance(data, Mapping):
        return data
    plain = msgspec.to_builtins(data)
    return plain if isinstance(plain, Mapping) else {}


def handoff_target(events: Sequence[SessionEvent]) -> str | None:
    """The agent a handoff gave the current (last) turn to, or None: read from the log (D34)."""
    for event in reversed(events):
        if isinstance(event.data, TurnStart):
            return None
        if event.type == HANDOFF_EVENT:
            target = event_fields(event).get("to")
            return target if isinstance(target, str) else None
    return None


def current_turn(events: Sequence[SessionEvent]) -> int:
    for event in reversed(events):
        if isinstance(event.data, TurnStart):
            return event.data.turn
    return 0


def delegations_in(events: Sequence[SessionEvent], tool: str = TOOL_NAME) -> dict[str, str]:
    """call id -> agent name of every ``tool`` call the model made in ``events``."""
    found: dict[str, str] = {}
    for event in events:
        data = event.data
        if isinstance(data, AssistantMessageData):
            for block in data.message.content:
                if isinstance(block, ToolCallBlock) and block.name == tool:
                    try:  # the model's raw JSON string, as the log keeps it
                        args = msgspec.json.decode(block.arguments)
                    except msgspec.DecodeError:
                        args = None
                    agent = args.get("agent") if isinstance(args, dict) else None
                    found[block.id] = agent if isinstance(agent, str) else "?"
    return found


# -- the tree budget (D34) --------------------------------------------------------------------


def steps_in(events: Sequence[SessionEvent], *, since_turn_start: bool = False) -> int:
    """Model requests a log records (a reply or a cut attempt each), or its last turn's only."""
    count = 0
    for event in reversed(events):
        if since_turn_start and isinstance(event.data, TurnStart):
            break
        if event.type in ("assistant/message", "assistant/attempt"):
            count += 1
    return count


class DelegationTree:
    """One parent turn's delegation tree: the root session, its turn and every descendant."""

    __slots__ = ("children", "root", "turn")

    def __init__(self, root: Any, turn: int) -> None:
        self.root = root
        self.turn = turn
        self.children: list[Any] = []
