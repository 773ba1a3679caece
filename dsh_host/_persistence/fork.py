"""Forking a stored session at a turn boundary, with the effects ledger of what it abandons.

:func:`fork_stored` copies a stored session's events up to a turn boundary into a new session
whose header links to the source exactly as DSH's fork does (``parentSession`` = the source's
id, ``isSeeded: true``, the source's ``cwd``; the cut is marked ``session/end-seed {inherited:
true}``). The source is only read, never changed.

The events after the boundary leave the child's history, and with them the memory that some
calls already acted on the world. The child therefore starts with a ``fork/effects`` event
(beyond DSH, written ``ignorable: true``: DSH keeps it without reading it): every call of the
abandoned branch with its status, idempotency key and recorded result
(:func:`~dsh_host._session.effects.effects_after`). The agent layer reads every ``fork/effects``
event of a log (a fork of a fork inherits its parent's in the copied prefix) to tell the model
and to keep a side-effecting call from running again (D27 in docs/decisions.md).

Boundaries: ``turn=N`` cuts after turn N's ``turn/end``; ``at=SEQ`` keeps events ``0..SEQ``
and SEQ must be a turn boundary (no turn open after it); neither cuts at the last turn
boundary of the log (all of it when its last turn ended; before an interrupted last turn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from msgspec import UNSET

from dsh_host._jsonsafe import is_safe_int
from dsh_host._persistence.persistence import SessionPersistence
from dsh_host._session.effects import Effect, effects_after
from dsh_host._session.errors import SessionForkError
from dsh_host._session.events import SessionEvent, TurnEnd, TurnStart, event_to_builtins
from dsh_host._session.header import (
    SESSION_FORMAT_VERSION,
    SessionHeader,
    new_session_id,
    now_ms,
    parse_session_header,
)
from dsh_host._session.session import Session

__all__ = [
    "FORK_EFFECTS_EVENT",
    "ForkResult",
    "append_fork_effects",
    "build_fork",
    "fork_boundary",
    "fork_effects",
    "fork_stored",
    "ledger_entries",
    "replay_origin",
]

#: The event that carries the effects ledger into a fork (``ignorable: true``).
FORK_EFFECTS_EVENT: Final = "fork/effects"


@dataclass(frozen=True, slots=True)
class ForkResult:
    """A stored fork: the child's id, the last copied seq of the source, the ledger."""

    session_id: str
    parent_session: str
    boundary: int
    effects: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "parentSession": self.parent_session,
            "boundary": self.boundary,
            "effects": list(self.effects),
        }


def _turn_boundaries(events: Sequence[SessionEvent]) -> list[tuple[int, int | None]]:
    """``(seq, turn that ended there or None)`` for every seq after which no turn is open."""
    out: list[tuple[int, int | None]] = []
    open_turn: int | None = None
    for event in events:
        data = event.data
        ended: int | None = None
        if event.type == "turn/start" and isinstance(data, TurnStart):
            open_turn = data.turn
        elif event.type == "turn/end" and isinstance(data, TurnEnd):
            open_turn, ended = None, data.turn
        if open_turn is None:
            out.append((event.seq, ended))
    return out


def fork_boundary(
    session_id: str, events: Sequence[SessionEvent], *, at: int | None = None,
    turn: int | None = None, before_turn: int | None = None,
) -> int:  # fmt: skip
    """The last seq a fork of ``events`` keeps (see the module docstring); raises
    :class:`SessionForkError` (``INVALID_BOUNDARY``, ``NOT_A_TURN_BOUNDARY``) naming why.

    ``before_turn=N`` (``dsh replay``) cuts just before turn N starts: -1 (nothing copied)
    when no boundary precedes it.
    """
    if sum(x is not None for x in (at, turn, before_turn)) > 1:
        raise SessionForkError("give --at SEQ or --turn N, not both", "INVALID_BOUNDARY")
    boundaries = _turn_boundaries(events)
    if before_turn is not None:
        starts = [e.seq for e in events
                  if isinstance(e.data, TurnStart) and e.data.turn == before_turn]  # fmt: skip
        if not starts:
            raise SessionForkError(
                f'session "{session_id}" has no turn {before_turn}', "INVALID_BOUNDARY"
            )
        return max((seq for seq, _ in boundaries if seq < starts[0]), default=-1)
    if not boundaries:
        raise SessionForkError(
            f'session "{session_id}" has no turn boundary to fork at (it is empty or its first '
            "turn never ended)",
            "NOT_A_TURN_BOUNDARY",
        )
    if turn is not None:
        if not is_safe_int(turn) or turn < 1:
            raise SessionForkError(f"--turn must be a turn number >= 1, got {turn!r}",
                                   "INVALID_BOUNDARY")  # fmt: skip
        ends = [seq for seq, ended in boundaries if ended == turn]
        if not ends:
            done = sorted({ended for _, ended in boundaries if ended is not None})
            listed = ", ".join(str(n) for n in done) or "none"
            raise SessionForkError(
                f'turn {turn} of session "{session_id}" has no turn/end to fork after (ended '
                f"turns: {listed})",
                "INVALID_BOUNDARY",
            )
        return ends[-1]
    if at is None:
        return boundaries[-1][0]
    last = events[-1].seq if events else -1
    if not is_safe_int(at) or at < 0 or at > last:
        raise SessionForkError(
            f'--at {at!r} is not a seq of session "{session_id}" (0..{last})', "INVALID_BOUNDARY"
        )
    seqs = [seq for seq, _ in boundaries]
    if at not in seqs:
        before = max((seq for seq in seqs if seq < at), default=None)
        after = min((seq for seq in seqs if seq > at), default=None)
        near = " or ".join(str(s) for s in (before, after) if s is not None)
        raise SessionForkError(
            f'seq {at} of session "{session_id}" is inside a turn; a fork keeps whole turns: '
            f"fork at a turn boundary ({near})",
            "NOT_A_TURN_BOUNDARY",
        )
    return at


