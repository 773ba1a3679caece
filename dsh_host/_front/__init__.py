"""The front door: typed tools from functions, an ``Agent`` in a few lines, typed events.

``from dsh_host import Agent, tool, ToolContext`` re-exports this package
lazily. It composes the plugin host (the same rows a YAML composition lists)
and sits above the agent layer; the CLI sits above it.

Every name is imported on first use, like ``dsh_host``'s: ``dsh run --help`` reads
:data:`MODEL_SPECS` without loading the agent.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from . import events
    from .agent import CLI_DEFAULT, FINAL_RESULT, Agent, Answerer, EventStream, RunResult
    from .errors import OutputValidationError, TurnFailedError
    from .guardrails import (
        Guardrail,
        GuardrailFunctionOutput,
        GuardrailTripwireTriggered,
        ToolCallData,
        input_guardrail,
        output_guardrail,
        tool_guardrail,
    )
    from .models import MODEL_SPECS, ModelChoice, parse_model
    from .replay import replay
    from .tools import FunctionTool, ToolContext, tool

#: Where each exported name is defined (``events`` is the module itself).
_DEFINED_IN = {
    **dict.fromkeys(
        ("CLI_DEFAULT", "FINAL_RESULT", "Agent", "Answerer", "EventStream", "RunResult"), "agent"
    ),
    **dict.fromkeys(("OutputValidationError", "TurnFailedError"), "errors"),
    **dict.fromkeys(
        (
            "Guardrail",
            "GuardrailFunctionOutput",
            "GuardrailTripwireTriggered",
            "ToolCallData",
            "input_guardrail",
            "output_guardrail",
            "tool_guardrail",
        ),
        "guardrails",
    ),
    **dict.fromkeys(("MODEL_SPECS", "ModelChoice", "parse_model"), "models"),
    **dict.fromkeys(("FunctionTool", "ToolContext", "tool"), "tools"),
    "replay": "replay",
}


__getattr__ = lazy_names(__name__, _DEFINED_IN, ("events",))


__all__ = [
    "CLI_DEFAULT",
    "FINAL_RESULT",
    "MODEL_SPECS",
    "Agent",
    "Answerer",
    "EventStream",
    "FunctionTool",
    "Guardrail",
    "GuardrailFunctionOutput",
    "GuardrailTripwireTriggered",
    "ModelChoice",
    "OutputValidationError",
    "RunResult",
    "ToolCallData",
    "ToolContext",
    "TurnFailedError",
    "events",
    "input_guardrail",
    "output_guardrail",
    "parse_model",
    "replay",
    "tool",
    "tool_guardrail",
]
