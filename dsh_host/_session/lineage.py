"""A sub-agent session's link to the call that delegated to it (D24, D30).

A child session's header carries DSH's lineage (``parentSession``, ``origin: subagent``,
``delegationDepth``) and nothing else (DSH refuses other header keys). What DSH has no field
for -- the delegating call's id, the parent's turn and the ``tool/call`` event's seq, and the
top-level session and turn the delegation tree hangs from -- is the first event of the child's
log, ``dsh-subagents/delegation``, written ``ignorable`` so DSH keeps
it unread. The ``subagents`` plugin writes it and readers of a child (``telemetry-otel``, which
parents the child's turn under the delegating call's span from it) read it here, so the event's
name and shape are spelled once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DELEGATION_EVENT",
    "DelegationLink",
    "delegating_call",
    "delegation_link",
    "session_link",
]

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
    #: the top-level session and its turn the tree of delegations started from (the parent and
    #: its turn for a child of a top-level session; the parent's own root for a grandchild)
    root_session: str | None = None
    root_turn: int | None = None

    @classmethod
    def under(
        cls,
        parent_session: str,
        parent_events: Sequence[Any],
        call_id: str,
        agent: str,
    ) -> DelegationLink:
        """The link of a new child of ``call_id``, whose ``tool/call`` is in ``parent_events``
        (the parent's log, whose own link, if it is a child too, gives the root)."""
        located = delegating_call(reversed(parent_events), call_id)
        if located is None:
            return cls(parent_session, call_id, agent)
        turn, seq = located
        above = session_link(parent_events)
        if above is not None and above.root_session is not None:
            root, root_turn = above.root_session, above.root_turn
        elif above is not None:  # a parent written before D30: its root is not known
            root, root_turn = None, None
        else:
            root, root_turn = parent_session, turn
        return cls(parent_session, call_id, agent, turn, seq, root, root_turn)

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
        if self.root_session is not None and self.root_turn is not None:
            out["rootSession"] = self.root_session
            out["rootTurn"] = self.root_turn
        return out


def delegation_link(event: Any) -> DelegationLink | None:
    """The link an event (typed, or in wire form ``{"type", "data", ...}``) carries, or None."""
    if isinstance(event, Mapping):
        kind, data = event.get("type"), event.get("data")
    else:
        kind, data = getattr(event, "type", None), getattr(event, "data", None)
    if kind != DELEGATION_EVENT or not isinstance(data, Mapping):
        return None
    parent, call_id = data.get("parentSession"), data.get("callId")
    if not isinstance(parent, str) or not isinstance(call_id, str):
        return None
    agent = data.get("agent")
    turn, seq = data.get("parentTurn"), data.get("parentCallSeq")
    located = isinstance(turn, int) and isinstance(seq, int)
    root, root_turn = data.get("rootSession"), data.get("rootTurn")
    rooted = located and isinstance(root, str) and isinstance(root_turn, int)
    return DelegationLink(
        parent,
        call_id,
        agent if isinstance(agent, str) else "",
        turn if located else None,
        seq if located else None,
        root if rooted else None,
        root_turn if rooted else None,
    )


def session_link(events: Sequence[Any]) -> DelegationLink | None:
    """The link a child's log opens with (typed events or wire dicts), or None: a top-level
    session. Nothing past the first ``turn/start`` is read."""
    for event in events:
        link = delegation_link(event)
        if link is not None:
            return link
        kind = event.get("type") if isinstance(event, Mapping) else getattr(event, "type", None)
        if kind == "turn/start":
            return None
    return None


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
