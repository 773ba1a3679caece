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

from dsh_host._jsonsafe import MAX_SAFE_INTEGER
from dsh_host._session.messages import (
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

__all__ = ["MIN_PACKED_RUN", "StreamPacker", "pack_stream", "unpack_stream"]

#: Runs of at least this many compatible deltas become one packed record.
MIN_PACKED_RUN = 3

_Delta = TextDeltaChunk | ReasoningDeltaChunk | ToolCallDeltaChunk


class StreamPacker:
    """Packs timed chunks as they arrive: :meth:`add` one ``(epoch_ms, chunk)`` at a time,
    :meth:`records` at any point (mid-stream too: an interrupted message records what came).

    Incremental so that a streamed delta costs its text and its time offset, not the chunk
    object and a tuple kept until the stream ends: a run keeps its members' texts and time
    differences, and its first :data:`MIN_PACKED_RUN` chunks in case it stays too short to
    pack. A delta joins the current run when it is of the same type, for the same block (and,
    for a tool call, the same id and name) and its time is within a safe integer of the
    previous one's.
    """

    __slots__ = ("_dt", "_head", "_id", "_index", "_kind", "_last", "_name", "_records", "_texts")

    def __init__(self) -> None:
        self._records: list[AssistantStreamRecord] = []
        self._kind: type | None = None  #: the current run's chunk type; None: no run
        self._index = self._last = 0
        self._id: str | None = None
        self._name: object = None
        self._head: list[tuple[int, _Delta]] = []
        self._dt: list[int] = []
        self._texts: list[str] = []

    def add(self, time: int, chunk: StreamChunk) -> None:
        kind = type(chunk)
        if kind is TextDeltaChunk or kind is ReasoningDeltaChunk or kind is ToolCallDeltaChunk:
            delta: _Delta = chunk  # type: ignore[assignment]
            tool = kind is ToolCallDeltaChunk
            if self._kind is not None and not (
                kind is self._kind
                and delta.index == self._index
                and abs(time - self._last) <= MAX_SAFE_INTEGER
                and (not tool or (delta.id == self._id and delta.name == self._name))  # type: ignore[union-attr]
            ):
                self._close_run()
            if self._kind is None:
                self._kind, self._index = kind, delta.index
                if tool:
                    self._id, self._name = delta.id, delta.name  # type: ignore[union-attr]
                self._head, self._dt, self._texts = [(time, delta)], [], []
            else:
                self._dt.append(time - self._last)
                if len(self._head) < MIN_PACKED_RUN:
                    self._head.append((time, delta))
            self._texts.append(delta.arguments_delta if tool else delta.text)  # type: ignore[union-attr]
            self._last = time
            return
        self._close_run()
        self._records.append(ChunkRecord(time=time, chunk=chunk))

    def records(self) -> tuple[AssistantStreamRecord, ...]:
        """The records of everything added so far, in arrival order."""
        return (*self._records, *self._run_records())

    def _run_records(self) -> list[AssistantStreamRecord]:
        kind = self._kind
        if kind is None:
            return []
        if len(self._texts) < MIN_PACKED_RUN:
            return [ChunkRecord(time=time, chunk=chunk) for time, chunk in self._head]
        time0, index = self._head[0][0], self._index
        dt, texts = tuple(self._dt), tuple(self._texts)
        if kind is ToolCallDeltaChunk:
            first: ToolCallDeltaChunk = self._head[0][1]  # type: ignore[assignment]
            return [
                ToolCallChunksRecord(
                    time0=time0, index=index, dt=dt, id=first.id, name=first.name, args=texts
                )
            ]
        if kind is TextDeltaChunk:
            return [TextChunksRecord(time0=time0, index=index, dt=dt, texts=texts)]
        return [ReasoningChunksRecord(time0=time0, index=index, dt=dt, texts=texts)]

    def _close_run(self) -> None:
        self._records.extend(self._run_records())
        self._kind = None
        self._head, self._dt, self._texts = [], [], []


def pack_stream(timed: Iterable[tuple[int, StreamChunk]]) -> tuple[AssistantStreamRecord, ...]:
    """Pack ``(epoch_ms, chunk)`` pairs, in arrival order, into stream records."""
    packer = StreamPacker()
    add = packer.add
    for time, chunk in timed:
        add(time, chunk)
    return packer.records()


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
