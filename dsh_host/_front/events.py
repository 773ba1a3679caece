"""The typed events of :meth:`dsh_host.Agent.stream`, in the order the turn produced them.

Events that correspond to a log entry carry its ``seq`` (``tool/call``,
``tool/result``, ``approval/asked``, ``approval/decided``, ``turn/end``), so
the stream order can be checked against the stored log. Text and reasoning
deltas come from the model stream (``llm/stream``) as they arrive, before the
``assistant/message`` that records the whole answer; ``Retry`` is the loop's
decision (``agent/request-error``) after a failed attempt was logged as
``assistant/attempt``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from dsh_host._session.events import TurnEndReason
from dsh_host._session.messages import LlmFailure

__all__ = [
    "ApprovalAsked",
    "ApprovalDecided",
    "Event",
    "ReasoningDelta",
    "Retry",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnEnd",
]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Answer text as the model streams it."""

    text: str
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text as the model streams it."""

    text: str
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """``tool/call``: the call is recorded; policy and then the body run next."""

    seq: int
    turn: int
    step: int
    call_id: str
    name: str
    #: the model's raw JSON argument string, exactly as logged
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """``tool/result``: what the model reads back for the call."""

    seq: int
    turn: int
    step: int
    call_id: str
    is_error: bool
    #: the result's text content (``Error: ...`` for a failure)
    text: str
    #: the internal error code of a failure (``INVALID_ARGS``, ``TOOL_OUTCOME_UNKNOWN`` ...)
    error_code: str | None
    #: the body's JSON value for a success (plain dicts and lists), None for a failure
    value: Any = None


@dataclass(frozen=True, slots=True)
class ApprovalAsked:
    """``approval/asked``: a call waits for a one-shot approval."""

    seq: int
    id: str
    tool_name: str
    call_id: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """``approval/decided``: ``allowed-once``, ``rejected``, ``cancelled`` or ``unavailable``."""

    seq: int
    id: str
    outcome: str


@dataclass(frozen=True, slots=True)
class Retry:
    """The loop retries a model request that failed (its attempt is in the log)."""

    turn: int
    step: int
    #: retries this step already made before this one (0 for the first retry)
    attempt: int
    failure: LlmFailure


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """``turn/end``: the last event of a stream."""

    seq: int
    turn: int
    reason: TurnEndReason

    @property
    def kind(self) -> str:
        """The reason's kind as logged: ``completed``, ``aborted``, ``error`` ..."""
        config = getattr(type(self.reason), "__struct_config__", None)
        tag = getattr(config, "tag", None)
        if isinstance(tag, str):
            return tag
        reason: Any = self.reason  # an unknown (future) reason is a mapping of its JSON
        kind = reason.get("kind") if isinstance(reason, Mapping) else None
        return kind if isinstance(kind, str) else type(self.reason).__name__


Event: TypeAlias = (
    TextDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolCallFinished
    | ApprovalAsked
    | ApprovalDecided
    | Retry
    | TurnEnd
)
