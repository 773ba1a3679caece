"""One curated public surface (issue 17 item 4), checked the way httpx's ``test_exported_members`` is.

The public modules are ``dsh_host`` (applications), ``dsh_host.sdk`` (plugin authors),
``dsh_host.testing`` (test doubles) and ``dsh_host.errors`` (the error catalogue); every other
module lives under a ``_``-prefixed name, as pydantic-ai's and httpx's internals do, so what may
change without notice is visible in the import itself (issue 33). Inside, the private packages
still keep one home per name:

- ``dsh_host`` exports what an application or a plugin needs, and no host internals;
- each public subpackage exports only what its own modules define (a type has one public home:
  the session layer's wire types are not re-exported by ``dsh_host._llm``);
- no class or function is exported by two packages, except the front door that ``dsh_host``
  re-exports from ``dsh_host._front`` on purpose;
- one class per concept: one ``ToolError`` (the exception), one cancellation error;
- ``dsh_host.sdk`` defines nothing: it re-exports, for plugin authors, what plugins use (so it is
  not one of the "homes" above), with a typed key for every service.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import pytest

import dsh_host
import dsh_host.errors

#: The private subpackages: each still exports only what its own modules define.
PACKAGES = (
    "dsh_host._session",
    "dsh_host._llm",
    "dsh_host._tools",
    "dsh_host._agent",
    "dsh_host._front",
    "dsh_host._cli",
    "dsh_host.testing",
)
#: The modules of ``dsh_host`` whose names carry no ``_``: its public surface.
PUBLIC_MODULES = {"dsh_host", "dsh_host.sdk", "dsh_host.testing", "dsh_host.errors"}
FRONT_DOOR = {
    "Agent", "FunctionTool", "Guardrail", "GuardrailFunctionOutput", "GuardrailTripwireTriggered",
    "OutputValidationError", "RunResult", "ToolCallData", "ToolContext", "TurnFailedError",
    "input_guardrail", "output_guardrail", "replay", "tool", "tool_guardrail",
}
#: The reconcile verdicts a ``@tool(reconcile=...)`` function returns (``dsh_host._tools``).
VERDICTS = {"Done", "NotDone", "ReconcileVerdict", "Unknown"}
#: Audit, fork and replay of a stored session, and where each is defined.
STORED_SESSION_TOOLS = {
    "attest": "_session",
    "verify_export": "_session",
    "effects_after": "_session",
    "fork_stored": "_persistence",
    "replay_stored": "_agent",
}

DSH_HOST = {
    # plugins
    "Context",
    "Plugin",
    "NoConfig",
    "ServiceKey",
    "Emit",
    "Parallel",
    "Serial",
    "Waterfall",
    "StreamWaterfall",
    "Next",
    "StreamNext",
    "EventMode",
    # applications
    "PluginHost",
    "Row",
    "load_rows",
    "open_host",
    "open_host_from_yaml",
    "CancelToken",
    "DshError",
    "ConfigError",
    "AbortError",
    *FRONT_DOOR,
    *VERDICTS,
    "events",  # the front door's typed stream events, a module
    *STORED_SESSION_TOOLS,
}


def test_every_module_outside_the_public_surface_is_private() -> None:
    """Search, not a list: every module file of the package, by its dotted name."""
    from pathlib import Path

    root = Path(dsh_host.__file__).parent
    public = []
    for path in sorted(root.rglob("*.py")):
        parts = ["dsh_host", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts[1:]):
            public.append(".".join(parts))
    assert set(public) == PUBLIC_MODULES


def definable(value: object) -> bool:
    """A class or function of ours (an alias of a builtin, ``MessageId = str``, is not)."""
    is_def = inspect.isclass(value) or inspect.isfunction(value)
    return is_def and getattr(value, "__module__", "") != "builtins"


def test_dsh_host_exports_what_plugins_and_applications_need() -> None:
    assert set(dsh_host.__all__) == DSH_HOST
    assert len(dsh_host.__all__) == len(set(dsh_host.__all__))
    for name in ("EventBus", "Fiber", "FiberState", "Host", "hookspec", "hookimpl", "EventSpec"):
        assert name not in dsh_host.__all__
    for name in dsh_host.__all__:
        value = getattr(dsh_host, name)
        if definable(value):
            assert value.__module__.startswith("dsh_host"), name


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_exports_only_what_it_defines(package: str) -> None:
    module = importlib.import_module(package)
    assert len(module.__all__) == len(set(module.__all__)), "an __all__ lists a name twice"
    foreign = []
    for name in module.__all__:
        value = getattr(module, name)  # every listed name exists
        if definable(value) and not value.__module__.startswith(package + "."):
            if value.__module__ != package:
                foreign.append(f"{name} (from {value.__module__})")
    assert not foreign, f"{package} re-exports: {', '.join(foreign)}"


def test_no_class_or_function_has_two_public_homes() -> None:
    homes: dict[int, list[str]] = {}
    modules: list[ModuleType] = [dsh_host, *map(importlib.import_module, PACKAGES)]
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if definable(value):
                homes.setdefault(id(value), []).append(f"{module.__name__}.{name}")
    twice = [places for places in homes.values() if len(places) > 1]
    allowed = [sorted([f"dsh_host.{n}", f"dsh_host._front.{n}"]) for n in FRONT_DOOR]
    allowed += [
        sorted([f"dsh_host.{n}", f"dsh_host._tools.{n}"])
        for n in VERDICTS
        if definable(getattr(dsh_host, n))  # ReconcileVerdict is a type alias
    ]
    allowed += [
        sorted([f"dsh_host.{n}", f"dsh_host.{package}.{n}"])
        for n, package in STORED_SESSION_TOOLS.items()
        if n in getattr(importlib.import_module(f"dsh_host.{package}"), "__all__", ())
    ]
    assert sorted(sorted(p) for p in twice) == sorted(allowed)


def test_one_class_per_concept() -> None:
    import dsh_host._session
    import dsh_host._tools

    # ToolError is the exception base; the log's {name, code} record is ToolErrorData.
    assert issubclass(dsh_host._tools.ToolError, dsh_host.DshError)
    assert "ToolError" not in dsh_host._session.__all__
    assert "ToolErrorData" in dsh_host._session.__all__
    # One cancellation error: what CancelToken raises is what a tool body raises.
    assert "AbortError" not in dsh_host._tools.__all__
    token = dsh_host.CancelToken()
    token.abort("user")
    with pytest.raises(dsh_host.AbortError) as raised:
        token.throw_if_aborted()
    assert raised.value.reason == "user" and str(raised.value) == "aborted: 'user'"
    assert str(dsh_host.AbortError()) == "tool call aborted"
    assert not hasattr(dsh_host.errors, "AbortedError")  # one name for one concept


def test_dead_code_and_private_copies_are_gone() -> None:
    import dsh_builtin_tools.bash

    import dsh_host._jsonsafe
    import dsh_host._llm.types
    import dsh_host._loader

    assert not hasattr(dsh_host._loader, "_EnvValue")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dsh_builtin_tools._sandbox")  # a re-export shim of the contract
    # One JSON.stringify number formatter, shared by the retry policy text and bash's markers.
    js_number = dsh_host._jsonsafe.js_number
    assert vars(dsh_builtin_tools.bash)["js_number"] is js_number
    assert vars(dsh_host._llm.types)["js_number"] is js_number
    assert [js_number(v) for v in (1500.0, 0.1, 2**60, 7)] == ["1500", "0.1", str(2**60), "7"]


def test_the_sdk_exports_a_typed_key_for_every_service() -> None:
    """``dsh_host.sdk`` is the plugin author's surface: every name resolves to a ``dsh_host``
    definition, and every service a shipped row provides has its typed key there."""
    import dsh_host.sdk as sdk
    from dsh_host._context import ServiceKey
    from dsh_host._shipped_plugins import SHIPPED_PLUGINS

    assert len(sdk.__all__) == len(set(sdk.__all__))
    for name in sdk.__all__:
        value = getattr(sdk, name)
        if definable(value):
            assert value.__module__.startswith("dsh_host."), name
    keys = {
        value.name
        for value in (getattr(sdk, name) for name in sdk.__all__)
        if isinstance(value, ServiceKey)
    }
    provided = {service for declared in SHIPPED_PLUGINS.values() for service in declared.provides}
    assert provided <= keys, sorted(provided - keys)
    with pytest.raises(AttributeError, match="no attribute 'Fiber'"):
        sdk.Fiber  # noqa: B018  (host internals stay out)


def test_the_sdk_lists_the_same_names_for_mypy_and_at_run_time() -> None:
    """Its ``if TYPE_CHECKING:`` imports (what mypy reads) and ``_DEFINED_IN`` (what runs) must
    agree name for name and module for module, or a plugin type-checks against one thing and
    imports another."""
    import ast
    from pathlib import Path

    import dsh_host.sdk as sdk

    tree = ast.parse(Path(sdk.__file__).read_text(encoding="utf-8"))
    checked: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom) and sub.module is not None:
                    for alias in sub.names:
                        assert alias.asname == alias.name, alias.name  # an explicit re-export
                        module = sub.module if alias.name != "offload" else f"{sub.module}.offload"
                        checked[alias.name] = module
    at_run_time = {
        name: module for module, names in sdk._DEFINED_IN.items() for name in names
    } | sdk._SUBMODULES
    assert checked == at_run_time


def test_importing_the_sdk_loads_no_layer() -> None:
    """A storage plugin that ``dsh sessions list`` boots imports the sdk: that must not load
    the agent, the tools or the model layer (names load on first use)."""
    import subprocess
    import sys

    code = (
        "import sys, dsh_host.sdk\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('dsh_host.'))\n"
        "assert loaded == ['dsh_host._lazy', 'dsh_host.sdk'], loaded\n"
        "from dsh_host.sdk import PersistenceService\n"
        "assert not any(m.startswith(('dsh_host._agent', 'dsh_host._llm', 'dsh_host._tools'))"
        " for m in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
