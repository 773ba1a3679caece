"""dsh: an agent harness whose append-only session log never lies about what happened.

The host layer (this package's top level) is a small Cordis-style plugin host:
a :class:`Context` per plugin row, services, a declared-mode event bus, and a
YAML loader over the ``dsh.plugins`` entry-point group.
"""

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

__all__ = [
    "CancelToken",
    "Context",
    "DshError",
    "EventBus",
    "EventMode",
    "EventSpec",
    "Fiber",
    "FiberState",
    "Host",
    "LocatedRow",
    "NoConfig",
    "Plugin",
    "PluginHost",
    "PluginMeta",
    "Row",
    "hookimpl",
    "hookspec",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "parse_rows",
]
