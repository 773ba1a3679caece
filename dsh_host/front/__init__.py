"""The front door: typed tools from functions, an ``Agent`` in a few lines, typed events.

``from dsh_host import Agent, tool, ToolContext`` re-exports this package
lazily. It composes the plugin host (the same rows a YAML composition lists)
and sits above the agent layer; the CLI sits above it.
"""

from . import events
from .agent import CLI_DEFAULT, FINAL_RESULT, Agent, Answerer, EventStream, RunResult
from .errors import OutputValidationError
from .models import MODEL_SPECS, ModelChoice, parse_model
from .tools import FunctionTool, ToolContext, tool

__all__ = [
    "CLI_DEFAULT",
    "FINAL_RESULT",
    "MODEL_SPECS",
    "Agent",
    "Answerer",
    "EventStream",
    "FunctionTool",
    "ModelChoice",
    "OutputValidationError",
    "RunResult",
    "ToolContext",
    "events",
    "parse_model",
    "tool",
]
