"""Deferred approvals (D19): the pure folds over a log that say which calls wait for a person.

A turn that ends ``{kind: "awaiting-approval", callIds: [...]}`` (the kind the
``user-approval`` plugin adds) leaves those calls *pending*: each has a durable
``tool/call`` and an ``approval/asked`` (stage ``pre-execute``) but no
``tool/result``. A decision arrives later, from any process, as an
``approval/decided`` between turns; the next turn (``continue_turn``) applies
it. Everything here is recomputed from ``session.events``: replaying the log
*is* the state, so a second process sees exactly what the first one left.

A call may also be left pending by its **body** (D36): a body that raised
``ToolCallWaits`` (a sub-agent whose child session awaits approval) gets an
ignorable ``tool/waits {turn, step, callId, sessionId, callIds}`` instead of an
ask. Such a call has no decision of its own (:attr:`DeferredCall.waits_on` names
what it waits on); continuing the session dispatches it again.

Used by crash repair (a pending call is not a crashed one), by the agent loop
(never send a pending call to the model without its result), by the approval
service (bind and record a decision) and by ``dsh approvals``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "AWAITING_APPROVAL",
    "PRE_EXECUTE_STAGE",
    "WAITS_EVENT",
    "DeferredCall",
    "DeferredDecision",
    "args_digest",
    "awaiting_call_ids",
    "deferred_calls",
    "mark_waiters",
    "pending_approvals",
    "pending_in_tree",
    "waiting_calls",
]

#: The turn-end kind of a turn that stopped because calls wait for an approval decision.
AWAITING_APPROVAL: Final = "awaiting-approval"
#: ``approval/asked.stage`` of an ask the tools pipeline made before the body could start.
PRE_EXECUTE_STAGE: Final = "pre-execute"
#: The ignorable event of a call whose body waits on another session's deferred calls (D36).
WAITS_EVENT: Final = "tool/waits"


def args_digest(arguments: str) -> str:
    """Lower-case hex SHA-256 of the raw argument string's UTF-8 bytes.

    A lone surrogate (possible in a model's JSON string) is encoded with
    ``surrogatepass`` so every string has exactly one digest.
    """
    import hashlib  # here: loading OpenSSL costs every command's start ~4 ms otherwise

    return hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()


def _get(data: Any, name: str, wire: str | None = None) -> Any:
    if isinstance(data, Mapping):
        return data.get(wire or name)
    return getattr(data, name, None)


def awaiting_call_ids(reason: Any) -> tuple[str, ...] | None:
    """The pending call ids of an ``awaiting-approval`` turn-end reason, else None.

    Accepts the plugin's typed reason and the untyped mapping a log decodes to
    when the plugin is not composed.
    """
    if isinstance(reason, Mapping):
        kind, ids = reason.get("kind"), reason.get("callIds")
    else:
        config = getattr(type(reason), "__struct_config__", None)
        kind, ids = getattr(config, "tag", None), getattr(reason, "call_ids", None)
    if kind != AWAITING_APPROVAL:
        return None
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        return ()
    return tuple(i for i in ids if isinstance(i, str))


@dataclass(frozen=True, slots=True)
class DeferredDecision:
    """A recorded decision for a deferred call (an ``approval/decided`` after its turn ended)."""

    outcome: str
    seq: int
    args_digest: str | None
    decided_by: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class DeferredCall:
    """One call the last turn left waiting for a decision (see the module docstring)."""

    call_id: str
    tool_name: str
    #: the raw argument string of its ``tool/call``, exactly as logged
    arguments: str
    #: the ``argsDigest`` its ``approval/asked`` recorded (None: the ask recorded none)
    asked_digest: str | None
    ask_id: str
    asked_at: int
    turn: int
    step: int
    decision: DeferredDecision | None
    #: the context its ``approval/asked`` recorded (``sandboxMode``, ``network``,
    #: ``toolDigest``, ``compositionDigest``; empty for an ask that recorded none)
    asked_context: Mapping[str, str] = field(default_factory=dict)
    #: the session and call ids a body waits on (D36): no decision of its own; None for an
    #: approval ask
    waits_on: tuple[str, tuple[str, ...]] | None = None

    @property
    def logged_digest(self) -> str:
        """The digest of the arguments as they are logged *now* (differs if the log was edited)."""
        return args_digest(self.arguments)

    @property
    def bound(self) -> bool:
        """True when the ask recorded a digest and the logged arguments still match it."""
        return self.asked_digest is not None and self.asked_digest == self.logged_digest


def _last_turn_end(events: Sequence[Any]) -> tuple[int, Any] | None:
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type == "turn/start":
            return None  # a turn is open after the last end: nothing waits between turns
        if event.type == "turn/end":
            return index, event.data
    return None


def deferred_calls(events: Sequence[Any]) -> list[DeferredCall]:
    """The calls the last turn left pending, in the order it listed them.

    Empty unless the log's last turn ended ``awaiting-approval`` — including
    while a later turn is open (then that turn is applying the decisions or was
    cut by a crash, and repair owns the calls). A listed call that has a
    ``tool/result`` anywhere after its ``tool/call``, or no pre-execute
    ``approval/asked``, is not pending and is skipped.
    """
    found = _last_turn_end(events)
    if found is None:
        return []
    end_index, end = found
    ids = awaiting_call_ids(_get(end, "reason"))
    if not ids:
        return []
    turn = _get(end, "turn")
    start = end_index
    while start > 0 and events[start].type != "turn/start":
        start -= 1
    calls: dict[str, Any] = {}
    asks: dict[str, Any] = {}
    waits: dict[str, Any] = {}
    answered: set[str] = set()
    wanted = set(ids)
    for event in events[start:end_index]:
        data = event.data
        if event.type == "tool/call":
            call_id = _get(data, "call_id", "callId")
            if call_id in wanted:
                calls[call_id] = data
                answered.discard(call_id)
        elif event.type == "approval/asked":
            call_id = _get(data, "call_id", "callId")
            if call_id in calls and _get(data, "stage") == PRE_EXECUTE_STAGE:
                asks[call_id] = event
        elif event.type == WAITS_EVENT:
            call_id = _get(data, "callId")
            if call_id in calls:
                waits[call_id] = event
        elif event.type == "tool/result":
            source = _get(_get(data, "message"), "source")
            answered.add(_get(source, "call_id", "callId"))
    decisions: dict[str, DeferredDecision] = {}
    for event in events[end_index + 1 :]:
        if event.type == "approval/decided":
            data = event.data
            ask_id = _get(data, "id")
            if ask_id not in decisions:  # one-shot: the first decision is the decision
                decisions[ask_id] = DeferredDecision(
                    outcome=str(_get(data, "outcome")),
                    seq=event.seq,
                    args_digest=_str_or_none(_get(data, "args_digest", "argsDigest")),
                    decided_by=_str_or_none(_get(data, "decided_by", "decidedBy")),
                    reason=_str_or_none(_get(data, "reason")),
                )
        elif event.type == "tool/result":
            source = _get(_get(event.data, "message"), "source")
            answered.add(_get(source, "call_id", "callId"))
    result: list[DeferredCall] = []
    for call_id in ids:
        call, ask = calls.get(call_id), asks.get(call_id)
        if call is None or call_id in answered:
            continue
        arguments = _get(call, "arguments")
        if ask is None:
            wait = waits.get(call_id)
            if wait is not None:
                result.append(_waiting_call(call, wait, turn))
            continue
        ask_id = str(_get(ask.data, "id"))
        result.append(
            DeferredCall(
                call_id=call_id,
                tool_name=str(_get(call, "name")),
                arguments=arguments if isinstance(arguments, str) else "",
                asked_digest=_str_or_none(_get(ask.data, "args_digest", "argsDigest")),
                ask_id=ask_id,
                asked_at=int(ask.time),
                turn=int(turn) if isinstance(turn, int) else 0,
                step=int(_get(call, "step") or 1),
                decision=decisions.get(ask_id),
                asked_context=context_of_ask(ask.data),
            )
        )
    return result


def _waiting_call(call: Any, wait: Any, turn: Any) -> DeferredCall:
    """The :class:`DeferredCall` of a call whose body waits on another session (D36)."""
    arguments = _get(call, "arguments")
    session = _get(wait.data, "sessionId")
    ids = _get(wait.data, "callIds")
    waited = tuple(i for i in ids if isinstance(i, str)) if isinstance(ids, Sequence) else ()
    return DeferredCall(
        call_id=str(_get(call, "call_id", "callId")),
        tool_name=str(_get(call, "name")),
        arguments=arguments if isinstance(arguments, str) else "",
        asked_digest=None,
        ask_id="",
        asked_at=int(wait.time),
        turn=int(turn) if isinstance(turn, int) else 0,
        step=int(_get(call, "step") or 1),
        decision=None,
        waits_on=(session if isinstance(session, str) else "", waited),
    )


#: The context keys an ask records (wire names) and their Struct attributes.
CONTEXT_KEYS: Final = (
    ("sandboxMode", "sandbox_mode"),
    ("network", "network"),
    ("toolDigest", "tool_digest"),
    ("compositionDigest", "composition_digest"),
)


def context_of_ask(data: Any) -> dict[str, str]:
    """The context an ``approval/asked`` (or ``approval/decided``) recorded, by wire name."""
    out: dict[str, str] = {}
    for wire, attribute in CONTEXT_KEYS:
        value = _get(data, attribute, wire)
        if isinstance(value, str):
            out[wire] = value
    return out


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def pending_approvals(events: Sequence[Any], session_id: str) -> list[dict[str, Any]]:
    """Every undecided deferred call of a log in its wire form, one dict per call: what
    ``dsh approvals list --json``, ``dsh run --json`` and ``GET /approvals`` show."""
    return [
        {
            "sessionId": session_id,
            "callId": call.call_id,
            "tool": call.tool_name,
            "argsDigest": call.asked_digest,
            "arguments": call.arguments,
            "askedAt": call.asked_at,
            "turn": call.turn,
            "sandboxMode": call.asked_context.get("sandboxMode"),
            "network": call.asked_context.get("network"),
        }
        for call in deferred_calls(events)
        if call.decision is None and call.waits_on is None
    ]


def waiting_calls(events: Sequence[Any], session_id: str) -> list[dict[str, Any]]:
    """Every call of a log whose body waits on another session's deferred calls (D36), in its
    wire form: ``{sessionId, callId, tool, waitsOn: {sessionId, callIds}}``."""
    return [
        {
            "sessionId": session_id,
            "callId": call.call_id,
            "tool": call.tool_name,
            "turn": call.turn,
            "waitsOn": {"sessionId": call.waits_on[0], "callIds": list(call.waits_on[1])},
        }
        for call in deferred_calls(events)
        if call.waits_on is not None
    ]


def waiting_root(load: Any) -> Generator[str, Any, str | None]:
    """The top session of the chain of parents whose delegating calls wait on ``load`` (D36),
    None when no parent waits on it: the one rule ``dsh approvals decide`` and ``dsh serve``
    follow to continue the parent a child's decision belongs to.

    Written without I/O: it yields the id of each parent it needs and is sent that session's
    load (anything with ``.header`` and ``.events``; None when it is not stored), so a
    synchronous reader and an async one drive the same code."""
    root: str | None = None
    seen = {load.header.id}
    while True:
        parent_id = getattr(load.header, "parent_session", None)
        if not isinstance(parent_id, str) or parent_id in seen:
            return root
        parent = yield parent_id
        if parent is None or not any(
            wait["waitsOn"]["sessionId"] == load.header.id
            for wait in waiting_calls(parent.events, parent_id)
        ):
            return root
        root, load = parent_id, parent
        seen.add(parent_id)


def mark_waiters(rows: Sequence[dict[str, Any]], waiting: Sequence[dict[str, Any]]) -> None:
    """Add ``waitedOnBy: [{sessionId, callId}]`` to each pending row a waiting call of another
    session (``waiting``: :func:`waiting_calls` rows) waits on (D36)."""
    for row in rows:
        waiters = [
            {"sessionId": wait["sessionId"], "callId": wait["callId"]}
            for wait in waiting
            if wait["waitsOn"]["sessionId"] == row["sessionId"]
            and row["callId"] in wait["waitsOn"]["callIds"]
        ]
        if waiters:
            row["waitedOnBy"] = waiters


async def pending_in_tree(
    events: Sequence[Any],
    session_id: str,
    read: Callable[[str], Awaitable[Sequence[Any] | None]],
) -> list[dict[str, Any]]:
    """:func:`pending_approvals` of a log plus those of the sessions its waiting calls wait on
    (read with ``read``; None: not stored), each marked with who waits on it (D36)."""
    rows = pending_approvals(events, session_id)
    waiting = waiting_calls(events, session_id)
    for other in dict.fromkeys(wait["waitsOn"]["sessionId"] for wait in waiting):
        found = await read(other)
        if found is not None:
            below = await pending_in_tree(found, other, read)
            mark_waiters(below, waiting)
            rows.extend(below)
    return rows
