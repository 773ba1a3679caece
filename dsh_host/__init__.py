"""dsh: an agent harness whose append-only session log never lies about what happened.

The host layer (this package's top level) is a small Cordis-style plugin host:
a :class:`Context` per plugin row, services, a declared-mode event bus, and a
YAML loader over the ``dsh.plugins`` entry-point group.

The front door (``Agent``, ``tool``, ``ToolContext``, ``RunResult``, from
:mod:`dsh_host.front`) is re-exported lazily: importing ``dsh_host`` does not
load the agent layer.
"""

from typing import TYPE_CHECKING, Any

from .bus import EventBus, EventMode, EventSpec
from .cancel import CancelToken
from .context import Context, Fiber, FiberState, Host
from .errors import DshError
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

if TYPE_CHECKING:
    from .front import Agent, FunctionTool, OutputValidationError, RunResult, ToolContext, tool

_FRONT_DOOR = frozenset(
    {"Agent", "FunctionTool", "OutputValidationError", "RunResult", "ToolContext", "tool"}
)


def __getattr__(name: str) -> Any:
    if name in _FRONT_DOOR:
        from . import front  # lazy: the front door composes the layers above this one

        return getattr(front, name)
    raise AttributeError(f"module 'dsh_host' has no attribute {name!r}")


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
