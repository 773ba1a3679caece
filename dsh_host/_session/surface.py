"""The surface: the ordered list of log entries the model sees, and its validation.

The log never changes; what the model sees can. Each surface event either
appends itself to the tail (``surfaceOp: "append"``) or replaces a contiguous
range of current surface nodes (``{op: "replace", start, end}``, compaction and
pruning). The surface is therefore a fold over the log, and this module is the
one place that fold is defined: live appends, seed validation and full refolds
all go through :meth:`SurfaceState.plan` then :meth:`SurfaceState.apply`.

``plan`` validates a candidate *without mutating anything*; only when the exact
candidate has entered the log is the plan applied. So a rejected candidate
leaves the nodes and the replace generation unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, NamedTuple

import msgspec
from msgspec import UNSET

from dsh_host._jsonsafe import json_enc_hook
from dsh_host._session.errors import SurfaceTransitionError
from dsh_host._session.events import ReplaceOp, SessionEvent, is_surface_type

__all__ = [
    "SurfaceFold",
    "SurfaceReplacement",
    "SurfaceState",
    "fold_surface",
    "is_append_surface_event",
    "is_replacement_surface_event",
    "is_surface_event",
    "surface_nodes",
]


class SurfaceReplacement(NamedTuple):
    """One replacement observed while folding."""

    seq: int  #: the replacing event
    start: int  #: declared first shadowed seq
    end: int  #: declared last shadowed seq
    shadowed_seqs: tuple[int, ...]  #: the nodes actually removed, in surface order


class SurfaceFold(NamedTuple):
    """Result of folding a whole log."""

    nodes: tuple[int, ...]  #: current surface seqs in model order
    replacements: tuple[SurfaceReplacement, ...]  #: replacements in log order


class _Plan(NamedTuple):
    seq: int
    start_index: int  # -1 for append
    end_index: int
    replacement: SurfaceReplacement | None


#: The plan of every plain append (one shared value: appends need no per-event state).
_APPEND: Final = _Plan(-1, -1, -1, None)


def is_surface_event(event: SessionEvent) -> bool:
    """A surface-eligible event carrying its marker."""
    return event.surface_op is not UNSET and is_surface_type(event.type)


def is_append_surface_event(event: SessionEvent) -> bool:
    """A surface event that entered at the tail (the human transcript's source material)."""
    return event.surface_op == "append" and is_surface_type(event.type)


def is_replacement_surface_event(event: SessionEvent) -> bool:
    """A surface event that replaced a range (model-only)."""
    return isinstance(event.surface_op, ReplaceOp) and is_surface_type(event.type)


class SurfaceState:
    """Mutable fold state: ``nodes`` (seqs in model order) and ``replace_generation``."""

    __slots__ = ("nodes", "replace_generation")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.replace_generation = 0

    def plan(
        self, event: SessionEvent, lookup: Callable[[int], SessionEvent | None]
    ) -> _Plan | None:
        """Validate ``event`` as the next log entry; None for a log-only event.

        ``lookup(seq)`` returns an earlier event (for ``tool/result`` rewrites)
        or None when that seq is outside the folded window.
        """
        op = event.surface_op
        if op is UNSET or not is_surface_type(event.type):
            return None
        if op == "append":
            if event.source_event_seqs is not UNSET:
                self._check_provenance(event, ())
            return _APPEND
        assert isinstance(op, ReplaceOp)
        start_index = self._index_of(op.start)
        if start_index < 0:
            raise self._error(event, f"surface replace: start seq {op.start} not found in surface")
        end_index = self._index_of(op.end)
        if end_index < 0:
            raise self._error(event, f"surface replace: end seq {op.end} not found in surface")
        if start_index > end_index:
            raise self._error(
                event,
                f"surface replace: start seq {op.start} (index {start_index}) is after end seq "
                f"{op.end} (index {end_index})",
            )
        shadowed = tuple(self.nodes[start_index : end_index + 1])
        self._check_provenance(event, shadowed)
        if event.type == "tool/result":
            self._check_tool_result_rewrite(event, shadowed, lookup)
        return _Plan(
            event.seq,
            start_index,
            end_index,
            SurfaceReplacement(event.seq, op.start, op.end, shadowed),
        )

    def apply(self, plan: _Plan | None, seq: int) -> None:
        """Commit a plan returned by :meth:`plan` (after the event entered the log)."""
        if plan is None:
            return
        if plan.start_index < 0:
            self.nodes.append(seq)
            return
        self.nodes[plan.start_index : plan.end_index + 1] = [plan.seq]
        self.replace_generation += 1

    # -- checks -------------------------------------------------------------------------

    def _index_of(self, seq: int) -> int:
        # Nodes are strictly increasing only until the first replacement, so search linearly
        # from the tail (compaction targets recent ranges; replacements are rare).
        nodes = self.nodes
        for index in range(len(nodes) - 1, -1, -1):
            if nodes[index] == seq:
                return index
        return -1

    @staticmethod
    def _error(event: SessionEvent, message: str) -> SurfaceTransitionError:
        return SurfaceTransitionError(
            f'session event "{event.type}" at seq {event.seq}: {message}',
            event_type=event.type,
            seq=event.seq,
        )

    def _check_provenance(self, event: SessionEvent, shadowed: Sequence[int]) -> None:
        sources = event.source_event_seqs
        cited: set[int] = set()
        if sources is not UNSET:
            if len(sources) == 0 and event.type != "assistant/message":
                raise self._error(
                    event, "sourceEventSeqs must not be empty except on assistant/message"
                )
            cited = set(sources)
            if len(cited) != len(sources):
                raise self._error(event, "sourceEventSeqs must not contain duplicates")
            for source in sources:
                if source >= event.seq:
                    raise self._error(
                        event,
                        f"sourceEventSeqs must reference earlier events: {source} >= current "
                        f"seq {event.seq}",
                    )
        missing = [seq for seq in shadowed if seq not in cited]
        if missing:
            raise self._error(
                event,
                "surface replace: sourceEventSeqs must include every shadowed surface node; "
                f"missing {', '.join(str(m) for m in missing)}",
            )

    def _check_tool_result_rewrite(
        self,
        event: SessionEvent,
        shadowed: Sequence[int],
        lookup: Callable[[int], SessionEvent | None],
    ) -> None:
        if len(shadowed) != 1:
            raise self._error(
                event, "tool/result surface replacement must rewrite exactly one current node"
            )
        original = lookup(shadowed[0])
        if original is None or original.type != "tool/result":
            raise self._error(
                event, "tool/result surface replacement must target a current tool/result"
            )
        if _blank_result_content(original.data) != _blank_result_content(event.data):
            raise self._error(event, "tool/result surface replacement may change only content")


def _blank_result_content(data: Any) -> Any:
    """The tool/result data as plain JSON with ``message.content[0].content`` blanked."""
    plain = msgspec.to_builtins(data, enc_hook=json_enc_hook)
    try:
        plain["message"]["content"][0]["content"] = None
    except (KeyError, IndexError, TypeError):
        pass
    return plain


def surface_nodes(
    events: Iterable[SessionEvent], lookup: Callable[[int], SessionEvent | None]
) -> tuple[int, ...]:
    """The surface's nodes (event seqs, in surface order) of a log walked once, e.g. read page
    by page: only the nodes are kept, and ``lookup(seq)`` reads back an earlier event when a
    ``tool/result`` rewrite needs it (D33)."""
    state = SurfaceState()
    for event in events:
        state.apply(state.plan(event, lookup), event.seq)
    return tuple(state.nodes)


def fold_surface(events: Sequence[SessionEvent], *, base_seq: int = 0) -> SurfaceFold:
    """Fold a whole log (or a window starting at ``base_seq``) into its surface.

    Raises :class:`SurfaceTransitionError` on the first invalid transition; a
    replacement reaching before the window head fails because its range is absent.
    """
    state = SurfaceState()
    replacements: list[SurfaceReplacement] = []

    def lookup(seq: int) -> SessionEvent | None:
        index = seq - base_seq
        return events[index] if 0 <= index < len(events) else None

    for event in events:
        plan = state.plan(event, lookup)
        state.apply(plan, event.seq)
        if plan is not None and plan.replacement is not None:
            replacements.append(plan.replacement)
    return SurfaceFold(tuple(state.nodes), tuple(replacements))
