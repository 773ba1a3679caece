"""The effects ledger in a forked session: the model is told, and no effect runs twice (D27).

A fork's log carries ``fork/effects`` events (:mod:`dsh_host._persistence.fork`): the calls of the
abandoned branch, with what the log proves about each. Two things read them, both here:

* the runtime context section ``effects:ledger`` tells the model, at every step, what the world
  already saw (calls done or of unknown outcome, with their idempotency keys and results);
* :func:`ledger_gate`, a ``tools/pre-execute`` listener (the policy stage every top-level call
  crosses, before approval), keeps a side-effecting call from running again: a call of the
  same tool with the same arguments (compared as canonical JSON) as a ledger entry that is
  ``done`` (and did not fail) is answered from the record instead -- ``Error: not run again
  ...`` with the recorded result -- and one whose outcome is ``unknown`` is refused with the
  key to verify it by. A tool declared ``read_only`` runs as usual; ``not-started`` and failed
  entries never happened, so they run too. The rule holds for every identical call, not only
  the first (fail closed: the ledger cannot tell a deliberate repeat from a replayed one).
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from dsh_host._persistence.fork import FORK_EFFECTS_EVENT, ledger_entries, replay_origin
from dsh_host._session.packed import packed_under
from dsh_host._tools import Deny, PreToolDecision, ToolExecution
from dsh_host._tools.keys import TOOLS

if TYPE_CHECKING:
    from dsh_host._context import Context
    from dsh_host._session.session import Session

    from .types import AssembleContext

__all__ = [
    "LEDGER_CONTEXT",
    "canonical_arguments",
    "is_replay",
    "ledger_context",
    "ledger_decision",
    "ledger_gate",
    "session_ledger",
]

#: The runtime-context section that lists the ledger (order 116: after approval:policy).
LEDGER_CONTEXT: Final = "effects:ledger"

_cache: weakref.WeakKeyDictionary[Any, tuple[int, list[dict[str, Any]], bool]] = (
    weakref.WeakKeyDictionary()
)


def _ledger_state(session: Session) -> tuple[list[dict[str, Any]], bool]:
    events = session.events
    scanned, entries, replay = _cache.get(session, (0, [], False))
    if scanned < len(events):
        under = packed_under(events)
        if under is not None and under[0].last_of(FORK_EFFECTS_EVENT, under[1]) is None:
            # No ledger event in the log (every session but a fork's or a replay's): nothing
            # to walk for (docs/decisions.md D46).
            _cache[session] = (len(events), entries, replay)
            return entries, replay
        fresh = [e for e in events.iter_from(scanned) if e.type == FORK_EFFECTS_EVENT]
        if fresh:
            entries = [*entries, *ledger_entries(fresh)]
            replay = replay or replay_origin(fresh)
        _cache[session] = (len(events), entries, replay)
    return entries, replay


def session_ledger(session: Session) -> list[dict[str, Any]]:
    """The ledger entries of ``session``'s log (cached; only new events are scanned)."""
    return _ledger_state(session)[0]


def is_replay(session: Session) -> bool:
    """Whether ``session`` is a ``dsh replay`` child (D28)."""
    return _ledger_state(session)[1]


def canonical_arguments(raw: Any) -> str:
    """A call's arguments as canonical JSON (keys sorted); an undecodable string as itself."""
    value = raw
    if isinstance(raw, str):
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return raw
    try:
        return msgspec.json.encode(_plain(value), order="sorted").decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def ledger_decision(
    name: str, arguments: Any, entries: Sequence[Mapping[str, Any]], *, replay: bool = False
) -> Deny | None:
    """The refusal a call of ``name`` with ``arguments`` gets from ``entries``, or None.

    ``replay`` (a ``dsh replay`` child, D28): no call reaching here executes; one with no
    done or unknown match is refused as ``unmatched``, naming the nearest recorded call.
    """
    if not entries and not replay:
        return None
    key = canonical_arguments(arguments)
    for entry in entries:
        if entry.get("tool") != name or canonical_arguments(entry.get("arguments", "")) != key:
            continue
        where = f'session "{entry.get("session")}"' if entry.get("session") else "the source"
        ikey = entry.get("idempotencyKey")
        if entry.get("status") == "done" and entry.get("isError") is not True:
            result = entry.get("result")
            return Deny(
                f"not run again: this exact call already took effect in {where} before this "
                f"fork (idempotency key {ikey}); its recorded result: {result}"
            )
        if entry.get("status") == "unknown":
            return Deny(
                f"not run: this exact call may already have taken effect in {where} before this "
                f"fork (its outcome is unknown; idempotency key {ikey}); verify the external "
                "state, or ask the user, before doing it again"
            )
    if replay:
        same_tool = [e for e in entries if e.get("tool") == name]
        near = same_tool or list(entries)
        shown = (f"{near[0].get('tool')} {near[0].get('arguments')} ({near[0].get('status')})"
                 if near else "none")  # fmt: skip
        return Deny(
            "not run: this is a replay, and a tool with side effects runs only from the "
            f"record; this call has no recorded match (unmatched call; nearest recorded call: "
            f"{shown})"
        )
    return None


def ledger_gate(ctx: Context) -> Callable[[ToolExecution, Any], Awaitable[PreToolDecision]]:
    """The ``tools/pre-execute`` listener (see the module docstring)."""

    async def gate(execution: ToolExecution, next_: Any) -> PreToolDecision:
        agent = execution.agent
        if agent is not None and execution.parent is None and not execution.reconciling:
            session = agent.session
            entries, replay = _ledger_state(session) if session is not None else ([], False)
            tools = ctx.get(TOOLS)
            definition = tools.get(execution.name) if tools is not None else None
            if (entries or replay) and not (definition is not None and definition.read_only):
                raw = execution.raw_arguments
                refusal = ledger_decision(
                    execution.name, raw if raw is not None else execution.arguments, entries,
                    replay=replay,
                )
                if refusal is not None:
                    return refusal
        decision: PreToolDecision = await next_()
        return decision

    return gate


def ledger_context(context: AssembleContext) -> str:
    """The ``effects:ledger`` section: empty unless the session carries a ledger, and empty in
    a ``dsh replay`` child (D28): there the model must be asked what the source's model was
    asked; the gate answers its calls from the record without the model being told."""
    agent = context.agent
    if agent is None or is_replay(agent.session):
        return ""
    entries = [e for e in session_ledger(agent.session) if e.get("status") != "not-started"]
    if not entries:
        return ""
    lines = [
        "This session was forked; calls made in the abandoned branch after the fork point "
        "already reached the world. Do not repeat a done call; verify an unknown one first:"
    ]
    for entry in entries:
        status = entry.get("status")
        if status == "done" and entry.get("isError") is True:
            status = "failed"
        result = entry.get("result")
        shown = ""
        if isinstance(result, str) and status == "done":
            shown = f" -> {result if len(result) <= 200 else result[:200] + ' ...'}"
        lines.append(
            f"- {entry.get('tool')} {entry.get('arguments')}: {status} "
            f"(idempotency key {entry.get('idempotencyKey')}){shown}"
        )
    return "\n".join(lines)
