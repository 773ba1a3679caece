"""Test-only writer of DSH's v0 packed chunk rows, to produce historical files.

The v3 writer never emits packed rows (the reader still reads them: ``_codec``); this packer
only builds v0 fixtures for the migration and format tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsh_session_persistence_jsonl._codec import CHUNK_ROW_TAGS, MAX_SAFE

__all__ = ["pack_chunk_rows"]


def _packable(event: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The run identity of an ``assistant/chunk`` delta event, or None when not packable."""
    if event.get("type") != "assistant/chunk" or set(event) != {"type", "seq", "time", "data"}:
        return None
    data = event["data"]
    if not isinstance(data, Mapping) or set(data) != {"turn", "step", "chunk"}:
        return None
    chunk = data["chunk"]
    if not isinstance(chunk, Mapping) or type(chunk.get("index")) not in (int, float):
        return None
    kind = chunk.get("type")
    if kind in ("text-delta", "reasoning-delta"):
        if set(chunk) != {"type", "index", "text"} or type(chunk["text"]) is not str:
            return None
        return (kind, data["turn"], data["step"], chunk["index"])
    if kind == "tool-call-delta":
        keys = set(chunk)
        if not (
            {"type", "index", "id", "argumentsDelta"}
            <= keys
            <= {"type", "index", "id", "name", "argumentsDelta"}
        ):
            return None
        if type(chunk["id"]) is not str or type(chunk["argumentsDelta"]) is not str:
            return None
        if "name" in chunk and type(chunk["name"]) is not str:
            return None
        return (
            kind,
            data["turn"],
            data["step"],
            chunk["index"],
            chunk["id"],
            "name" in chunk,
            chunk.get("name"),
        )
    return None


def pack_chunk_rows(events: Sequence[Mapping[str, Any]]) -> list[Any]:
    """v0 storage rows for a batch: runs of >= 3 chunk deltas become one packed row.

    Produces historical v0 files; the v3 writer never emits packed rows.
    """
    rows: list[Any] = []
    i = 0
    while i < len(events):
        ident = _packable(events[i])
        j = i + 1
        if ident is not None:
            while (
                j < len(events)
                and _packable(events[j]) == ident
                and events[j]["seq"] == events[j - 1]["seq"] + 1
                and abs(events[j]["time"] - events[j - 1]["time"]) <= MAX_SAFE
            ):
                j += 1
        if ident is None or j - i < 3:
            rows.extend(dict(e) for e in events[i:j])
            i = j
            continue
        run = events[i:j]
        first = run[0]
        chunk0 = first["data"]["chunk"]
        kind = chunk0["type"]
        tag = {v: k for k, v in CHUNK_ROW_TAGS.items()}[kind]
        data: dict[str, Any] = {
            "turn": first["data"]["turn"],
            "step": first["data"]["step"],
            "index": chunk0["index"],
            "dt": [run[k]["time"] - run[k - 1]["time"] for k in range(1, len(run))],
        }
        if kind == "tool-call-delta":
            data["id"] = chunk0["id"]
            if "name" in chunk0:
                data["name"] = chunk0["name"]
            data["args"] = [e["data"]["chunk"]["argumentsDelta"] for e in run]
        else:
            data["texts"] = [e["data"]["chunk"]["text"] for e in run]
        rows.append({"type": tag, "seq0": first["seq"], "time0": first["time"], "data": data})
        i = j
    return rows
