"""``dsh sessions show ID --json``: the session as it happened, as one JSON document.

What the terminal transcript prints, for a program: each turn with its prompt, times, steps,
end and usage; each tool call with its arguments, approval, result and duration. Built from
the events in one pass; every time is the event's own (Unix milliseconds), a duration is the
difference of two logged times (``null`` while the second is not logged: an interrupted
turn, a call without a result).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._session.events import SessionEvent, to_builtins
from .._session.usage import UsageTotals

__all__ = ["transcript_document"]


def _text(blocks: Any) -> str:
    return "".join(
        str(block.get("text", "")) for block in blocks or () if block.get("type") == "text"
    )


def _arguments(raw: Any) -> Any:
    """The call's arguments decoded when they are JSON, else the logged string as it is."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _span(start: int | None, end: int | None) -> int | None:
    return None if start is None or end is None else end - start


def transcript_document(
    session_id: str,
    events: Sequence[SessionEvent],
    *,
    usage: UsageTotals | None = None,
    turn_usage: Mapping[int, UsageTotals] | None = None,
) -> dict[str, Any]:
    """``{sessionId, title, turns: [...], usage}`` from a session's events (see the module)."""
    turns: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    asks: dict[str, dict[str, Any]] = {}  #: an ask id's call
    turn: dict[str, Any] | None = None
    title: str | None = None
    for event in events:
        kind = event.type
        if kind == "turn/start":
            number = int(event.data.turn)
            turn = {"turn": number, "startedAt": event.time, "endedAt": None, "durationMs": None,
                    "prompt": None, "steps": 0, "calls": [], "answer": None, "end": None,
                    "usage": None}  # fmt: skip
            if turn_usage is not None and number in turn_usage:
                turn["usage"] = turn_usage[number].to_json()
            turns.append(turn)
            continue
        if turn is None:
            continue
        if kind == "step/start":
            turn["steps"] += 1
        elif kind == "user/message":
            data = to_builtins(event.data)
            if (data.get("source") or {}).get("kind") == "user" and turn["prompt"] is None:
                turn["prompt"] = _text(data.get("content"))
                title = title or turn["prompt"]
        elif kind == "assistant/message":
            text = _text((to_builtins(event.data).get("message") or {}).get("content"))
            if text:
                turn["answer"] = text
        elif kind == "tool/call":
            data = to_builtins(event.data)
            call = {
                "callId": data.get("callId"),
                "name": data.get("name"),
                "arguments": _arguments(data.get("arguments")),
                "startedAt": event.time,
                "endedAt": None,
                "durationMs": None,
                "approval": None,
                "result": None,
            }
            calls[str(call["callId"])] = call
            turn["calls"].append(call)
        elif kind == "approval/asked":
            data = to_builtins(event.data)
            found = calls.get(str(data.get("callId")))
            if found is not None:
                found["approval"] = {"askedAt": event.time, "reason": data.get("reason")}
                asks[str(data.get("id"))] = found
        elif kind == "approval/decided":
            # The outcome names its ask (``id``); only a deferred decision names the call too.
            data = to_builtins(event.data)
            found = asks.get(str(data.get("id"))) or calls.get(str(data.get("callId")))
            if found is not None:
                found["approval"] = {**(found["approval"] or {}), "decidedAt": event.time,
                                     "outcome": data.get("outcome"),
                                     "decidedBy": data.get("decidedBy")}  # fmt: skip
        elif kind == "tool/result":
            data = to_builtins(event.data)
            blocks = (data.get("message") or {}).get("content") or [{}]
            block = blocks[0]
            found = calls.get(str(block.get("toolCallId")))
            if found is not None:
                error = data.get("error") or {}
                found["endedAt"] = event.time
                found["durationMs"] = _span(found["startedAt"], event.time)
                found["result"] = {"isError": bool(block.get("isError")),
                                   "error": error.get("code"),
                                   "text": _text(block.get("content"))}  # fmt: skip
        elif kind == "turn/end":
            turn["endedAt"] = event.time
            turn["durationMs"] = _span(turn["startedAt"], event.time)
            turn["end"] = to_builtins(event.data).get("reason")
            turn = None
    return {
        "sessionId": session_id,
        "title": title,
        "turns": turns,
        "usage": usage.to_json() if usage is not None else None,
    }
