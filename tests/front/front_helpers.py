"""Helpers of the front-door tests: scripts for the scripted model, log queries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from dsh_host._session.events import SessionEvent


def script(tmp_path: Path, responses: Sequence[object], name: str = "script.json") -> str:
    """Write a scripted-model script; returns the ``scripted:PATH`` model spec."""
    path = tmp_path / name
    path.write_bytes(msgspec.json.encode({"responses": responses}))
    return f"scripted:{path}"


def events_of(agent: Any, *types: str) -> list[SessionEvent]:
    return [event for event in agent.session.events if not types or event.type in types]


def result_texts(agent: Any) -> dict[str, str]:
    """call id -> the text the model read back."""
    out: dict[str, str] = {}
    for event in events_of(agent, "tool/result"):
        message = event.data.message
        block = message.content[0]
        out[message.source.call_id] = "".join(part.text for part in block.content)
    return out
