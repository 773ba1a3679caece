"""dsh: an agent harness whose append-only session log never lies about what happened.

The host layer (this package's top level) is a small Cordis-style plugin host:
a :class:`Context` per plugin row, services with typed keys (:class:`ServiceKey`),
events with typed keys (:class:`Emit`, :class:`Waterfall`...; each layer's keys are
exported by its subpackage, e.g. ``dsh_host.tools.TOOLS_EXECUTE``), and a YAML loader
over the ``dsh.plugins`` entry-point group. A plugin imports all of it, and every service and
event key, from one module: :mod:`dsh_host.sdk`.

Every name is re-exported lazily (the front door ``Agent``, ``tool``,
``ToolContext``, ``RunResult`` from :mod:`dsh_host.front` too): importing
``dsh_host`` loads nothing until a name is used, so the command line starts
fast.
"""

from typing import TYPE_CHECKING

#: The distribution's version (pyproject.toml reads it from here): ``dsh --version`` and the
#: model adapter's User-Agent print it without the ~35 ms of ``importlib.metadata``.
__version__ = "0.1.0"

from .lazy import lazy_names

if TYPE_CHECKING:
    from .bus import Emit, EventMode, Next, Parallel, Serial, StreamNext, StreamWaterfall, Waterfall
    from .cancel import CancelToken
    from .context import Context, ServiceKey
    from .errors import AbortError, ConfigError, DshError
    from .front import (
        Agent,
        FunctionTool,
        OutputValidationError,
        RunResult,
        ToolContext,
        TurnFailedError,
        replay,
        tool,
    )
    from .loader import PluginHost, Row, load_rows, open_host, open_host_from_yaml
    from .plugin import NoConfig, Plugin

#: Where each re-exported name is defined. Every one is imported on first use, so
#: ``import dsh_host.cli`` (``dsh --help``) does not pay for the loader or the front door.
_DEFINED_IN = {
    **dict.fromkeys(
        (
            "Emit",
            "EventMode",
            "Next",
            "Parallel",
            "Serial",
            "StreamNext",
            "StreamWaterfall",
            "Waterfall",
        ),
        "bus",
    ),
    "CancelToken": "cancel",
    **dict.fromkeys(("Context", "ServiceKey"), "context"),
    **dict.fromkeys(("AbortError", "ConfigError", "DshError"), "errors"),
    **dict.fromkeys(
        (
            "Agent",
            "FunctionTool",
            "OutputValidationError",
            "RunResult",
            "ToolContext",
            "TurnFailedError",
            "replay",
            "tool",
        ),
        "front",
    ),
    **dict.fromkeys(
        ("PluginHost", "Row", "load_rows", "open_host", "open_host_from_yaml"), "loader"
    ),
    **dict.fromkeys(("NoConfig", "Plugin"), "plugin"),
}


__getattr__ = lazy_names(__name__, _DEFINED_IN)


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
    "TurnFailedError",
    "Waterfall",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "replay",
    "tool",
]
