"""MCP ``tools/call`` results as the model reads them (DSH's projection, text only).

The canonical value keeps the complete JSON blocks (and ``structuredContent``) for programmatic
callers; the model reads one text block: text blocks joined with newlines, resource links as
``Resource link: <name> (<uri>)``, and every block this bridge cannot show (images, audio,
embedded resources, unknown types) as an explicit bracketed diagnostic, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["project_text", "render_result"]


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
        return (
            f"[image unavailable: {media_type}; this bridge shows the model text only; raw image "
            "data remains available to programmatic callers]"
        )
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
