"""The agent layer: the turn/step loop, tool scheduling, the system prompt, resume.

Public entry points: ``ctx.agent`` (:class:`AgentService`: ``create``,
``resume``) and :class:`Agent` (``run_turn``, ``cancel``, ``steer``,
``aclose``). See :mod:`dsh_host.agent.loop` for the event order of a turn and
how each turn-end reason is produced.
"""

from .errors import (
    AgentBusyError,
    AgentClosedError,
    AgentConfigError,
    AgentError,
    ApprovalDecisionError,
    ApprovalPendingError,
    PromptError,
    ResumeError,
)
from .loop import Agent, Prompt, cancel_cause, error_chain
from .plugin import AgentConfig, AgentPlugin
from .prompt import (
    CONTEXT_CLEARED,
    CONTEXT_HEADER,
    HARNESS_IDENTITY,
    PROMPT_SOURCE,
    SystemPrompt,
    render_prompt,
)
from .scheduler import parse_arguments
from .service import RESUME_WITHOUT_PERSISTENCE, AgentService
from .types import (
    AgentErrorEvent,
    AgentOptions,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    Enter,
    PreStepContext,
    PreStepDecision,
    PromptAssembly,
    Reject,
    RequestErrorAction,
    RequestErrorContext,
    RequestProposal,
    Retry,
    StepEnded,
    StepStarted,
    TurnEnded,
    TurnStarted,
    TurnStoppingContext,
)

__all__ = [
    "CONTEXT_CLEARED",
    "CONTEXT_HEADER",
    "HARNESS_IDENTITY",
    "PROMPT_SOURCE",
    "RESUME_WITHOUT_PERSISTENCE",
    "Agent",
    "AgentBusyError",
    "AgentClosedError",
    "AgentConfig",
    "AgentConfigError",
    "AgentError",
    "AgentErrorEvent",
    "AgentOptions",
    "AgentPlugin",
    "AgentService",
    "ApprovalDecisionError",
    "ApprovalPendingError",
    "AssembleContext",
    "AssembledContext",
    "AssembledSection",
    "Enter",
    "PreStepContext",
    "PreStepDecision",
    "Prompt",
    "PromptAssembly",
    "PromptError",
    "Reject",
    "RequestErrorAction",
    "RequestErrorContext",
    "RequestProposal",
    "ResumeError",
    "Retry",
    "StepEnded",
    "StepStarted",
    "SystemPrompt",
    "TurnEnded",
    "TurnStarted",
    "TurnStoppingContext",
    "cancel_cause",
    "error_chain",
    "parse_arguments",
    "render_prompt",
]
