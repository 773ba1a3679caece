"""dsh: an agent harness whose append-only session log never lies about what happened.

Three public modules, and everything else private (``_``-prefixed, free to change):

* ``dsh_host`` (this package): what an application needs -- the front door (:class:`Agent`,
  :func:`tool`, guardrails, the typed stream ``events``, the reconcile verdicts), the plugin
  host (:class:`PluginHost`, :class:`Row`, :func:`open_host`), the stored-session tools
  (:func:`attest`, :func:`verify_export`, :func:`fork_stored`, :func:`effects_after`,
  :func:`replay_stored`) and the error base classes;
* :mod:`dsh_host.sdk`: what a plugin author imports -- the plugin base, a typed key for every
  service and event, the storage, tool and adapter seams;
* :mod:`dsh_host.testing`: test doubles for both; :mod:`dsh_host.errors`: every error class.

Every name is re-exported lazily: importing ``dsh_host`` loads nothing until a name is used, so
the command line starts fast.
"""
from typing import TYPE_CHECKING

#: The distribution's version (pyproject.toml reads it from here): ``dsh --version`` and the
#: model adapter's User-Agent print it without the ~35 ms of ``importlib.metadata``.
__version__ = "0.1.0"

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._agent.replay import replay_stored
    from ._bus import (
        Emit,
        EventMode,
        Next,
        Parallel,
        Serial,
        StreamNext,
        StreamWaterfall,
        Waterfall,
    )
    from ._cancel import CancelToken
    from ._context import Context, ServiceKey
    from ._front import (
        Agent,
        FunctionTool,
        Guardrail,
        GuardrailFunctionOutput,
        GuardrailTripwireTriggered,
        OutputValidationError,
        RunResult,
        ToolCallData,
        ToolContext,
        TurnFailedError,
        events,
        input_guardrail,
        output_guardrail,
        replay,
        tool,
        tool_guardrail,
    )
    from ._loader import PluginHost, Row, load_rows, open_host, open_host_from_yaml
    from ._persistence.fork import fork_stored
    from ._plugin import NoConfig, Plugin
    from ._session.audit import attest, verify_export
    from ._session.effects import effects_after
    from ._tools import Done, NotDone, ReconcileVerdict, Unknown
    from .errors import AbortError, ConfigError, DshError

#: Where each re-exported name is defined. Every one is imported on first use, so
#: ``import dsh_host._cli`` (``dsh --help``) does not pay for the loader or the front door.
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
        "_bus",
    ),
    "CancelToken": "_cancel",
    **dict.fromkeys(("Context", "ServiceKey"), "_context"),
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
            "Guardrail",
            "GuardrailFunctionOutput",
            "GuardrailTripwireTriggered",
            "ToolCallData",
            "input_guardrail",
            "output_guardrail",
            "tool_guardrail",
        ),
        "_front",
    ),
    **dict.fromkeys(("Done", "NotDone", "ReconcileVerdict", "Unknown"), "_tools"),
    # -- Audit, fork and replay of stored sessions (what `dsh sessions export --attest`,
    # `dsh sessions fork` and `dsh replay` run)
    **dict.fromkeys(("attest", "verify_export"), "_session.audit"),
    "effects_after": "_session.effects",
    "fork_stored": "_persistence.fork",
    "replay_stored": "_agent.replay",
    **dict.fromkeys(
        ("PluginHost", "Row", "load_rows", "open_host", "open_host_from_yaml"), "_loader"
    ),
    **dict.fromkeys(("NoConfig", "Plugin"), "_plugin"),
}


__getattr__ = lazy_names(__name__, _DEFINED_IN, {"events": "dsh_host._front.events"})


#: What an application or a plugin needs; host internals (the bus, fibers, the loader's
#: row parsing) stay in their modules (``dsh_host._bus``, ``dsh_host._context``,
#: ``dsh_host._loader``). ``tests/host/test_public_api.py`` pins this list.
__all__ = [
    "AbortError",
    "Agent",
    "CancelToken",
    "ConfigError",
    "Context",
    "Done",
    "DshError",
    "Emit",
    "EventMode",
    "FunctionTool",
    "Guardrail",
    "GuardrailFunctionOutput",
    "GuardrailTripwireTriggered",
    "Next",
    "NoConfig",
    "NotDone",
    "OutputValidationError",
    "Parallel",
    "Plugin",
    "PluginHost",
    "ReconcileVerdict",
    "Row",
    "RunResult",
    "Serial",
    "ServiceKey",
    "StreamNext",
    "StreamWaterfall",
    "ToolCallData",
    "ToolContext",
    "TurnFailedError",
    "Unknown",
    "Waterfall",
    "attest",
    "effects_after",
    "events",
    "fork_stored",
    "input_guardrail",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "output_guardrail",
    "replay",
    "replay_stored",
    "tool",
    "tool_guardrail",
    "verify_export",
]
