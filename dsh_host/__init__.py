"""dsh: an agent harness whose append-only session log never lies about what happened.

The host layer (this package's top level) is a small Cordis-style plugin host:
a :class:`Context` per plugin row, services, a declared-mode event bus, and a
YAML loader over the ``dsh.plugins`` entry-point group.

Every name is re-exported lazily (the front door ``Agent``, ``tool``,
``ToolContext``, ``RunResult`` from :mod:`dsh_host.front` too): importing
``dsh_host`` loads nothing until a name is used, so the command line starts
fast.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bus import EventBus, EventMode, EventSpec
    from .cancel import CancelToken
    from .context import Context, Fiber, FiberState, Host
    from .errors import DshError
    from .front import Agent, FunctionTool, OutputValidationError, RunResult, ToolContext, tool
    from .loader import (
        LocatedRow,
        PluginHost,
        Row,
        load_rows,
        open_host,
        open_host_from_yaml,
        parse_rows,
    )
    from .plugin import NoConfig, Plugin, PluginMeta, hookimpl, hookspec

#: Where each re-exported name is defined. Every one is imported on first use, so
#: ``import dsh_host.cli`` (``dsh --help``) does not pay for the loader or the front door.
_DEFINED_IN = {
    **dict.fromkeys(("EventBus", "EventMode", "EventSpec"), "bus"),
    "CancelToken": "cancel",
    **dict.fromkeys(("Context", "Fiber", "FiberState", "Host"), "context"),
    "DshError": "errors",
    **dict.fromkeys(
        ("Agent", "FunctionTool", "OutputValidationError", "RunResult", "ToolContext", "tool"),
        "front",
    ),
    **dict.fromkeys(
        ("LocatedRow", "PluginHost", "Row", "load_rows", "open_host", "open_host_from_yaml",
         "parse_rows"),
        "loader",
    ),
    **dict.fromkeys(("NoConfig", "Plugin", "PluginMeta", "hookimpl", "hookspec"), "plugin"),
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'dsh_host' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "Agent",
    "CancelToken",
    "Context",
    "DshError",
    "EventBus",
    "EventMode",
    "EventSpec",
    "Fiber",
    "FiberState",
    "FunctionTool",
    "Host",
    "LocatedRow",
    "NoConfig",
    "OutputValidationError",
    "Plugin",
    "PluginHost",
    "PluginMeta",
    "Row",
    "RunResult",
    "ToolContext",
    "hookimpl",
    "hookspec",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "parse_rows",
    "tool",
]
