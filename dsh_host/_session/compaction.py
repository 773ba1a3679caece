"""The compaction seam (DSH ``@deepseek-ai/dsh-compaction``): vocabulary shared by backends.

No plugin row: this module is the Service Definition a backend (``compaction-basic``)
implements and consumers (``/compact``, the CLI's transcript) read. It holds

- the ``compaction/*`` event names (log-only, registered as known v3 types by the core) and the
  ``CompactionResult`` of one successful transaction;
- :class:`CompactionEngine`, the ``compaction`` service's interface;
- :class:`ManualCompactionError` with DSH's closed code set;
- the checkpoint source (``{kind: plugin, plugin: compact, compactionId}``) every backend puts on
  its replacement ``user/message``, and the predicate that recognizes it after persistence;
- the tool-pairing balance helpers that keep a cut from splitting a tool call from its result;
- the exact texts of DSH's ``/compact`` command (``dsh-command-compact``), for any front end.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from dsh_host._cancel import CancelToken
from dsh_host._session.events import AssistantMessageData, SessionEvent
from dsh_host._session.messages import (
    MessageSource,
    PluginSource,
    TextBlock,
    ToolCallBlock,
)
from dsh_host._session.session import Session
from dsh_host.errors import DshError

__all__ = [
    "CHECKPOINT_PLUGIN",
    "COMPACTION_EVENT_TYPES",
    "COMPACT_CANCELLED",
    "COMPACT_USAGE",
    "MANUAL_COMPACTION_TEXTS",
    "NO_COMPACTABLE_HISTORY",
    "CompactionEngine",
    "CompactionError",
    "CompactionResult",
    "CompactionTrigger",
    "ManualCompactionCode",
    "ManualCompactionError",
    "ResultPruner",
    "balanced_cuts",
    "compact_checkpoint_source",
    "compacted_text",
    "is_compact_checkpoint_source",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
]

#: The log-only lifecycle and shadow-price events (DSH's names; known v3 types).
COMPACTION_EVENT_TYPES: Final = (
    "compaction/start",
    "compaction/summary",
    "compaction/end",
    "compaction/prune",
)

#: ``source.plugin`` of a compaction checkpoint message (DSH's marker).
CHECKPOINT_PLUGIN: Final = "compact"

#: Why automatic policy considers compaction.
CompactionTrigger = Literal["pressure", "context-overflow"]

#: DSH's closed set of expected manual-compaction failures.
ManualCompactionCode = Literal["busy", "cancelled", "changed", "summary", "commit", "persistence"]


class CompactionError(DshError):
    """A compaction could not be carried out."""

    code = "COMPACTION"


class ManualCompactionError(CompactionError):
    """An expected failure of an explicit compaction (``/compact``), with DSH's code.

    ``busy``: a live compaction or a running turn; ``cancelled``: the agent cancelled it;
    ``changed`` / ``summary``: the surface was not replaced, the attempt is logged;
    ``commit``: neutral about partial mutation; ``persistence``: closed but not flushed.
    """

    def __init__(self, code: ManualCompactionCode, message: str) -> None:
        super().__init__(message)
        self.code = code  # type: ignore[misc]  # an instance code: DSH's closed set


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One successful compaction transaction (DSH ``CompactionResult``)."""

    compaction_id: str
    start_seq: int  #: the ``compaction/start`` event
    summary_seq: int  #: the ``compaction/summary`` event
    end_seq: int  #: the ``compaction/end`` event
    summary: tuple[TextBlock, ...]  #: the raw summary (unframed)
    #: first and last shadowed surface nodes: a surface-position span, not a seq interval
    shadowed_range: tuple[int, int]
    shadowed_seqs: tuple[int, ...]  #: every shadowed node, in surface order
    shadowed_token_count: int  #: heuristic price of the shadowed content
    source_command_id: str | None = None


class ResultPruner(Protocol):
    """The optional ``toolResultPruner`` service (``ctx.get(TOOL_RESULT_PRUNER)``).

    A compaction engine lets it shrink oversized, already-answered tool results of ``session``
    before summarizing (``compaction-tool-result-pruner`` implements it); what it returns is
    its own record of what it pruned.
    """

    def prune_session(self, session: Session) -> object: ...