def _result_texts(events: Sequence[SessionEvent]) -> dict[int, str]:
    """seq -> the text a ``tool/result`` gave the model (text blocks joined)."""
    out: dict[int, str] = {}
    for event in events:
        if event.type != "tool/result":
            continue
        message = event_to_builtins(event)["data"].get("message", {})
        parts: list[str] = []
        for block in message.get("content", ()):
            for inner in block.get("content", ()) if isinstance(block, Mapping) else ():
                if isinstance(inner, Mapping) and inner.get("type") == "text":
                    parts.append(str(inner.get("text", "")))
        out[event.seq] = "\n".join(parts)
    return out


def fork_effects(
    session_id: str, events: Sequence[SessionEvent], boundary: int
) -> list[dict[str, Any]]:
    """The ledger a fork at ``boundary`` carries: every call after it (``Effect.to_json()``)
    plus ``result``, the text its recorded result gave the model (None without one)."""
    texts = _result_texts(events)
    entries: list[dict[str, Any]] = []
    effect: Effect
    for effect in effects_after(session_id, events, boundary):
        entry = effect.to_json()
        entry["result"] = texts.get(effect.result_seq) if effect.result_seq is not None else None
        entries.append(entry)
    return entries


def ledger_entries(events: Sequence[Any]) -> list[dict[str, Any]]:
    """Every effect of every ``fork/effects`` event in ``events`` (a fork of a fork inherits
    its parent's), in log order. ``events`` are SessionEvents or their JSON form."""
    out: list[dict[str, Any]] = []
    for raw in events:
        event = raw if isinstance(raw, Mapping) else event_to_builtins(raw)
        if event.get("type") != FORK_EFFECTS_EVENT:
            continue
        data = event.get("data")
        effects = data.get("effects") if isinstance(data, Mapping) else None
        parent = data.get("parentSession") if isinstance(data, Mapping) else None
        for entry in effects if isinstance(effects, Sequence) else ():
            if isinstance(entry, Mapping):
                out.append({"session": parent, **entry})
    return out


def replay_origin(events: Sequence[Any]) -> bool:
    """Whether a ``fork/effects`` event of ``events`` marks the log as a replay (``dsh
    replay``: nothing with side effects executes in it, D28)."""
    for raw in events:
        event = raw if isinstance(raw, Mapping) else event_to_builtins(raw)
        if event.get("type") == FORK_EFFECTS_EVENT:
            data = event.get("data")
            if isinstance(data, Mapping) and data.get("origin") == "replay":
                return True
    return False


def build_fork(
    source_header: SessionHeader, events: Sequence[SessionEvent], boundary: int, child_id: str,
    *, origin_note: Mapping[str, Any] | None = None,
) -> tuple[Session, list[dict[str, Any]]]:  # fmt: skip
    """The child session (detached, validated) and its ledger; nothing is written."""
    source_id = source_header.id
    effects = fork_effects(source_id, events, boundary)
    meta: dict[str, Any] = {
        "version": SESSION_FORMAT_VERSION, "id": child_id, "createdAt": now_ms(),
    }  # fmt: skip
    if source_header.cwd is not UNSET:
        meta["cwd"] = source_header.cwd
    meta.update({"parentSession": source_id, "isSeeded": True})
    header = parse_session_header(meta, session_id=child_id)
    child = Session.restore(header, list(events[: boundary + 1]), mark_seed_end=False)
    child._mark_seed_end(inherited=True)
    append_fork_effects(child, source_id, boundary, effects, origin_note=origin_note)
    return child, effects


def append_fork_effects(
    child: Session, source_id: str, boundary: int, effects: list[dict[str, Any]],
    *, origin_note: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """Append the ``fork/effects`` record (``ignorable: true``) of a fork of ``source_id`` at
    ``boundary`` to ``child``: the one shape every fork writes (``dsh sessions fork``, ``POST
    /sessions/{id}/fork``, ``dsh replay``, the front door's ``Agent.fork``)."""
    record: dict[str, Any] = {"parentSession": source_id, "boundary": boundary, "effects": effects}
    if origin_note:
        record.update(origin_note)
    child.append(FORK_EFFECTS_EVENT, record, ignorable=True)


async def fork_stored(
    persistence: SessionPersistence, source_id: str, *, at: int | None = None,
    turn: int | None = None, before_turn: int | None = None, child_id: str | None = None,
    origin_note: Mapping[str, Any] | None = None,
) -> ForkResult:  # fmt: skip
    """Fork the stored session ``source_id`` (read only) into a new stored session.

    ``origin_note`` adds keys to the child's ``fork/effects`` record (``dsh replay`` names
    itself there). Raises :class:`SessionForkError` for a boundary that is not a turn
    boundary and the backend's errors as they are (``SessionNotFoundError``,
    ``SessionAlreadyExistsError``).
    """
    load = await persistence.inspect(source_id)
    events = list(load.events)
    boundary = fork_boundary(source_id, events, at=at, turn=turn, before_turn=before_turn)
    sid = child_id if child_id is not None else new_session_id()
    child, effects = build_fork(load.header, events, boundary, sid, origin_note=origin_note)
    handle = await persistence.create(child.header)
    try:
        handle.append(list(child.events))
        await handle.flush()
    finally:
        await handle.close()
    return ForkResult(sid, source_id, boundary, tuple(effects))
