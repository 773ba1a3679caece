"""The provider-neutral halves of an adapter's ``serialize.py`` and ``translate.py``.

Every provider speaks its own wire, but some steps of the conversion are the same decision
on every wire, and each has one owner here so a fix lands once:

- request side: the text of a block list, the refusal of image content (no adapter sends
  images yet), a tool result's text (``(no output)`` when empty: providers refuse an empty
  result), the per-block replay entries of one of our own messages, a request field or the
  row's default, and the refusal of an effort the adapter does not know;
- answer side: a token count as the wire gave it, an event block that accumulates deltas and
  closes into the authoritative dsh block, the empty-answer rule (a completed answer without
  a block is ``EMPTY_RESPONSE``, which the retry policy treats as retryable), and the end of
  an answer with its replay envelope.

What stays in the adapter is what differs between wires: which events open and extend a
block, how stop reasons and usage are spelled, and what goes into a block's replay entry.
The chat-completions translator keeps its own block type on purpose: its calls are matched
by index or id across deltas and a surrogate half can wait for its partner, and a call that
streamed no arguments stays ``""`` there (the SDK adapters' APIs define that as ``{}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from dsh_host._jsonsafe import freeze_json
from dsh_host._session import (
    AssistantMessage,
    BlockEndChunk,
    ContentBlock,
    ErrorFinish,
    FinishChunk,
    FinishReason,
    LlmFailure,
    ReasoningBlock,
    StopFinish,
    StreamChunk,
    TextBlock,
    TokenUsage,
    ToolCallBlock,
    UsageChunk,
)
from dsh_host._session.messages import ImageBlock, ToolResultBlock

from .attachments import is_attachment, unsendable
from .errors import EMPTY_RESPONSE_CODE, LlmError

__all__ = [
    "BlockKind",
    "EventBlock",
    "answer_end",
    "completed_reason",
    "disjoint_usage",
    "or_default",
    "refuse_images",
    "replay_entries",
    "stopped",
    "text_of",
    "token_count",
    "tool_result_text",
    "unsupported_effort",
]

T = TypeVar("T")

BlockKind = Literal["text", "reasoning", "tool-call"]


# -- request side ---------------------------------------------------------------------------
def text_of(blocks: Iterable[ContentBlock]) -> str:
    """The concatenated text of the text blocks among ``blocks``."""
    return "".join(block.text for block in blocks if isinstance(block, TextBlock))


def tool_result_text(result: ToolResultBlock) -> str:
    """A tool result's text as sent back; ``(no output)`` for an empty one (an empty result
    is refused by some providers, and the model reads the placeholder better than nothing),
    ``(image)`` for one that holds only images."""
    text = text_of(result.content)
    if text:
        return text
    return "(image)" if any(is_attachment(block) for block in result.content) else "(no output)"


def refuse_images(
    blocks: Iterable[ContentBlock], role: str, adapter: str, *, attachments: bool = False
) -> None:
    """Refuse image and file content the adapter cannot send, before any request: dropping
    one silently would change what the model is asked. With ``attachments``, a user
    message's own images and documents, and the images of a tool result, pass (the adapter
    sends them, read with :func:`~dsh_host._llm.attachments.attachment_of`) when the log holds
    their bytes; a document inside a tool result is refused still (no tool makes one)."""
    for block in blocks:
        if is_attachment(block):
            if attachments and (role == "user" or isinstance(block, ImageBlock)):
                reason = unsendable(block)
                if reason is None:
                    continue
                raise LlmError(
                    f"the {adapter} adapter cannot send a {role} message's {reason}",
                    "UNSUPPORTED_CONTENT",
                )
            raise LlmError(
                f"the {adapter} adapter does not send {'file' if attachments else 'image or file'}"
                f" content in a {role} message; remove it or use a text description",
                "UNSUPPORTED_CONTENT",
            )
        if isinstance(block, ToolResultBlock):
            refuse_images(block.content, "tool result", adapter, attachments=attachments)


def replay_entries(message: AssistantMessage) -> Sequence[Any]:
    """The per-block replay entries of one of our messages (empty when it has none).

    An envelope whose ``blocks`` do not align one-to-one with the content is not ours to read
    (the assembler discards such an envelope too): a block without its entry is sent without
    provider data, never with forged data.
    """
    state = message.source.replay_state
    if state is msgspec.UNSET or not isinstance(state, Mapping):
        return ()
    entries = state.get("blocks")
    if not isinstance(entries, Sequence) or len(entries) != len(message.content):
        return ()
    return entries


def or_default(value: T | msgspec.UnsetType, default: T) -> T:
    """A request config field, or the row's default when the request leaves it unset."""
    return default if value is msgspec.UNSET else value