class CompactionEngine(abc.ABC):
    """The ``compaction`` service (DSH ``CompactionEngine``)."""

    @abc.abstractmethod
    async def compact_if_needed(
        self, agent: Any, trigger: CompactionTrigger, signal: CancelToken
    ) -> CompactionResult | None:
        """Automatic compaction for one trigger; None when nothing safe or needed."""

    @abc.abstractmethod
    async def compact_now(
        self,
        agent: Any,
        signal: CancelToken | None = None,
        source_command_id: str | None = None,
    ) -> CompactionResult | None:
        """Compact one useful balanced older span of an idle agent, even below pressure."""

    @abc.abstractmethod
    async def compact_region(
        self, start: int, end: int, agent: Any, signal: CancelToken | None = None
    ) -> CompactionResult:
        """Summarize surface nodes ``start..end`` (inclusive, by position) into one node."""


def compact_checkpoint_source(
    compaction_id: str, source_command_id: str | None = None
) -> PluginSource:
    """The source of a checkpoint message, correlated with its transaction."""
    if source_command_id is None:
        return PluginSource(plugin=CHECKPOINT_PLUGIN, compaction_id=compaction_id)
    return PluginSource(
        plugin=CHECKPOINT_PLUGIN,
        compaction_id=compaction_id,
        source_command_id=source_command_id,
    )


def is_compact_checkpoint_source(source: MessageSource | Any) -> bool:
    """True for a (possibly persisted and reloaded) compaction checkpoint source."""
    if isinstance(source, PluginSource):
        return source.plugin == CHECKPOINT_PLUGIN
    if isinstance(source, Mapping):  # an opaque (frozen JSON) source
        return source.get("kind") == "plugin" and source.get("plugin") == CHECKPOINT_PLUGIN
    return False


def _delta(event: SessionEvent) -> int:
    if event.type == "assistant/message" and isinstance(event.data, AssistantMessageData):
        return sum(1 for b in event.data.message.content if isinstance(b, ToolCallBlock))
    if event.type == "tool/result":
        return -1
    return 0


def balanced_cuts(session: Session, nodes: Sequence[int] | None = None) -> list[bool]:
    """For a surface of N nodes, N + 1 cuts: ``cuts[i]`` is True when no tool call crosses the
    cut before node ``i`` (the last entry is the cut after the tail)."""
    events = session.events
    seqs = session.surface.nodes if nodes is None else nodes
    cuts = [True]
    open_calls = 0
    for seq in seqs:
        open_calls += _delta(events[seq])
        if open_calls < 0:
            raise ValueError(
                f"tool-pairing balance: tool/result at surface seq {seq} has no matching "
                "tool-call (corrupt surface)"
            )
        cuts.append(open_calls == 0)
    return cuts


def _cut(session: Session, seq: int, offset: int) -> bool:
    nodes = session.surface.nodes
    try:
        index = nodes.index(seq)
    except ValueError:
        raise ValueError(f"tool-pairing balance: surface seq {seq} not found") from None
    return balanced_cuts(session, nodes)[index + offset]


def tool_pairing_balanced_before(session: Session, seq: int) -> bool:
    """True when no unanswered tool call crosses the cut just before surface node ``seq``."""
    return _cut(session, seq, 0)


def tool_pairing_balanced_after(session: Session, seq: int) -> bool:
    """True when no unanswered tool call crosses the cut just after surface node ``seq``."""
    return _cut(session, seq, 1)


# --- the /compact command's texts (DSH ``dsh-command-compact``, exact) ----------------------

COMPACT_USAGE: Final = "Usage: /compact (no arguments)"
NO_COMPACTABLE_HISTORY: Final = "No compactable history yet."
COMPACT_CANCELLED: Final = "Compaction cancelled."
#: the direct result of each expected manual failure
MANUAL_COMPACTION_TEXTS: Final[dict[str, str]] = {
    "busy": "Compaction is unavailable because this process has an active compaction, or the "
    "agent is not idle.",
    "cancelled": COMPACT_CANCELLED,
    "changed": "The history selected for compaction changed before it could be replaced. The "
    "conversation is unchanged; the attempt is recorded in the session log.",
    "summary": "Compaction could not produce a useful summary. The conversation is unchanged; "
    "the attempt is recorded in the session log.",
    "commit": "Compaction did not finish cleanly; some session history may have changed. "
    "Inspect the current session state before retrying.",
    "persistence": "Compaction finished, but the session could not be saved.",
}


def compacted_text(result: CompactionResult | None) -> str:
    """``/compact``'s success text: the replaced item count and tokens, or no history."""
    if result is None:
        return NO_COMPACTABLE_HISTORY
    return (
        f"Compacted {len(result.shadowed_seqs)} history items "
        f"(~{result.shadowed_token_count} tokens)."
    )
