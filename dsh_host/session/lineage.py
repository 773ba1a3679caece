"""A sub-agent session's link to the call that delegated to it (D24, D30).

A child session's header carries DSH's lineage (``parentSession``, ``origin: subagent``,
``delegationDepth``) and nothing else (DSH refuses other header keys). What DSH has no field
for -- the delegating call's id, the parent's turn and the ``tool/call`` event's seq -- is the
first event of the child's log, ``dsh-subagents/delegation``, written ``ignorable`` so DSH keeps
it unread. The ``subagents`` plugin writes it and readers of a child (``telemetry-otel``, which
parents the child's turn under the delegating call's span from it) read it here, so the event's
name and shape are spelled once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["DELEGATION_EVENT", "DelegationLink", "delegating_call", "delegation_link"]

#: The child log's link back to the delegating call (ignorable: DSH keeps it unread).
DELEGATION_EVENT: Final = "dsh-subagents/delegation"


@dataclass(frozen=True, slots=True)
class DelegationLink:
    """What a ``dsh-subagents/delegation`` event says (the ``data`` of its wire form)."""

    parent_session: str  #: the parent session id (the header's ``parentSession`` too)
    call_id: str  #: the delegating ``subagent`` call in the parent
    agent: str  #: the sub-agent's declared name
    #: the parent's turn and the seq of its ``tool/call`` for ``call_id``; None in a child
    #: written before D30 (the parent's log still has them: :func:`delegating_call`)
    parent_turn: int | None = None
    parent_call_seq: int | None = None

    def data(self) -> dict[str, Any]:
        """The event's ``data``."""
        out: dict[str, Any] = {
            "parentSession": self.parent_session,
            "callId": self.call_id,
            "agent": self.agent,
        }
        if self.parent_turn is not None and self.parent_call_seq is not None:
            out["parentTurn"] = self.parent_turn
            out["parentCallSeq"] = self.parent_call_seq
        return out


def delegation_link(event: Mapping[str, Any]) -> DelegationLink | None:
    """The link an event in wire form (``{"type", "data", ...}``) carries, or None."""
    if event.get("type") != DELEGATION_EVENT:
        return None
    data = event.get("data")
    if not isinstance(data, Mapping):
        return None
    parent, call_id = data.get("parentSession"), data.get("callId")
    if not isinstance(parent, str) or not isinstance(call_id, str):
        return None
    agent = data.get("agent")
    turn, seq = data.get("parentTurn"), data.get("parentCallSeq")
    located = isinstance(turn, int) and isinstance(seq, int)
    return DelegationLink(
        parent,
        call_id,
        agent if isinstance(agent, str) else "",
        turn if located else None,
        seq if located else None,
    )


def delegating_call(events: Iterable[Any], call_id: str) -> tuple[int, int] | None:
    """``(turn, seq)`` of the first ``tool/call`` event for ``call_id`` in ``events`` (a
    parent's typed events or wire dicts; pass them reversed to find the latest one cheaply);
    None when there is none."""
    for event in events:
        if isinstance(event, Mapping):
            kind, seq, data = event.get("type"), event.get("seq"), event.get("data")
            if kind != "tool/call" or not isinstance(data, Mapping):
                continue
            turn, call = data.get("turn"), data.get("callId")
        else:
            if getattr(event, "type", None) != "tool/call":
                continue
            seq, data = event.seq, event.data
            turn, call = getattr(data, "turn", None), getattr(data, "call_id", None)
        if call == call_id and isinstance(turn, int) and isinstance(seq, int):
            return (turn, seq)
    return None