def unsupported_effort(adapter: str, effort: str, supported: Sequence[str]) -> LlmError:
    """The refusal of a reasoning effort the adapter cannot express on its wire."""
    return LlmError(
        f'the {adapter} adapter does not support reasoning effort "{effort}" '
        f"(supported: {', '.join(supported)})",
        "UNSUPPORTED_REASONING_EFFORT",
    )


# -- answer side ----------------------------------------------------------------------------
def token_count(value: Any) -> int | None:
    """A token count as the wire gave it; anything but a non-negative int is no count."""
    return value if type(value) is int and value >= 0 else None


@dataclass(slots=True)
class EventBlock:
    """One provider block as it streams: its dsh index, its deltas so far, and whether its
    ``block-end`` was emitted. Subclasses add what their wire must get back (``replay``)."""

    index: int
    kind: BlockKind
    parts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    closed: bool = False

    def close(self) -> ContentBlock:
        """The authoritative dsh block; a tool call that streamed no arguments took none,
        so its input is the empty object."""
        text = "".join(self.parts)
        if self.kind == "text":
            return TextBlock(text=text)
        if self.kind == "reasoning":
            return ReasoningBlock(text=text)
        return ToolCallBlock(id=self.call_id, name=self.name, arguments=text or "{}")

    def replay(self) -> dict[str, str] | None:
        """This block's entry in the replay envelope (None: nothing to send back)."""
        return None


def disjoint_usage(
    total_input: int, output: int, cached: int | None, reasoning: int | None
) -> TokenUsage:
    """Usage from a wire whose input count includes the cached prompt tokens (OpenAI's
    convention): dsh's counts are disjoint, so the cached part is taken out of the input."""
    extra: dict[str, int] = {}
    if cached is not None:
        extra["cache_read_tokens"] = cached
    if reasoning is not None:
        extra["reasoning_tokens"] = reasoning
    return TokenUsage(
        input_tokens=max(total_input - (cached or 0), 0), output_tokens=output, **extra
    )


def stopped(reason: str) -> ErrorFinish:
    """The finish of a stop reason dsh has no name for (a content filter, say): an error
    finish naming it, its code the reason upper-cased."""
    return ErrorFinish(
        failure=LlmFailure(message=f"model stopped: {reason}", code=reason.upper() or "UNKNOWN")
    )


def completed_reason(reason: FinishReason, has_blocks: bool) -> FinishReason:
    """A normal stop with no block is not an answer: ``EMPTY_RESPONSE`` (retryable)."""
    if isinstance(reason, StopFinish) and not has_blocks:
        return ErrorFinish(
            failure=LlmFailure(
                message="model returned a completed response with no content",
                code=EMPTY_RESPONSE_CODE,
            )
        )
    return reason


def answer_end(
    blocks: Sequence[EventBlock],
    usage: TokenUsage | None,
    reason: FinishReason,
    response_id: str | None,
) -> list[StreamChunk]:
    """The last chunks of an answer: ``block-end`` for every block still open, ``usage``, and
    the one ``finish``, carrying ``{"response": {"id"}, "blocks": [one entry per block]}``
    when any block has provider data the next request must send back."""
    out: list[StreamChunk] = [
        BlockEndChunk(index=block.index, block=block.close())
        for block in blocks
        if not block.closed
    ]
    if usage is not None:
        out.append(UsageChunk(usage=usage))
    reason = completed_reason(reason, bool(blocks))
    entries = [block.replay() for block in blocks]
    if any(entry is not None for entry in entries):
        envelope = {"response": {"id": response_id}, "blocks": entries}
        out.append(FinishChunk(reason=reason, replay_state=freeze_json(envelope, "replay")))
    else:
        out.append(FinishChunk(reason=reason))
    return out
