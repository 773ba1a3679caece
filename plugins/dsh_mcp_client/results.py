"""MCP ``tools/call`` results as the model reads them (DSH's projection).

The canonical value keeps the complete JSON blocks (and ``structuredContent``) for programmatic
callers; the model reads them in order: runs of text blocks joined with newlines into one text
block, resource links as ``Resource link: <name> (<uri>)``, each ``image`` block as an image
block (DSH's shape, its bytes in the record: D29, D31), and every block this bridge cannot show
(an image that is not a PNG, JPEG, GIF or WebP within the size limit, audio, embedded
resources, unknown types) as an explicit bracketed diagnostic, never silently dropped.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from dsh_host.sdk import AttachmentError, ContentBlock, TextBlock, image_block

__all__ = ["project_content", "project_text", "render_content", "render_result"]


def _block_text(block: Any) -> str | None:
    if not isinstance(block, Mapping):
        return "[unsupported MCP content block: expected an object]"
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return text if isinstance(text, str) else None
    if kind == "resource_link":
        name, uri = block.get("name"), block.get("uri")
        if not isinstance(name, str) or not isinstance(uri, str):
            return "[resource link unavailable: the MCP block is missing its name or URI]"
        return f"Resource link: {name} ({uri})"
    media = block.get("mimeType")
    media_type = media if isinstance(media, str) else "unknown media type"
    if kind == "image":
        return _image_diagnostic(media_type, "this result is shown as text")
    if kind == "audio":
        return (
            f"[audio result unsupported: {media_type}; raw audio data remains available to "
            "programmatic callers]"
        )
    if kind == "resource":
        return (
            "[embedded resource unsupported; raw resource data remains available to "
            "programmatic callers]"
        )
    return f"[unsupported MCP content type: {kind}]"


def project_text(content: Sequence[Any], raw_name: str) -> str:
    """The model-visible text of an MCP content array (order kept, one line per block)."""
    lines = [text for text in (_block_text(block) for block in content) if text is not None]
    if not lines:
        return f"({raw_name} returned no model-visible content)"
    return "\n".join(lines)


def render_result(raw_name: str, value: Any) -> str:
    """Text of a canonical ``{content, structuredContent?}`` value."""
    content = value.get("content") if isinstance(value, Mapping) else None
    return project_text(content if isinstance(content, Sequence) else (), raw_name)


def _image_diagnostic(media_type: str, reason: str) -> str:
    return (
        f"[image unavailable: {media_type}; {reason}; raw image data remains available to "
        "programmatic callers]"
    )


def _image(block: Mapping[str, Any], raw_name: str, index: int) -> ContentBlock:
    """The image block of an MCP ``image`` block, or a text diagnostic saying why not."""
    media = block.get("mimeType")
    media_type = media if isinstance(media, str) else "unknown media type"
    data = block.get("data")
    try:
        if not isinstance(data, str):
            raise ValueError
        raw = base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        return TextBlock(text=_image_diagnostic(media_type, "the image data is not base64"))
    try:
        image = image_block(raw, f"{raw_name}-{index + 1}", shown=f"{raw_name} image {index + 1}")
    except AttachmentError as exc:
        return TextBlock(text=_image_diagnostic(media_type, str(exc)))
    if image.attachment.get("mediaType") != media_type:
        return TextBlock(
            text=_image_diagnostic(
                media_type, f"its bytes are {image.attachment.get('mediaType')}, not {media_type}"
            )
        )
    return image


def project_content(content: Sequence[Any], raw_name: str) -> list[ContentBlock]:
    """The model-visible blocks of an MCP content array: text runs joined, images kept."""
    out: list[ContentBlock] = []
    lines: list[str] = []
    for index, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") == "image":
            if lines:
                out.append(TextBlock(text="\n".join(lines)))
                lines = []
            out.append(_image(block, raw_name, index))
            continue
        text = _block_text(block)
        if text is not None:
            lines.append(text)
    if lines:
        out.append(TextBlock(text="\n".join(lines)))
    if not out:
        out.append(TextBlock(text=f"({raw_name} returned no model-visible content)"))
    return out


def render_content(raw_name: str, value: Any) -> list[ContentBlock]:
    """Blocks of a canonical ``{content, structuredContent?}`` value."""
    content = value.get("content") if isinstance(value, Mapping) else None
    return project_content(content if isinstance(content, Sequence) else (), raw_name)
