"""``compaction-tool-result-pruner``: model-free pruning of oversized tool results.

The ``toolResultPruner`` service (DSH ``dsh-compaction-tool-result-pruner``). Every current
``tool/result`` surface node whose text exceeds ``threshold_chars`` Unicode code points is
rewritten to its first ``head_chars`` code points, the fixed :data:`PRUNE_MARKER` and its last
``tail_chars`` code points. The rewrite is a new ``tool/result`` event carrying
``surfaceOp: {op: replace, start: seq, end: seq}`` and ``sourceEventSeqs: [seq]`` whose data
equals the original's except the result content, preceded (synchronously adjacent) by a
``compaction/prune`` shadow-price event. The original stays in the log, so the human
transcript and a replay still have it; only the model's surface changes. An emitted result is
within the threshold, so a second pass emits nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from dsh_host.sdk import (
    TOKEN_METER,
    TOOL_RESULT_PRUNER,
    ContentBlock,
    Context,
    Plugin,
    ReplaceOp,
    Session,
    TextBlock,
    TokenMeter,
    ToolResultBlock,
    ToolResultData,
)

__all__ = [
    "PRUNE_MARKER",
    "PruneResult",
    "PrunedEntry",
    "ToolResultPruneConfig",
    "ToolResultPruner",
    "ToolResultPrunerPlugin",
]

#: Substituted for every removed middle span (DSH's exact text).
PRUNE_MARKER: Final = "\n\n[... tool result middle pruned ...]\n\n"


class ToolResultPruneConfig(
    msgspec.Struct, forbid_unknown_fields=True, kw_only=True
):
    """YAML ``config:`` of a ``compaction-tool-result-pruner`` row (DSH's keys and defaults)."""

    #: prune when a result's text exceeds this many Unicode code points
    threshold_chars: int = 8192
    #: leading code points kept
    head_chars: int = 4096
    #: trailing code points kept
    tail_chars: int = 1024

    def __post_init__(self) -> None:
        if self.threshold_chars < 1:
            raise ValueError(
                f"threshold_chars ({self.threshold_chars}) must be a positive integer"
            )
        for name, value in (("head_chars", self.head_chars), ("tail_chars", self.tail_chars)):
            if value < 0:
                raise ValueError(f"{name} ({value}) must be a non-negative integer")
        emitted = self.head_chars + len(PRUNE_MARKER) + self.tail_chars
        if emitted > self.threshold_chars:
            raise ValueError(
                f"head_chars + marker + tail_chars ({emitted}) must be at most threshold_chars "
                f"({self.threshold_chars})"
            )


@dataclass(frozen=True, slots=True)
class PrunedEntry:
    """One landed replacement."""

    original_seq: int  #: the full-fidelity result, still in the log
    replacement_seq: int  #: the pruned result now on the surface
    call_id: str  #: the call both answer
    chars_before: int  #: original text size in code points
    chars_after: int  #: replacement text size in code points


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one pass did."""

    pruned: tuple[PrunedEntry, ...]  #: in surface order
    chars_removed: int  #: total code points removed


def measure_content(blocks: Sequence[ContentBlock]) -> int:
    """Code points of the text blocks (other blocks cost nothing)."""
    return sum(len(block.text) for block in blocks if isinstance(block, TextBlock))


class ToolResultPruner:
    """The ``toolResultPruner`` service."""

    def __init__(self, config: ToolResultPruneConfig, meter: TokenMeter | None = None) -> None:
        self.config = config
        self._meter = meter if meter is not None else TokenMeter()
        #: per session: (the config of the last pass, the highest surface seq it examined).
        #: An event never changes, and a replacement is a new node with a higher seq, so a
        #: node examined under the same config needs no second look (docs/decisions.md D49).
        self._examined: weakref.WeakKeyDictionary[Session, tuple[ToolResultPruneConfig, int]]
        self._examined = weakref.WeakKeyDictionary()

    measure_content = staticmethod(measure_content)

    def prune_content(self, blocks: Sequence[ContentBlock]) -> tuple[ContentBlock, ...] | None:
        """The bounded replacement of ``blocks``, or None when they are within the threshold.

        Non-text blocks keep their relative positions; the marker goes where the removed
        span starts.
        """
        total = measure_content(blocks)
        config = self.config
        if total <= config.threshold_chars:
            return None
        removed_start = config.head_chars
        removed_end = total - config.tail_chars
        out: list[ContentBlock] = []
        consumed = 0
        marked = False
        for block in blocks:
            if not isinstance(block, TextBlock):
                out.append(block)
                continue
            text = block.text
            start, end = consumed, consumed + len(text)
            head_end = min(len(text), max(0, removed_start - start))
            tail_start = min(len(text), max(0, removed_end - start))
            marker = ""
            if not marked and start < removed_end and end > removed_start:
                marker, marked = PRUNE_MARKER, True
            kept = text[:head_end] + marker + text[tail_start:]
            if kept:
                out.append(TextBlock(text=kept))
            consumed = end
        if not marked:  # cannot happen with a valid config; never emit an unbounded result
            raise AssertionError("tool-result prune: failed to locate the removed text span")
        return tuple(out)

    def prune_session(self, session: Session) -> PruneResult:
        """Prune every over-budget ``tool/result`` of one snapshot of the current surface.

        A node an earlier pass over this session examined under the same :attr:`config` is
        not read again (its event cannot have changed), so a pass reads the surface's new
        nodes only, not every page of an old log (D49). Raises when the session rejects a
        replacement; replacements committed earlier in the pass stay (each is a complete,
        valid surface transition).
        """
        events = session.events
        config = self.config
        previous = self._examined.get(session)
        seen = previous[1] if previous is not None and previous[0] is config else -1
        nodes = session.surface.nodes
        candidates = []
        for seq in nodes:
            if seq > seen:  # a node examined by an earlier pass was not over (or was replaced)
                event = events[seq]
                if event.type == "tool/result":
                    candidates.append((seq, event))
        examined = max(seen, max(nodes, default=-1))
        pruned: list[PrunedEntry] = []
        removed = 0
        for seq, event in candidates:
            data = event.data
            if not isinstance(data, ToolResultData):
                continue
            [result] = data.message.content
            if not isinstance(result, ToolResultBlock):
                continue
            content = self.prune_content(result.content)
            if content is None:
                continue
            before = measure_content(result.content)
            after = measure_content(content)
            message = msgspec.structs.replace(
                data.message, content=(msgspec.structs.replace(result, content=content),)
            )
            session.append(
                "compaction/prune",
                {
                    "shadowedRange": {"start": seq, "end": seq},
                    "shadowedSeqs": [seq],
                    "shadowedTokenCount": self._meter.estimate_message(data.message),
                },
            )
            replacement = session.append(
                "tool/result",
                msgspec.structs.replace(data, message=message),
                surface_op=ReplaceOp(start=seq, end=seq),
                source_event_seqs=[seq],
            )
            pruned.append(
                PrunedEntry(seq, replacement.seq, data.message.source.call_id, before, after)
            )
            removed += before - after
        # Only once every candidate is done: a pass that raised leaves them for the next one.
        self._examined[session] = (config, examined)
        return PruneResult(tuple(pruned), removed)


class ToolResultPrunerPlugin(Plugin):
    """Entry point ``compaction-tool-result-pruner``; provides ``toolResultPruner``.

    Injects ``tokenMeter`` (it prices each shadowed result for its ``compaction/prune``).
    """

    name = "compaction-tool-result-pruner"
    inject = ("tokenMeter",)
    provides = ("toolResultPruner",)
    Config = ToolResultPruneConfig

    def apply(self, ctx: Context, config: ToolResultPruneConfig) -> None:
        ctx.provide(TOOL_RESULT_PRUNER, ToolResultPruner(config, ctx.service(TOKEN_METER)))
