"""Shared builders for persistence tests: wire-form events of small, realistic turns."""

from __future__ import annotations

import json
import os
from typing import Any

T0 = 1_789_200_000_000


def header(session_id: str, cwd: str = "/home/dev/project", **extra: Any) -> dict[str, Any]:
    return {"version": 3, "id": session_id, "createdAt": T0, "cwd": cwd, **extra}


def ev(kind: str, seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "time": T0 + 1 + seq, "data": data, **extra}


def user(seq: int, text: str = "hi") -> dict[str, Any]:
    message = {
        "id": f"user-{seq}",
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "user"},
    }
    return ev("user/message", seq, message, surfaceOp="append")


def assistant(
    seq: int, turn: int, step: int, text: str = "hello", calls: tuple[str, ...] = ()
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [
        {"type": "tool-call", "id": c, "name": "bash", "arguments": json.dumps({"cmd": c})}
        for c in calls
    ]
    stream = [
        {
            "type": "chunk",
            "time": T0 + seq,
            "chunk": {"type": "block-start", "index": 0, "blockType": "text"},
        },
        {
            "type": "text-chunks",
            "time0": T0 + seq,
            "index": 0,
            "dt": [0] * (len(text) - 1),
            "texts": list(text),
        },
        {
            "type": "chunk",
            "time": T0 + seq + 1,
            "chunk": {"type": "block-end", "index": 0, "block": {"type": "text", "text": text}},
        },
        {
            "type": "chunk",
            "time": T0 + seq + 1,
            "chunk": {"type": "finish", "reason": {"kind": "tool-calls" if calls else "stop"}},
        },
    ]
    data = {
        "turn": turn,
        "step": step,
        "message": {
            "id": f"assistant-{seq}",
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": "mock", "model": "mock"},
        },
        "stream": stream,
        "usage": {"inputTokens": 100 + seq, "outputTokens": 7},
    }
    return ev("assistant/message", seq, data, surfaceOp="append")


def tool_call(seq: int, turn: int, step: int, call: str) -> dict[str, Any]:
    return ev(
        "tool/call",
        seq,
        {
            "turn": turn,
            "step": step,
            "callId": call,
            "name": "bash",
            "arguments": json.dumps({"cmd": call}),
        },
    )


def tool_result(seq: int, turn: int, step: int, call: str, call_seq: int) -> dict[str, Any]:
    message = {
        "id": f"result-{call}",
        "role": "user",
        "source": {"kind": "tool", "callId": call},
        "content": [
            {"type": "tool-result", "toolCallId": call, "content": [{"type": "text", "text": "ok"}]}
        ],
    }
    return ev(
        "tool/result",
        seq,
        {"turn": turn, "step": step, "message": message},
        surfaceOp="append",
        sourceEventSeqs=[call_seq],
    )


def turn(
    start_seq: int, turn_no: int, *, closed: bool = True, tools: int = 0
) -> list[dict[str, Any]]:
    """One turn: turn/start, user, step/start, assistant (+ tool calls and results), step/end,
    turn/end (omitted when ``closed`` is False)."""
    seq = start_seq
    out = [ev("turn/start", seq, {"turn": turn_no})]
    out.append(user(seq + 1, f"question {turn_no}"))
    out.append(ev("step/start", seq + 2, {"turn": turn_no, "step": 1}))
    calls = tuple(f"call-{turn_no}-{i}" for i in range(tools))
    out.append(assistant(seq + 3, turn_no, 1, f"answer {turn_no}", calls))
    seq += 4
    for call in calls:
        out.append(tool_call(seq, turn_no, 1, call))
        out.append(tool_result(seq + 1, turn_no, 1, call, seq))
        seq += 2
    out.append(ev("step/end", seq, {"turn": turn_no, "step": 1}))
    if closed:
        out.append(ev("turn/end", seq + 1, {"turn": turn_no, "reason": {"kind": "completed"}}))
    return out


def log(turns: int, *, tools: int = 1, last_closed: bool = True) -> list[dict[str, Any]]:
    """``turns`` consecutive turns as one contiguous list of wire events."""
    events: list[dict[str, Any]] = []
    for n in range(1, turns + 1):
        events += turn(len(events), n, closed=last_closed or n < turns, tools=tools)
    return events


def plain(value: Any) -> Any:
    """A JSON round trip: tuples become lists, so wire values compare with ``==``."""
    return json.loads(json.dumps(value))


def noisy(events: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """``events`` with each user prompt replaced by ``2 * size`` characters of random hex
    (zstd cannot shrink it below about half, so a log of a few hundred turns is megabytes
    either way)."""
    out = []
    for event in events:
        if event["type"] == "user/message":
            text = os.urandom(size).hex()
            event = {**event, "data": {**event["data"], "content": [{"type": "text", "text": text}]}}
        out.append(event)
    return out
