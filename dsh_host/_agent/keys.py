"""The events the agent layer dispatches: one typed key each, declared by the ``agent`` plugin.

Payloads and decisions are in :mod:`dsh_host._agent.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh_host._bus import Emit, EventSpec, Serial, Waterfall
from dsh_host._context import ServiceKey

if TYPE_CHECKING:
    from dsh_host._session.messages import LlmCallConfig

    from .service import AgentService
    from .types import (
        AgentErrorEvent,
        AssembleContext,
        ChunkReceived,
        PreStepContext,
        PreStepDecision,
        PromptAssembly,
        RequestErrorAction,
        RequestErrorContext,
        RequestProposal,
        StepEnded,
        StepStarted,
        TurnEnded,
        TurnStarted,
        TurnStoppingContext,
    )

__all__ = [
    "AGENT",
    "AGENT_CHUNK",
    "AGENT_ERROR",
    "AGENT_EVENTS",
    "AGENT_PRE_STEP",
    "AGENT_REQUEST",
    "AGENT_REQUEST_ERROR",
    "AGENT_STEP_END",
    "AGENT_STEP_START",
    "AGENT_TURN_END",
    "AGENT_TURN_START",
    "AGENT_TURN_STOPPING",
    "SUBAGENTS",
    "SYSTEM_PROMPT_ASSEMBLE",
]

#: The ``agent`` service.
AGENT: ServiceKey[AgentService] = ServiceKey("agent")
#: delegation to child agents (``subagents``); the host only boots it (a repair refines a
#: delegating call's closer through ``AgentService.repair_refiner``), so it is opaque here
SUBAGENTS: ServiceKey[object] = ServiceKey("subagents")

AGENT_PRE_STEP: Waterfall[PreStepContext, PreStepDecision] = Waterfall(
    "agent/pre-step", "(step context) -> Enter | Reject"
)
AGENT_REQUEST: Waterfall[RequestProposal, LlmCallConfig] = Waterfall(
    "agent/request", "(proposal) -> LlmCallConfig"
)
AGENT_REQUEST_ERROR: Waterfall[RequestErrorContext, RequestErrorAction] = Waterfall(
    "agent/request-error", "(error context) -> Retry | None"
)
#: Awaited in turn when a turn is about to end; a listener that steers keeps it going.
AGENT_TURN_STOPPING: Serial[[TurnStoppingContext]] = Serial(
    "agent/turn-stopping", 1, "(turn context); steer to continue"
)
AGENT_TURN_START: Emit[[TurnStarted]] = Emit("agent/turn-start", 1, "(turn info)")
AGENT_TURN_END: Emit[[TurnEnded]] = Emit("agent/turn-end", 1, "(turn info)")
AGENT_STEP_START: Emit[[StepStarted]] = Emit("agent/step-start", 1, "(step info)")
AGENT_STEP_END: Emit[[StepEnded]] = Emit("agent/step-end", 1, "(step info)")
AGENT_ERROR: Emit[[AgentErrorEvent]] = Emit("agent/error", 1, "(error) a turn failed")
#: Each chunk of a turn's model stream, after the loop received it: how printers (the CLI
#: transcript, ``agent.stream()``) see text as it arrives. An observer, not a stage of the
#: stream: a listener that fails (a closed pipe) is contained where emits are dispatched and
#: cannot cut the stream, as an ``llm/stream`` middleware would.
AGENT_CHUNK: Emit[[ChunkReceived]] = Emit("agent/chunk", 1, "(chunk info) a model chunk arrived")
SYSTEM_PROMPT_ASSEMBLE: Waterfall[AssembleContext, PromptAssembly] = Waterfall(
    "system-prompt/assemble", "(assemble context) -> PromptAssembly"
)

#: Everything the ``agent`` plugin declares.
AGENT_EVENTS: tuple[EventSpec, ...] = (
    AGENT_PRE_STEP,
    AGENT_REQUEST,
    AGENT_REQUEST_ERROR,
    AGENT_TURN_STOPPING,
    AGENT_TURN_START,
    AGENT_TURN_END,
    AGENT_CHUNK,
    AGENT_STEP_START,
    AGENT_STEP_END,
    AGENT_ERROR,
    SYSTEM_PROMPT_ASSEMBLE,
)
