"""Images and documents in a user's prompt: made into content blocks once, read by every adapter.

The one place a file becomes a content block (:func:`attachment_block`, used by ``dsh run
--attach``, ``Agent.run(..., attachments=)``) and the one place an adapter reads one back
(:func:`attachment_of`). What a file may be and how large is decided here, with a clear error
naming the file, so no adapter sees a type or a size it would have to refuse.

The blocks have DSH's shapes: ``{type: "image", attachment: {attachmentId, mediaType, bytes,
name}}`` and ``{type: "file", attachment: {attachmentId, name, bytes, mediaType}}``. The bytes
travel in the attachment record itself (``data``, base64): the log alone reproduces every
request, on every store, after a crash too (D29 in docs/decisions.md).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from dsh_host._jsonsafe import freeze_json
from dsh_host._session import ContentBlock
from dsh_host._session.messages import ImageBlock, ToolResultBlock
from dsh_host.errors import DshError

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_IMAGE_BYTES",
    "MAX_PROMPT_ATTACHMENT_BYTES",
    "Attachment",
    "AttachmentError",
    "attachment_block",
    "attachment_blocks",
    "attachment_from_bytes",
    "attachment_of",
    "data_uri",
    "image_block",
    "image_media_type",
    "tool_result_images",
]

#: the largest image accepted (Anthropic's per-image limit; OpenAI's is larger)
MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: the largest PDF accepted (within every shipped provider's request limit once encoded)
MAX_DOCUMENT_BYTES = 10 * 1024 * 1024
#: all attachments of one prompt together
MAX_PROMPT_ATTACHMENT_BYTES = 20 * 1024 * 1024

#: what each accepted type starts with (the file's content decides, not its name)
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),  # after RIFF....
    (b"%PDF-", 0, "application/pdf"),
)
_ACCEPTED = "PNG, JPEG, GIF, WebP images and PDF documents"


class AttachmentError(DshError):
    """A file that cannot be attached (missing, unreadable, of another type, too large)."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """An attachment as an adapter sends it."""

    kind: Literal["image", "document"]
    media_type: str
    #: base64 of the bytes
    data: str
    name: str

    @property
    def data_uri(self) -> str:
        return data_uri(self.media_type, self.data)


def data_uri(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def _media_type(raw: bytes) -> str | None:
    for signature, offset, media in _SIGNATURES:
        if raw[offset : offset + len(signature)] == signature:
            if media == "image/webp" and not raw.startswith(b"RIFF"):
                continue
            return media
    return None


def image_media_type(raw: bytes) -> str | None:
    """The media type of ``raw`` when its first bytes are a PNG, JPEG, GIF or WebP image."""
    media = _media_type(raw)
    return media if media is not None and media.startswith("image/") else None


def _size(count: int) -> str:
    return f"{count / (1024 * 1024):.1f} MiB" if count >= 1024 * 1024 else f"{count} bytes"


def attachment_block(path: str | PathLike[str]) -> ContentBlock:
    """The content block of the file at ``path`` (an image or a PDF), or AttachmentError."""
    where = Path(path)
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        raise AttachmentError(f"cannot attach {str(where)!r}: no such file") from None
    except IsADirectoryError:
        raise AttachmentError(f"cannot attach {str(where)!r}: it is a directory") from None
    except OSError as exc:
        raise AttachmentError(
            f"cannot attach {str(where)!r}: {exc.strerror or exc}"
        ) from None
    return attachment_from_bytes(raw, where.name, shown=str(where))


def attachment_from_bytes(raw: bytes, name: str, *, shown: str | None = None) -> ContentBlock:
    """The content block of ``raw`` named ``name`` (an upload); ``shown`` names it in errors
    (default: the name)."""
    where = shown if shown is not None else name
    media = _media_type(raw)
    if media is None:
        raise AttachmentError(
            f"cannot attach {where!r}: not an accepted type ({_ACCEPTED}, recognised by "
            "their content); paste text into the prompt instead"
        )
    document = media == "application/pdf"
    limit = MAX_DOCUMENT_BYTES if document else MAX_IMAGE_BYTES
    if len(raw) > limit:
        raise AttachmentError(
            f"cannot attach {where!r}: {_size(len(raw))} is over the "
            f"{_size(limit)} limit for {'a PDF' if document else 'an image'}; "
            + ("split it or attach the pages needed" if document else "scale it down")
        )
    record = {
        "attachmentId": "sha256-" + hashlib.sha256(raw).hexdigest(),
        "mediaType": media,
        "bytes": len(raw),
        "name": name,
        "data": base64.b64encode(raw).decode("ascii"),
    }
    if document:
        block: dict[str, Any] = {"type": "file", "attachment": record}
        return freeze_json(block, "attachment")  # type: ignore[no-any-return]
    return ImageBlock(attachment=freeze_json(record, "attachment"))


def image_block(raw: bytes, name: str, *, shown: str | None = None) -> ImageBlock:
    """The image block of ``raw`` (a tool result's image: ``read_file`` on a picture, an MCP
    ``image`` content block), under the same type and size rules as an attachment."""
    where = shown if shown is not None else name
    if image_media_type(raw) is None:
        raise AttachmentError(
            f"{where!r} is not a PNG, JPEG, GIF or WebP image (recognised by its content)"
        )
    block = attachment_from_bytes(raw, name, shown=shown)
    assert isinstance(block, ImageBlock)
    return block


def attachment_blocks(paths: Iterable[str | PathLike[str]]) -> list[ContentBlock]:
    """The blocks of every file in ``paths``, within :data:`MAX_PROMPT_ATTACHMENT_BYTES`."""
    blocks = [attachment_block(path) for path in paths]
    total = sum(int(_record(block).get("bytes", 0)) for block in blocks)
    if total > MAX_PROMPT_ATTACHMENT_BYTES:
        raise AttachmentError(
            f"cannot attach these {len(blocks)} files: {_size(total)} together is over the "
            f"{_size(MAX_PROMPT_ATTACHMENT_BYTES)} limit for one prompt; attach fewer"
        )
    return blocks


def _record(block: ContentBlock) -> Mapping[str, Any]:
    if isinstance(block, ImageBlock):
        attachment = block.attachment
    elif isinstance(block, Mapping) and block.get("type") == "file":
        attachment = block.get("attachment")
    else:
        return {}
    return attachment if isinstance(attachment, Mapping) else {}


def attachment_of(block: ContentBlock) -> Attachment | None:
    """The attachment a block carries, as an adapter sends it (None: not an attachment block,
    or one whose bytes are not in the log, e.g. a DSH attachment reference: see
    :func:`unsendable`)."""
    record = _record(block)
    data, media = record.get("data"), record.get("mediaType")
    if not isinstance(data, str) or not isinstance(media, str):
        return None
    name = record.get("name")
    kind: Literal["image", "document"] = "image" if isinstance(block, ImageBlock) else "document"
    return Attachment(kind, media, data, name if isinstance(name, str) else "attachment")


def is_attachment(block: ContentBlock) -> bool:
    """An image block, or DSH's ``file`` block."""
    return isinstance(block, ImageBlock) or (
        isinstance(block, Mapping) and block.get("type") == "file"
    )


def unsendable(block: ContentBlock) -> str | None:
    """Why an attachment block cannot be sent (None: it can, or it is no attachment)."""
    if not is_attachment(block) or attachment_of(block) is not None:
        return None
    record = _record(block)
    return (
        f"attachment {record.get('attachmentId', '?')!r} has no bytes in the log (a reference "
        "to another store); attach the file again"
    )


def attached(blocks: Sequence[ContentBlock]) -> list[Attachment]:
    """The attachments among ``blocks``, in order."""
    return [a for a in (attachment_of(block) for block in blocks) if a is not None]


def tool_result_images(result: ToolResultBlock) -> list[Attachment]:
    """The images a tool result carries (with their bytes in the log), in order."""
    return [a for a in attached(result.content) if a.kind == "image"]
