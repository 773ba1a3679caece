"""The front door: typed tools from functions, an ``Agent`` in a few lines, typed events.

``from dsh_host import Agent, tool, ToolContext`` re-exports this package
lazily. It composes the plugin host (the same rows a YAML composition lists)
and sits above the agent layer; the CLI sits above it.

Every name is imported on first use, like ``dsh_host``'s: ``dsh run --help`` reads
:data:`MODEL_SPECS` without loading the agent.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import events
    from .agent import CLI_DEFAULT, FINAL_RESULT, Agent, Answerer, EventStream, RunResult
    from .errors import OutputValidationError
    from .models import MODEL_SPECS, ModelChoice, parse_model
    from .tools import FunctionTool, ToolContext, tool

#: Where each exported name is defined (``events`` is the module itself).
_DEFINED_IN = {
    **dict.fromkeys(
        ("CLI_DEFAULT", "FINAL_RESULT", "Agent", "Answerer", "EventStream", "RunResult"), "agent"
    ),
    "OutputValidationError": "errors",
    **dict.fromkeys(("MODEL_SPECS", "ModelChoice", "parse_model"), "models"),
    **dict.fromkeys(("FunctionTool", "ToolContext", "tool"), "tools"),
}


def __getattr__(name: str) -> Any:
    if name == "events":
        value: Any = import_module(".events", __name__)
    else:
        module = _DEFINED_IN.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


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
