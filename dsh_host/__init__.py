"""dsh: an agent harness whose append-only session log never lies about what happened.

The host layer (this package's top level) is a small Cordis-style plugin host:
a :class:`Context` per plugin row, services with typed keys (:class:`ServiceKey`),
events with typed keys (:class:`Emit`, :class:`Waterfall`...; each layer's keys are
exported by its subpackage, e.g. ``dsh_host.tools.TOOLS_EXECUTE``), and a YAML loader
over the ``dsh.plugins`` entry-point group.

The front door (``Agent``, ``tool``, ``ToolContext``, ``RunResult``, from
:mod:`dsh_host.front`) is re-exported lazily: importing ``dsh_host`` does not
load the agent layer.
"""

from typing import TYPE_CHECKING, Any

from .bus import Emit, EventMode, Next, Parallel, Serial, StreamNext, StreamWaterfall, Waterfall
from .cancel import CancelToken
from .context import Context, ServiceKey
from .errors import AbortError, ConfigError, DshError
from .loader import PluginHost, Row, load_rows, open_host, open_host_from_yaml
from .plugin import NoConfig, Plugin

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


#: What an application or a plugin needs; host internals (the bus, fibers, the loader's
#: row parsing) stay in their modules (``dsh_host.bus``, ``dsh_host.context``,
#: ``dsh_host.loader``). ``tests/host/test_public_api.py`` pins this list.
__all__ = [
    "AbortError",
    "Agent",
    "CancelToken",
    "ConfigError",
    "Context",
    "DshError",
    "Emit",
    "EventMode",
    "FunctionTool",
    "Next",
    "NoConfig",
    "OutputValidationError",
    "Parallel",
    "Plugin",
    "PluginHost",
    "Row",
    "RunResult",
    "Serial",
    "ServiceKey",
    "StreamNext",
    "StreamWaterfall",
    "ToolContext",
    "Waterfall",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "tool",
]
