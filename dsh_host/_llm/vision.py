"""Which models take images, and what a model that takes none is sent instead (D31).

A model route says whether its model reads images (and PDFs): ``ModelInfo.vision``, set by the
provider row's ``vision`` key, else by the model's family (:func:`family_takes_images`). For a
model that takes none:

- a new prompt's attachments are refused before anything is logged (the agent checks, with
  :func:`refusal`, naming the model and what to do), so no tokens are spent on a turn the
  model cannot read;
- every image or document already in the history (a tool result's image, a prompt from when
  the session used another model) is sent as a text note in its place (:func:`without_images`,
  called by the LLM runtime before the adapter, with the positions its per-session index
  found, so a request costs O(new messages)): the turn goes on and the model is told what it
  cannot see. The log keeps the image: a later request to a model that takes images sends it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import msgspec

from dsh_host._session import ContentBlock, Message, TextBlock
from dsh_host._session.messages import ImageBlock, ToolResultBlock

from .attachments import _record, is_attachment
from .types import LlmRequest, ModelInfo

__all__ = ["carries_attachment", "family_takes_images", "note_for", "refusal", "without_images"]

#: Model families known to take text only (matched on the id, lowercased, after any
#: ``vendor/`` prefix of a gateway such as LiteLLM). Any other model is taken to read images:
#: a wrong "yes" costs one refused request (the provider's own error), a wrong "no" would keep
#: a capable model from ever seeing one; a row's ``vision`` overrides either way.
_TEXT_ONLY = re.compile(
    r"^(?:deepseek-(?!.*(?:vl|vision))"  # DeepSeek's chat and reasoner models
    r"|gpt-3\.5|o1-mini|o3-mini|text-|davinci|babbage"  # OpenAI's text-only ones
    r"|claude-2|claude-instant"  # Anthropic before Claude 3
    r"|qwq|qwen(?!.*(?:vl|omni))"  # Qwen without VL / Omni
    r"|codestral|mistral-(?:tiny|small-2[34]|large-24)"  # Mistral's text models
    r")"
)


def family_takes_images(model: str) -> bool:
    """Whether ``model`` reads images by its family (the default of a row's ``vision``)."""
    name = model.lower().rsplit("/", 1)[-1]
    return _TEXT_ONLY.match(name) is None


def _label(block: ContentBlock) -> str:
    record = _record(block)
    name, media, size = record.get("name"), record.get("mediaType"), record.get("bytes")
    shown = name if isinstance(name, str) else str(record.get("attachmentId", "attachment"))
    facts = ", ".join(str(part) for part in (media, f"{size} bytes" if size else None) if part)
    return f"{shown} ({facts})" if facts else shown


def refusal(info: ModelInfo, blocks: Sequence[ContentBlock]) -> str | None:
    """Why a new prompt's ``blocks`` cannot go to the model ``info`` (None: they can)."""
    if info.vision:
        return None
    attached = [_label(block) for block in blocks if is_attachment(block)]
    if not attached:
        return None
    return (
        f'model "{info.id}" (provider "{info.provider}") takes no images or documents, so '
        f"{', '.join(attached)} cannot be sent; use a model that reads images, or set "
        "`vision: true` on its model row if it does (nothing was logged)"
    )


def note_for(block: ContentBlock, info: ModelInfo) -> TextBlock:
    """The text a model that takes no images reads in place of ``block``."""
    kind = "image" if isinstance(block, ImageBlock) else "document"
    return TextBlock(
        text=f'[{kind} not shown: {_label(block)}; model "{info.id}" takes no images or '
        "documents. Ask the user to describe it, or to switch to a model that reads images.]"
    )


def _content(blocks: Sequence[ContentBlock], info: ModelInfo) -> tuple[ContentBlock, ...] | None:
    """``blocks`` with each attachment replaced by its note (None: nothing to replace)."""
    changed = False
    out: list[ContentBlock] = []
    for block in blocks:
        if is_attachment(block):
            block, changed = note_for(block, info), True
        elif isinstance(block, ToolResultBlock):
            inner = _content(block.content, info)
            if inner is not None:
                block, changed = msgspec.structs.replace(block, content=inner), True
        out.append(block)
    return tuple(out) if changed else None


def carries_attachment(message: Message) -> bool:
    """Whether ``message`` holds an image or a document (its own, or a tool result's)."""
    for block in message.content:
        if is_attachment(block) or (
            isinstance(block, ToolResultBlock) and any(is_attachment(b) for b in block.content)
        ):
            return True
    return False


def without_images(
    request: LlmRequest, info: ModelInfo, positions: Iterable[int] | None = None
) -> LlmRequest:
    """``request`` as a model that takes no images is sent it: each image or document of the
    history becomes a text note (the same request when ``info.vision`` or there is none).
    ``positions``: where the messages carrying them are (default: every message is looked at)."""
    if info.vision:
        return request
    messages: list[Message] | None = None
    for position in range(len(request.messages)) if positions is None else positions:
        message = request.messages[position]
        content = _content(message.content, info)
        if content is None:
            continue
        if messages is None:
            messages = list(request.messages)
        messages[position] = msgspec.structs.replace(message, content=content)
    return request if messages is None else request.replace(messages=tuple(messages))
