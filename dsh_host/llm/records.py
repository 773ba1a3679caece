"""The compact timed stream an ``assistant/message`` embeds (DSH v3 ``data.stream``).

A v3 log does not store one event per stream chunk; each assistant message
carries its raw stream as a list of records:

- ``{type: "chunk", time, chunk}`` for block-start, block-end, usage, finish and
  for deltas that are not part of a long enough run;
- ``{type: "text-chunks" | "reasoning-chunks", time0, index, dt, texts}`` and
  ``{type: "tool-call-chunks", time0, index, dt, id, name?, args}`` for runs of
  consecutive deltas of one block: member *k* arrived at ``time0 + sum(dt[:k])``.

Packing is lossless (:func:`unpack_stream` gives back exactly the timed chunks
that went in) and readers are layout-blind, so the minimum run length is a
writer's choice; we pack runs of :data:`MIN_PACKED_RUN` or more, the same rule
as the v0/v1 top-level chunk rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from dsh_host.jsonsafe import MAX_SAFE_INTEGER
from dsh_host.session.messages import (
    AssistantStreamRecord,
    ChunkRecord,
    ReasoningChunksRecord,
    ReasoningDeltaChunk,
    StreamChunk,
    TextChunksRecord,
    TextDeltaChunk,
    ToolCallChunksRecord,
    ToolCallDeltaChunk,
)

__all__ = ["MIN_PACKED_RUN", "pack_stream", "unpack_stream"]

#: Runs of at least this many compatible deltas become one packed record.
MIN_PACKED_RUN = 3

_Delta = TextDeltaChunk | ReasoningDeltaChunk | ToolCallDeltaChunk


def _packed(run: list[tuple[int, _Delta]]) -> AssistantStreamRecord:
    time0, first = run[0]
    dt = tuple(run[k + 1][0] - run[k][0] for k in range(len(run) - 1))
    if isinstance(first, ToolCallDeltaChunk):
        args = tuple(chunk.arguments_delta for _, chunk in run)  # type: ignore[union-attr]
        return ToolCallChunksRecord(
            time0=time0, index=first.index, dt=dt, id=first.id, name=first.name, args=args
        )
    texts = tuple(chunk.text for _, chunk in run)  # type: ignore[union-attr]
    if isinstance(first, TextDeltaChunk):
        return TextChunksRecord(time0=time0, index=first.index, dt=dt, texts=texts)
    return ReasoningChunksRecord(time0=time0, index=first.index, dt=dt, texts=texts)


def pack_stream(timed: Iterable[tuple[int, StreamChunk]]) -> tuple[AssistantStreamRecord, ...]:
    """Pack ``(epoch_ms, chunk)`` pairs, in arrival order, into stream records."""
    records: list[AssistantStreamRecord] = []
    run: list[tuple[int, _Delta]] = []

    def flush() -> None:
        if len(run) >= MIN_PACKED_RUN:
            records.append(_packed(run))
        else:
            records.extend(ChunkRecord(time=time, chunk=chunk) for time, chunk in run)
        run.clear()

    # One pass, once per streamed chunk: the run's key is kept in locals. A delta joins the
    # run when it is of the same type, for the same block (and, for a tool call, the same id
    # and name) and its time is within a safe integer of the previous one's.
    last_type: type | None = None
    last_index = last_time = 0
    last_id: str | None = None
    last_name: object = None
    for time, chunk in timed:
        kind = type(chunk)
        if kind is TextDeltaChunk or kind is ReasoningDeltaChunk or kind is ToolCallDeltaChunk:
            delta: _Delta = chunk  # type: ignore[assignment]
            tool = kind is ToolCallDeltaChunk
            if run and not (
                kind is last_type
                and delta.index == last_index
                and abs(time - last_time) <= MAX_SAFE_INTEGER
                and (not tool or (delta.id == last_id and delta.name == last_name))  # type: ignore[union-attr]
            ):
                flush()
            run.append((time, delta))
            last_type, last_index, last_time = kind, delta.index, time
            if tool:
                last_id, last_name = delta.id, delta.name  # type: ignore[union-attr]
            continue
        flush()
        records.append(ChunkRecord(time=time, chunk=chunk))
    flush()
    return tuple(records)


def unpack_stream(records: Sequence[AssistantStreamRecord]) -> list[tuple[int, StreamChunk]]:
    """Expand stream records back into ``(epoch_ms, chunk)`` pairs.

    Raises ``ValueError`` naming the record position when a packed record is
    inconsistent (empty members, ``dt`` of the wrong length).
    """
    out: list[tuple[int, StreamChunk]] = []
    for position, record in enumerate(records):
        if isinstance(record, ChunkRecord):
            out.append((record.time, record.chunk))
            continue
        members: tuple[str, ...]
        if isinstance(record, ToolCallChunksRecord):
            members = record.args
        else:
            members = record.texts
        tag = type(record).__struct_config__.tag
        if not members:
            raise ValueError(f"stream record {position} ({tag}) has no members")
        if len(record.dt) != len(members) - 1:
            raise ValueError(
                f"stream record {position} ({tag}): dt length {len(record.dt)} does not match "
                f"{len(members)} members"
            )
        time = record.time0
        for k, member in enumerate(members):
            if k:
                time += record.dt[k - 1]
            chunk: StreamChunk
            if isinstance(record, ToolCallChunksRecord):
                if record.name is msgspec.UNSET:
                    chunk = ToolCallDeltaChunk(
                        index=record.index, id=record.id, arguments_delta=member
                    )
                else:
                    chunk = ToolCallDeltaChunk(
                        index=record.index, id=record.id, name=record.name, arguments_delta=member
                    )
            elif isinstance(record, TextChunksRecord):
                chunk = TextDeltaChunk(index=record.index, text=member)
            else:
                chunk = ReasoningDeltaChunk(index=record.index, text=member)
            out.append((time, chunk))
    return out
