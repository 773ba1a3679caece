"""The approval audit invariants, checkable over any log.

The reference runs these as a pre-commit validator; this host's ``Session``
has no pre-commit hook yet, so here they are a replay check: feed a log (live
or loaded) to :func:`check_approval_invariants`, or feed events one at a time
to an :class:`ApprovalAuditChecker`. Messages are the reference's texts (tests
match them as substrings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dsh_host.sdk import awaiting_call_ids

from .errors import ApprovalInvariantError
from .policy import APPROVAL_OUTCOMES, APPROVAL_POLICIES

__all__ = ["ApprovalAuditChecker", "check_approval_invariants"]


def _get(data: Any, name: str, wire: str | None = None) -> Any:
    if isinstance(data, Mapping):
        return data.get(wire or name)
    return getattr(data, name, None)


class ApprovalAuditChecker:
    """Incremental checker: one ``check(event)`` per event, in log order.

    Tracks whether a turn is open and which asks are still pending, so it can
    say precisely what is wrong with the event it is given.
    """

    def __init__(self) -> None:
        self._open_turn = False
        self._pending: set[str] = set()
        self._deferred: set[str] = set()  # left open by an awaiting-approval turn (D19)

    @property
    def pending(self) -> frozenset[str]:
        """Ids asked but not yet decided (deferred asks included)."""
        return frozenset(self._pending | self._deferred)

    def check(self, event: Any) -> None:
        kind = event.type
        seq = getattr(event, "seq", None)
        if kind == "turn/start":
            self._open_turn = True
        elif kind == "turn/end":
            self._open_turn = False
            if awaiting_call_ids(_get(event.data, "reason")) is not None:
                # Its open asks wait for a decision that may arrive between turns.
                self._deferred |= self._pending
                self._pending.clear()
        elif kind == "approval/asked":
            if not self._open_turn:
                raise ApprovalInvariantError(
                    "approval/asked appended outside any open turn", seq=seq
                )
            tool_name = _get(event.data, "tool_name", "toolName")
            if not isinstance(tool_name, str) or not tool_name:
                raise ApprovalInvariantError("approval/asked toolName must be non-empty", seq=seq)
            ask_id = _get(event.data, "id")
            if ask_id in self._pending:
                raise ApprovalInvariantError(
                    f'approval/asked repeated open id "{ask_id}"', seq=seq
                )
            self._pending.add(str(ask_id))
        elif kind == "approval/decided":
            if _get(event.data, "id") in self._deferred:
                self._deferred.discard(str(_get(event.data, "id")))
                outcome = _get(event.data, "outcome")
                if outcome not in APPROVAL_OUTCOMES:
                    raise ApprovalInvariantError(
                        f'approval/decided carries unknown outcome "{outcome}"', seq=seq
                    )
                return
            if not self._open_turn:
                raise ApprovalInvariantError(
                    "approval/decided appended outside any open turn", seq=seq
                )
            ask_id = _get(event.data, "id")
            if ask_id not in self._pending:
                raise ApprovalInvariantError(
                    f'approval/decided has no matching approval/asked for id "{ask_id}"', seq=seq
                )
            outcome = _get(event.data, "outcome")
            if outcome not in APPROVAL_OUTCOMES:
                raise ApprovalInvariantError(
                    f'approval/decided carries unknown outcome "{outcome}"', seq=seq
                )
            self._pending.discard(str(ask_id))
        elif kind == "approval/policy":
            policy = _get(event.data, "policy")
            if policy not in APPROVAL_POLICIES:
                raise ApprovalInvariantError(
                    f'approval/policy carries unknown policy "{policy}"', seq=seq
                )


def check_approval_invariants(events: Iterable[Any]) -> frozenset[str]:
    """Check a whole log; return the ids still pending at its end (normally empty)."""
    checker = ApprovalAuditChecker()
    for event in events:
        checker.check(event)
    return checker.pending
