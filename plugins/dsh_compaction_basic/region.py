"""Range selection and the one log-recorded compaction transaction (DSH ``region.ts``).

The durable lock is the bracket itself: ``compaction/start`` is appended before the summary
request yields, and every later outcome makes exactly one ``compaction/end`` attempt. The only
surface mutation — one ``user/message`` replacing the selected span — sits inside the bracket,
right after the ``compaction/summary`` that records it, so a crash before ``compaction/end``
leaves either no replacement at all or a detectable unmatched start, never a close that claims a
replacement the surface does not have.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

import msgspec

from dsh_host.sdk import (
    AbortError,
    CompactionResult,
    LogFold,
    ManualCompactionError,
    ReplaceOp,
    Session,
    SessionEvent,
    TokenMeasurement,
    TokenMeter,
    TurnStart,
    UserMessage,
    balanced_cuts,
    compact_checkpoint_source,
    derive_event_message,
    error_chain,
    is_compact_checkpoint_source,
    json_enc_hook,
    new_message_id,
)

from .summarizer import SummaryResult, frame_summary

__all__ = [
    "SurfaceChangedError",
    "assert_no_active_compaction",
    "compact_surface_region",
    "select_compactable_range",
]

#: Prepares the summary of the replayed messages (the backend's one hook).
Summarize = Callable[[Sequence[Any]], Awaitable[SummaryResult]]


class SurfaceChangedError(Exception):
    """The surface the summary was built from changed before it could replace it."""


def _head(session: Session) -> int:
    """Index of the first compactable node: leading ``system/message`` nodes stay at the head."""
    events = session.events
    nodes = session.surface.nodes
    index = 0
    while index < len(nodes) and events[nodes[index]].type == "system/message":
        index += 1
    return index


def select_compactable_range(
    session: Session, measurement: TokenMeasurement, retain_tokens: int
) -> tuple[int, int] | None:
    """The oldest whole units to compact, keeping at least ``retain_tokens`` of recent tail.

    Never splits a tool call from its result, never includes the system prompt node; None
    when no useful span is left (nothing, or only the previous checkpoint).
    """
    nodes = session.surface.nodes
    priced = measurement.nodes
    if len(priced) != len(nodes) or any(p.seq != s for p, s in zip(priced, nodes, strict=True)):
        raise SurfaceChangedError(
            "compaction: token-meter surface does not match the current session surface"
        )
    head = _head(session)
    keep = len(nodes)
    kept = 0
    for index in range(len(nodes) - 1, -1, -1):
        kept += priced[index].tokens
        keep = index
        if kept >= retain_tokens:
            break
    cuts = balanced_cuts(session, nodes)
    while keep > head and not cuts[keep]:
        keep -= 1
    events = session.events
    for index in range(head, keep):  # a system prompt node later on stays out of the span
        if events[nodes[index]].type == "system/message":
            keep = index
            while keep > head and not cuts[keep]:
                keep -= 1
            break
    if keep <= head:
        return None
    if keep - head == 1:
        only = events[nodes[head]]
        if only.type == "user/message" and is_compact_checkpoint_source(only.data.source):
            return None  # a lone checkpoint: summarizing it again frees nothing
    return nodes[head], nodes[keep - 1]


@dataclass(frozen=True, slots=True)
class _Entry:
    open_turn: int | None
    live_start: SessionEvent | None  #: an unmatched compaction/start after the newest end-seed


#: (open turn, the newest compaction/start unless a compaction/end followed it, the newest
#: session/end-seed's seq), folded in log order.
_EntryFold = tuple[int | None, SessionEvent | None, int | None]


def _entry_step(state: _EntryFold, event: SessionEvent) -> _EntryFold:
    kind = event.type
    if kind == "turn/start":
        turn = event.data.turn if isinstance(event.data, TurnStart) else None
        return turn, state[1], state[2]
    if kind == "turn/end":
        return None, state[1], state[2]
    if kind == "compaction/start":
        return state[0], event, state[2]
    if kind == "compaction/end":
        return state[0], None, state[2]
    if kind == "session/end-seed":
        return state[0], state[1], event.seq
    return state


#: Read before every automatic compaction check (every step): kept per session and extended
#: by the new events only, never a scan back through the log (a turn of N steps made that
#: scan O(N) a step: the turn's start is as far back as the turn is long).
_ENTRY: Final = LogFold[_EntryFold]((None, None, None), _entry_step)


def _entry_state(session: Session) -> _Entry:
    open_turn, unmatched, end_seed = _ENTRY.value(session)
    if unmatched is not None and end_seed is not None and end_seed > unmatched.seq:
        unmatched = None  # stale: it belongs to an earlier process lifecycle
    return _Entry(open_turn, unmatched)


def assert_no_active_compaction(session: Session, stage: str) -> None:
    """Raise ``busy`` while a live ``compaction/start`` has no ``compaction/end``."""
    if _entry_state(session).live_start is not None:
        raise ManualCompactionError(
            "busy",
            f"{stage}: compaction already in progress; the session compaction lock is already "
            "active",
        )


def _validate(session: Session, start: int, end: int) -> tuple[int, int]:
    nodes = session.surface.nodes
    try:
        i = nodes.index(start)
    except ValueError:
        raise ValueError(f"compactRegion: start seq {start} not found in surface") from None
    try:
        j = nodes.index(end)
    except ValueError:
        raise ValueError(f"compactRegion: end seq {end} not found in surface") from None
    if i > j:
        raise ValueError(
            f"compactRegion: start seq {start} (position {i}) is after end seq {end} "
            f"(position {j}) on the surface"
        )
    cuts = balanced_cuts(session, nodes)
    if not cuts[i]:
        raise ValueError(
            f"compactRegion: start seq {start} is not a balanced boundary (would split a "
            "step's tool-call/result pair)"
        )
    if not cuts[j + 1]:
        raise ValueError(
            f"compactRegion: end seq {end} is not a balanced boundary (would split a step, or "
            "the step is still open)"
        )
    return i, j


def _plain(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=json_enc_hook)


async def compact_surface_region(
    session: Session,
    meter: TokenMeter,
    summarize: Summarize,
    start: int,
    end: int,
    *,
    owner: Literal["current-turn"] | None,
    source_command_id: str | None = None,
    flush: Callable[[], Awaitable[None]] | None = None,
) -> CompactionResult:
    """Run the bracketed transaction over surface nodes ``start..end`` (see the module doc).

    ``owner`` ``"current-turn"`` (automatic) stamps the open turn and requires the whole
    surface unchanged across the summary; None (manual) requires no open turn, stamps
    ``turn: null``, requires only the selected span unchanged, and awaits ``flush`` once the
    bracket is closed (successfully or not) before returning.
    """
    i, j = _validate(session, start, end)
    assert_no_active_compaction(session, "compaction")
    entry = _entry_state(session)
    if owner is None:
        if entry.open_turn is not None:
            raise ManualCompactionError(
                "busy", "manual compaction: the session already has an open turn"
            )
        turn: int | None = None
    else:
        if entry.open_turn is None:
            raise ValueError(
                "compactRegion: no open turn — automatic compaction events must be enclosed "
                "in a turn"
            )
        turn = entry.open_turn
    compaction_id = str(uuid.uuid4())
    lifecycle: dict[str, Any] = {"compactionId": compaction_id}
    if source_command_id is not None:
        lifecycle["sourceCommandId"] = source_command_id
    lifecycle["turn"] = turn
    start_event = session.append("compaction/start", lifecycle)

    stage: Literal["summary", "commit"] = "summary"
    failure: BaseException | None = None
    closed = False
    result: CompactionResult | None = None
    try:
        measured = meter.measure(session)
        shadowed = tuple(session.surface.nodes[i : j + 1])
        selected = measured.nodes[i : j + 1]
        if tuple(node.seq for node in selected) != shadowed:
            raise SurfaceChangedError("compaction: selected surface changed before summarization")
        shadowed_tokens = sum(node.tokens for node in selected)
        events = session.events
        replay = [
            message
            for seq in session.surface.nodes[: j + 1]
            if (message := derive_event_message(events[seq])) is not None
        ]
        summary = await summarize(replay)
        checkpoint = UserMessage(
            id=new_message_id(),
            content=frame_summary(summary.summary),
            source=compact_checkpoint_source(compaction_id, source_command_id),
        )
        framed = meter.estimate_message(checkpoint)
        if framed >= shadowed_tokens:
            raise ValueError(
                f"summary is not smaller than the shadowed content ({framed} estimated framed "
                f"tokens >= {shadowed_tokens})"
            )
        _assert_stable(session, meter, owner, measured, shadowed, i, j)
        stage = "commit"
        record: dict[str, Any] = {"compactionId": compaction_id}
        if source_command_id is not None:
            record["sourceCommandId"] = source_command_id
        record.update(
            summary=_plain(summary.summary),
            rawOutput=_plain(summary.raw_output),
            llmStreamCall=True,
            shadowedRange={"start": start, "end": end},
            shadowedSeqs=list(shadowed),
            shadowedTokenCount=shadowed_tokens,
            provider=summary.provider,
            model=summary.model,
            maxTokens=summary.max_tokens,
        )
        if summary.usage is not None:
            record["usage"] = _plain(summary.usage)
        summary_event = session.append("compaction/summary", record)
        session.append(
            "user/message",
            checkpoint,
            surface_op=ReplaceOp(start=start, end=end),
            source_event_seqs=[start_event.seq, summary_event.seq, *shadowed],
        )
        end_event = session.append("compaction/end", lifecycle)
        closed = True
        result = CompactionResult(
            compaction_id=compaction_id,
            start_seq=start_event.seq,
            summary_seq=summary_event.seq,
            end_seq=end_event.seq,
            summary=summary.summary,
            shadowed_range=(start, end),
            shadowed_seqs=shadowed,
            shadowed_token_count=shadowed_tokens,
            source_command_id=source_command_id,
        )
    except BaseException as error:
        failure = error
        if not closed:
            try:
                session.append("compaction/end", {**lifecycle, "error": error_chain(error)})
                closed = True
            except Exception as close_error:  # the unmatched start stays the busy signal
                failure, stage = close_error, "commit"
    persisted: BaseException | None = None
    if closed and flush is not None:
        try:
            await flush()
        except Exception as error:
            persisted = error
    if failure is not None:
        if owner is None and isinstance(failure, Exception):
            _raise_manual(failure, stage)
        raise failure
    if persisted is not None:
        raise ManualCompactionError(
            "persistence", "manual compaction durability checkpoint failed"
        ) from persisted
    assert result is not None
    return result


def _assert_stable(
    session: Session,
    meter: TokenMeter,
    owner: Literal["current-turn"] | None,
    before: TokenMeasurement,
    shadowed: tuple[int, ...],
    i: int,
    j: int,
) -> None:
    now = meter.measure(session)
    if owner is not None:
        if now.nodes != before.nodes:
            raise SurfaceChangedError("compaction: session surface changed during summarization")
        return
    nodes = session.surface.nodes
    try:
        a, b = _validate(session, shadowed[0], shadowed[-1])
    except ValueError as error:
        raise SurfaceChangedError(
            "compaction: the selected span is no longer a valid replacement target"
        ) from error
    if tuple(nodes[a : b + 1]) != shadowed:
        raise SurfaceChangedError("compaction: the selected span changed during summarization")
    if now.nodes[a : b + 1] != before.nodes[i : j + 1]:
        raise SurfaceChangedError(
            "compaction: the selected span was rewritten during summarization"
        )


def _raise_manual(failure: Exception, stage: str) -> NoReturn:
    if isinstance(failure, AbortError | ManualCompactionError):
        raise failure
    if stage == "commit":
        raise ManualCompactionError(
            "commit", "manual compaction did not commit cleanly"
        ) from failure
    if isinstance(failure, SurfaceChangedError):
        raise ManualCompactionError(
            "changed", "the compacted history changed during manual compaction"
        ) from failure
    raise ManualCompactionError(
        "summary", "manual compaction could not produce a smaller summary"
    ) from failure

