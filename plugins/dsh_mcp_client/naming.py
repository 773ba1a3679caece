"""Model-facing names of MCP tools: ``mcp__<serverName>__<rawName>``, normalised as DSH does."""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = ["MAX_PUBLIC_NAME_LENGTH", "public_tool_name"]

#: The DeepSeek (and OpenAI) function-name contract: at most 64 characters of ``[A-Za-z0-9_-]``.
MAX_PUBLIC_NAME_LENGTH: Final = 64
_INVALID: Final = re.compile(r"[^A-Za-z0-9_-]")
_HASH_LENGTH: Final = 12


def public_tool_name(server_name: str, raw_name: str) -> str:
    """The registered name of the server's tool ``raw_name``: a pure function of the pair.

    ``mcp__<serverName>__<rawName>`` verbatim when it already fits the contract; otherwise the
    invalid characters become ``_``, the result is cut to leave room, and ``_`` plus 12 hex
    characters of ``sha256(serverName NUL rawName)`` are appended, so two distinct tools never
    collapse into one name whatever the replacement or the cut did.
    """
    joined = f"mcp__{server_name}__{raw_name}"
    normalized = _INVALID.sub("_", joined)
    if normalized == joined and len(normalized) <= MAX_PUBLIC_NAME_LENGTH:
        return normalized
    digest = hashlib.sha256(f"{server_name}\0{raw_name}".encode()).hexdigest()[:_HASH_LENGTH]
    return f"{normalized[: MAX_PUBLIC_NAME_LENGTH - _HASH_LENGTH - 1]}_{digest}"
