"""BlockAssembler: the one algorithm that turns stream chunks into an assistant message.

The agent loop feeds every chunk it receives (and logs) to an assembler, then
reads :meth:`BlockAssembler.message` when the stream ended, or
:meth:`BlockAssembler.interrupted_message` when cancellation cut it short.
Having exactly one assembly algorithm is what lets a log be replayed: the
message in the log and the message rebuilt from the logged chunks are the
same by construction -- up to the tool-call ids the agent loop took over
(an empty or repeated provider id is replaced when the message is logged and
kept on the block as ``providerId``; see :mod:`dsh_host._agent.call_ids`).

Rules (DSH ``BlockAssembler``):

- partial blocks are kept by index, in first-seen order; ``block-start``
  creates one (a duplicate start is ignored);
- ``text-delta`` / ``reasoning-delta`` append text, creating a partial of that
  type if none exists (delta-only protocols work);
- ``tool-call-delta`` sets the id, sets the name when present, appends arguments;
- ``block-end`` stores the authoritative block; the first close wins and
  deltas after it are ignored (a misbehaving adapter cannot corrupt a
  completed block);
- ``usage`` keeps the latest usage; ``finish`` stores the reason and replay state;
  a stream without ``finish`` counts as ``stop``;
- an open block assembles from its deltas (an open tool call without an id gets
  ``call-<index>``; an open block of an unknown type cannot be assembled);
- on ``max-tokens``, tool calls are dropped (a truncated call is never executed)
  and the replay envelope's per-block entries are pruned at the same positions;
  an envelope whose ``blocks`` do not align one-to-one is discarded.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import msgspec

from dsh_host._jsonsafe import freeze_json
from dsh_host._session.messages import (
    AssistantMessage,
    AssistantStreamRecord,
    BlockEndChunk,
    BlockStartChunk,
    ContentBlock,
    FinishChunk,
    FinishReason,
    MaxTokensFinish,
    ModelSource,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StopFinish,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    UsageChunk,
    block_type,
    new_message_id,
)

from .records import StreamPacker

__all__ = ["BlockAssembler", "IncompleteBlockError", "assemble"]


class IncompleteBlockError(ValueError):
    """An open block of a type the assembler cannot finish from deltas alone."""


def _block_type(block: ContentBlock) -> str:
    return block_type(block)


class _Partial:
    __slots__ = ("args", "block", "block_type", "call_id", "call_name", "text")

    def __init__(self, block_type: str) -> None:
        self.block_type = block_type
        self.text: list[str] = []
        self.args: list[str] = []
        self.call_id: str | None = None
        self.call_name: str | None = None
        #: set by ``block-end``: authoritative, and freezes the partial
        self.block: ContentBlock | None = None


class BlockAssembler:
    """Incrementally assembles :data:`StreamChunk` values into content blocks.

    Feed chunks with :meth:`push` (optionally with their arrival time in epoch
    ms, so :meth:`stream_records` can produce the compact timed stream an
    ``assistant/message`` embeds). Read :meth:`blocks`, :attr:`usage`,
    :attr:`finish`, :attr:`replay_state`, or build the message with
    :meth:`message`.
    """

    def __init__(self) -> None:
        self._partials: dict[int, _Partial] = {}
        self._usage: TokenUsage | None = None
        self._finish: FinishReason | None = None
        self._replay_state: Any = None
        self._packer = StreamPacker()  #: the timed stream, packed as it arrives
        self._count = 0

    # -- feeding ----------------------------------------------------------------
    def push(self, chunk: StreamChunk, time_ms: int | None = None) -> None:
        """Feed one chunk, in stream order.

        ``time_ms`` (epoch milliseconds) records the chunk for
        :meth:`stream_records`; chunks pushed without a time are assembled but
        not recorded.
        """
        self._count += 1
        if time_ms is not None:
            self._packer.add(time_ms, chunk)
        if isinstance(chunk, TextDeltaChunk):  # most chunks: the lookup inlined
            partial = self._partials.get(chunk.index) or self._ensure(chunk.index, "text")
            if partial.block is None:
                partial.text.append(chunk.text)
        elif isinstance(chunk, ToolCallDeltaChunk):
            partial = self._ensure(chunk.index, "tool-call")
            if partial.block is None:
                partial.call_id = chunk.id
                if isinstance(chunk.name, str) and chunk.name:
                    partial.call_name = chunk.name
                partial.args.append(chunk.arguments_delta)
        elif isinstance(chunk, ReasoningDeltaChunk):
            partial = self._ensure(chunk.index, "reasoning")
            if partial.block is None:
                partial.text.append(chunk.text)
        elif isinstance(chunk, BlockStartChunk):
            self._ensure(chunk.index, chunk.block_type)
        elif isinstance(chunk, BlockEndChunk):
            partial = self._ensure(chunk.index, _block_type(chunk.block))
            if partial.block is None:  # first close wins
                partial.block = chunk.block
        elif isinstance(chunk, UsageChunk):
            self._usage = chunk.usage
        elif isinstance(chunk, FinishChunk):
            self._finish = chunk.reason
            self._replay_state = (
                None if chunk.replay_state is msgspec.UNSET else chunk.replay_state
            )
        else:
            raise TypeError(
                f"BlockAssembler.push got {type(chunk).__name__}, which is not a stream chunk "
                "(block-start, text-delta, reasoning-delta, tool-call-delta, block-end, usage, "
                "finish)"
            )

    def _ensure(self, index: int, block_type: str) -> _Partial:
        partial = self._partials.get(index)
        if partial is None:
            partial = _Partial(block_type)
            self._partials[index] = partial
        return partial

    # -- results ------------------------------------------------------------------
    @property
    def chunk_count(self) -> int:
        """How many chunks were pushed."""
        return self._count

    @property
    def usage(self) -> TokenUsage | None:
        """The latest ``usage`` chunk's usage; None until one arrived."""
        return self._usage

    @property
    def finish(self) -> FinishReason:
        """The ``finish`` chunk's reason; ``stop`` when the stream ended without one."""
        return self._finish if self._finish is not None else StopFinish()

    @property
    def finished(self) -> bool:
        """True once a ``finish`` chunk arrived."""
        return self._finish is not None

    @property
    def replay_state(self) -> Any:
        """The adapter's replay envelope, pruned in step with :meth:`blocks` (None if absent
        or if its per-block entries do not align with the blocks)."""
        return self._assembled()[1]

    def blocks(self) -> tuple[ContentBlock, ...]:
        """Every block seen, in stream order (tool calls dropped on ``max-tokens``)."""
        return self._assembled()[0]

    def interrupted_blocks(self) -> tuple[ContentBlock, ...]:
        """The prefix a cancelled stream can keep: text and reasoning blocks, open or
        closed, whose text is not whitespace-only, in order. Tool calls are dropped:
        interruption precedes dispatch, and keeping one would need a made-up result."""
        kept: list[ContentBlock] = []
        for index, partial in self._partials.items():
            block_type = (
                _block_type(partial.block) if partial.block is not None else partial.block_type
            )
            if block_type not in ("text", "reasoning"):
                continue
            block = self._assemble(partial, index)
            if isinstance(block, (TextBlock, ReasoningBlock)) and block.text.strip():
                kept.append(block)
        return tuple(kept)

    def message(
        self, *, provider: str, model: str, message_id: str | None = None
    ) -> AssistantMessage:
        """The assembled assistant message (source ``model``, replay state included)."""
        blocks, replay = self._assembled()
        return AssistantMessage(
            id=message_id or new_message_id(),
            content=blocks,
            source=_model_source(provider, model, replay),
        )

    def interrupted_message(
        self, *, provider: str, model: str, message_id: str | None = None
    ) -> AssistantMessage | None:
        """The message of a stream cut short by cancellation, or None when nothing
        worth keeping streamed (the loop then appends no ``assistant/message``)."""
        blocks = self.interrupted_blocks()
        if not blocks:
            return None
        return AssistantMessage(
            id=message_id or new_message_id(),
            content=blocks,
            source=ModelSource(provider=provider, model=model),
        )

    def stream_records(self) -> tuple[AssistantStreamRecord, ...]:
        """The compact timed stream of the chunks pushed with a time (for the
        ``stream`` field of ``assistant/message``); see :func:`~.records.pack_stream`."""
        return self._packer.records()

    # -- internals ----------------------------------------------------------------
    def _assemble(self, partial: _Partial, index: int) -> ContentBlock:
        if partial.block is not None:
            return partial.block
        if partial.block_type == "text":
            return TextBlock(text="".join(partial.text))
        if partial.block_type == "reasoning":
            return ReasoningBlock(text="".join(partial.text))
        if partial.block_type == "tool-call":
            return ToolCallBlock(
                id=partial.call_id if partial.call_id is not None else f"call-{index}",
                name=partial.call_name if partial.call_name is not None else "",
                arguments="".join(partial.args),
            )
        raise IncompleteBlockError(
            f'cannot assemble incomplete block of type "{partial.block_type}" at index {index} '
            "(the stream opened it but never sent its block-end)"
        )

    def _assembled(self) -> tuple[tuple[ContentBlock, ...], Any]:
        """The one keep/drop decision shared by the blocks and the replay envelope."""
        every = [self._assemble(partial, index) for index, partial in self._partials.items()]
        keep: list[bool] | None = None
        if isinstance(self._finish, MaxTokensFinish):
            keep = [not isinstance(block, ToolCallBlock) for block in every]
        if keep is None:
            blocks = tuple(every)
        else:
            blocks = tuple(b for b, k in zip(every, keep, strict=True) if k)
        envelope = self._replay_state
        if not isinstance(envelope, Mapping) or "blocks" not in envelope:
            return blocks, envelope
        entries = envelope["blocks"]
        if not isinstance(entries, Sequence) or isinstance(entries, str):
            return blocks, None
        if len(entries) != len(every):
            return blocks, None
        if keep is None or len(blocks) == len(every):
            return blocks, envelope
        pruned = {
            "response": envelope.get("response"),
            "blocks": [entry for entry, k in zip(entries, keep, strict=True) if k],
        }
        return blocks, freeze_json(pruned, "replay state")


def _model_source(provider: str, model: str, replay: Any) -> ModelSource:
    if replay is None:
        return ModelSource(provider=provider, model=model)
    return ModelSource(provider=provider, model=model, replay_state=replay)


async def assemble(
    stream: AsyncIterator[StreamChunk], assembler: BlockAssembler | None = None
) -> BlockAssembler:
    """Drain ``stream`` into an assembler (closing the stream however this ends).

    A convenience for side calls and tests; the agent loop feeds its own
    assembler because it logs each chunk as it arrives.
    """
    target = assembler if assembler is not None else BlockAssembler()
    async with aclosing(_as_generator(stream)) as chunks:
        async for chunk in chunks:
            target.push(chunk)
    return target


async def _as_generator(
    stream: AsyncIterator[StreamChunk],
) -> AsyncGenerator[StreamChunk, None]:
    """Relay ``stream`` and close it on exit, even if it has no ``aclose``."""
    try:
        async for chunk in stream:
            yield chunk
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
