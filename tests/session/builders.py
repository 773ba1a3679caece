"""Small builders for session tests (plain data the loop would produce)."""

from __future__ import annotations

from typing import Any

from dsh_host._session import (
    AssistantMessage,
    AssistantMessageData,
    ModelSource,
    Session,
    TextBlock,
    ToolCallBlock,
    ToolCallData,
    ToolResultBlock,
    ToolResultData,
    ToolResultMessage,
    ToolSource,
    UserMessage,
    UserSource,
)
from dsh_host.testing import FakeClock  # the deterministic clock plugin authors use too


def new_session(session_id: str = "s") -> Session:
    return Session.create(session_id, clock=FakeClock())


def user(mid: str, text: str = "hi") -> UserMessage:
    return UserMessage(id=mid, content=(TextBlock(text=text),), source=UserSource())


def assistant(turn: int, step: int, mid: str, *blocks: Any) -> AssistantMessageData:
    return AssistantMessageData(
        turn=turn,
        step=step,
        message=AssistantMessage(
            id=mid, content=tuple(blocks), source=ModelSource(provider="mock", model="mock")
        ),
        stream=(),
    )


def call_block(call_id: str, name: str = "bash", arguments: str = "{}") -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name, arguments=arguments)


def tool_call(turn: int, step: int, call_id: str, name: str = "bash") -> ToolCallData:
    return ToolCallData(turn=turn, step=step, call_id=call_id, name=name, arguments="{}")


def tool_result(
    turn: int, step: int, call_id: str, text: str = "ok", mid: str | None = None, **extra: Any
) -> ToolResultData:
    return ToolResultData(
        turn=turn,
        step=step,
        message=ToolResultMessage(
            id=mid or f"r-{call_id}",
            content=(ToolResultBlock(tool_call_id=call_id, content=(TextBlock(text=text),)),),
            source=ToolSource(call_id=call_id),
        ),
        **extra,
    )


def one_turn(session: Session, turn: int = 1, text: str = "hi") -> None:
    """A complete turn: start, user message, one step with a text answer, end."""
    session.append("turn/start", {"turn": turn})
    session.append("user/message", user(f"u{turn}", text), surface_op="append")
    session.append("step/start", {"turn": turn, "step": 1})
    session.append(
        "assistant/message",
        assistant(turn, 1, f"a{turn}", TextBlock(text="hello")),
        surface_op="append",
    )
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
