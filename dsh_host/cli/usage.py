"""Token usage as the session logged it: the ``usage`` of each ``assistant/message``, summed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from ..session.events import to_builtins

#: Stored usage names (uncached input, output, input served from cache), kept as they are.
USAGE_KEYS: Final = ("inputTokens", "outputTokens", "cacheReadTokens")


def logged_usage(events: Iterable[Any], turn: int | None = None) -> dict[str, int]:
    """Token counts of the model's answers: every turn's, or only turn ``turn``'s."""
    total = dict.fromkeys(USAGE_KEYS, 0)
    for event in events:
        if event.type != "assistant/message":
            continue
        data = to_builtins(event.data)
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict) or (turn is not None and data.get("turn") != turn):
            continue
        for key in USAGE_KEYS:
            count = usage.get(key)
            if isinstance(count, int):
                total[key] += count
    return total


def usage_line(usage: dict[str, int]) -> str:
    """``1234 in, 56 out`` (input counts what was served from the cache too)."""
    return f"{usage['inputTokens'] + usage['cacheReadTokens']} in, {usage['outputTokens']} out"
