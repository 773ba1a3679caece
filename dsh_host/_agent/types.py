"""Payloads and decisions of the ``agent/*`` events.

Every ``agent/*`` event carries the agent itself, so a listener reaches the
session (``payload.agent.session``) and the options without a lookup. The
checkpoint policy relies on that for ``agent/pre-step``.

=========================  ==========  ====================================================
event                      mode        payload → result
=========================  ==========  ====================================================
``agent/pre-step``         waterfall   :class:`PreStepContext` → :class:`Enter` | :class:`Reject`
``agent/request``          waterfall   :class:`RequestProposal` → ``LlmCallConfig``
``agent/request-error``    waterfall   :class:`RequestErrorContext` → :class:`Retry` | None
``agent/turn-stopping``    serial      :class:`TurnStoppingContext` (steer to continue)
``agent/turn-start``       emit        :class:`TurnStarted`
``agent/turn-end``         emit        :class:`TurnEnded`
``agent/step-start``       emit        :class:`StepStarted`
``agent/step-end``         emit        :class:`StepEnded`
``agent/error``            emit        :class:`AgentErrorEvent`
``system-prompt/assemble`` waterfall   :class:`AssembleContext` → :class:`PromptAssembly`
=========================  ==========  ====================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from dsh_host._agent.budget import Budget
from dsh_host._cancel import CancelToken
from dsh_host._session.events import TurnEndReason
from dsh_host._session.messages import LlmFailure, StreamChunk, ToolSchema, UserMessage

if TYPE_CHECKING:
    from dsh_host._llm.types import RetryPolicy

    from .loop import Agent

__all__ = [
    "AgentErrorEvent",
    "AgentOptions",
    "AssembleContext",
    "AssembledContext",
    "AssembledSection",
    "ChunkReceived",
    "Enter",
    "PreStepContext",
    "PreStepDecision",
    "PromptAssembly",
    "Reject",
    "RequestErrorAction",
    "RequestErrorContext",
    "RequestProposal",
    "Retry",
    "StepEnded",
    "StepStarted",
    "TextProvider",
    "TurnEnded",
    "TurnStarted",
    "TurnStoppingContext",
    "pre_step_decision",
    "request_error_action",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentOptions:
    """What a new agent calls and how.

    ``provider`` / ``model`` seed the first request of each loop instance
    (an ``agent/request`` listener may choose them instead); ``max_tokens``
    and ``reasoning_effort`` are sent when set. ``max_parallel_tool_calls``
    caps overlapping tool bodies of one parallel group (1 = serial).
    ``max_steps_per_turn`` caps the steps (model calls with their tool
    calls) of one turn: a turn that would open one more ends
    ``max-turn-requests {limit}``. ``budget``: spend limits checked before
    every model request (see :mod:`dsh_host._agent.budget`).
    """

    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    max_parallel_tool_calls: int = 10
    max_steps_per_turn: int = 200
    budget: Budget | None = None


# --------------------------------------------------------------------------- pre-step


@dataclass(frozen=True, kw_only=True, slots=True)
class PreStepContext:
    """``agent/pre-step`` payload: the messages this step would enter."""

    agent: Agent
    turn: int
    step: int
    #: claimed input (the prompt on step 1, then steering and tool contexts)
    messages: tuple[UserMessage, ...]
    signal: CancelToken


@dataclass(frozen=True, slots=True)
class Enter:
    """Open the step with ``messages`` (each is appended as a ``user/message``)."""

    messages: Sequence[UserMessage] = ()
    kind: Literal["enter"] = "enter"


@dataclass(frozen=True, slots=True)
class Reject:
    """End the turn ``blocked`` without opening a step (the claimed input is dropped)."""

    kind: Literal["reject"] = "reject"


PreStepDecision: TypeAlias = Enter | Reject


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestProposal:
    """``agent/request`` payload; the waterfall's result is the call's ``LlmCallConfig``."""

    agent: Agent
    turn: int
    step: int
    signal: CancelToken


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestErrorContext:
    """``agent/request-error`` payload: a model call ended with an error or aborted finish.

    Return :class:`Retry` to make a fresh request in the same step; anything
    else ends the turn with ``error`` carrying ``failure`` verbatim.
    """

    agent: Agent
    turn: int
    step: int
    provider: str
    failure: LlmFailure
    retry_policy: RetryPolicy | None
    signal: CancelToken
    #: how many retries this step already made (0 on the first failure)
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """``agent/request-error`` decision: try the request again."""

    kind: Literal["retry"] = "retry"


RequestErrorAction: TypeAlias = Retry | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnStoppingContext:
    """``agent/turn-stopping`` payload: the turn is about to end; ``agent.steer()`` continues it."""

    agent: Agent
    turn: int
    signal: CancelToken


# --------------------------------------------------------------------------- notifications


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnStarted:
    agent: Agent
    turn: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnEnded:
    agent: Agent
    turn: int
    reason: TurnEndReason


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkReceived:
    """``agent/chunk``: one chunk of the step's model stream, as the loop received it."""

    agent: Agent
    turn: int
    step: int
    chunk: StreamChunk


@dataclass(frozen=True, kw_only=True, slots=True)
class StepStarted:
    agent: Agent
    turn: int
    step: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StepEnded:
    agent: Agent
    turn: int
    step: int


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentErrorEvent:
    """``agent/error``: a turn failed (also recorded in its ``turn/end``)."""

    agent: Agent
    turn: int
    step: int
    error: BaseException


# --------------------------------------------------------------------------- prompt


@dataclass(frozen=True, kw_only=True, slots=True)
class AssembleContext:
    """What one prompt assembly is for (``agent`` is None for a bare assembly)."""

    agent: Agent | None = None
    signal: CancelToken | None = None


#: Static text, or a provider evaluated at each assembly.
TextProvider: TypeAlias = str | Callable[[AssembleContext], str]


@dataclass(slots=True)
class AssembledSection:
    """One system-prompt section, text resolved but not yet interpolated."""

    name: str
    text: str


@dataclass(slots=True)
class AssembledContext:
    """One runtime-context contribution, text resolved but not yet interpolated."""

    name: str
    text: str


@dataclass(slots=True)
class PromptAssembly:
    """The model input of one step besides the history (mutable inside the waterfall).

    ``sections`` render the system prompt; ``contexts`` the runtime-context
    snapshot; ``tools`` are the schemas in canonical (name) order;
    ``variables`` the values of ``{{name}}`` references.
    """

    sections: list[AssembledSection] = field(default_factory=list)
    contexts: list[AssembledContext] = field(default_factory=list)
    tools: list[ToolSchema] = field(default_factory=list)
    variables: dict[str, str | None] = field(default_factory=dict)


def pre_step_decision(value: object) -> PreStepDecision:
    """Normalize a pre-step listener's result (typed, or ``{"kind": ...}`` mappings)."""
    if isinstance(value, Enter | Reject):
        return value
    if isinstance(value, Mapping):
        if value.get("kind") == "reject":
            return Reject()
        if value.get("kind") == "enter":
            return Enter(tuple(value.get("messages", ())))
    raise TypeError(f"agent/pre-step must resolve to Enter(messages) or Reject(), got {value!r}")


def request_error_action(value: object) -> RequestErrorAction:
    if isinstance(value, Retry):
        return value
    if isinstance(value, Mapping) and value.get("kind") == "retry":
        return Retry()
    return None
