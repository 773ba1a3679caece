"""One curated public surface (issue 17 item 4), checked the way httpx's ``test_exported_members`` is.

- ``dsh_host`` exports what an application or a plugin needs, and no host internals;
- each public subpackage exports only what its own modules define (a type has one public home:
  the session layer's wire types are not re-exported by ``dsh_host.llm``);
- no class or function is exported by two packages, except the front door that ``dsh_host``
  re-exports from ``dsh_host.front`` on purpose;
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

PUBLIC_PACKAGES = (
    "dsh_host.session",
    "dsh_host.llm",
    "dsh_host.tools",
    "dsh_host.agent",
    "dsh_host.front",
    "dsh_host.cli",
    "dsh_host.testing",
)
FRONT_DOOR = {
    "Agent", "FunctionTool", "OutputValidationError", "RunResult", "ToolContext",
    "TurnFailedError", "replay", "tool",
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
}


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


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
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
    modules: list[ModuleType] = [dsh_host, *map(importlib.import_module, PUBLIC_PACKAGES)]
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if definable(value):
                homes.setdefault(id(value), []).append(f"{module.__name__}.{name}")
    twice = [places for places in homes.values() if len(places) > 1]
    allowed = [sorted([f"dsh_host.{n}", f"dsh_host.front.{n}"]) for n in FRONT_DOOR]
    assert sorted(sorted(p) for p in twice) == sorted(allowed)


def test_one_class_per_concept() -> None:
    import dsh_host.session
    import dsh_host.tools

    # ToolError is the exception base; the log's {name, code} record is ToolErrorData.
    assert issubclass(dsh_host.tools.ToolError, dsh_host.DshError)
    assert "ToolError" not in dsh_host.session.__all__
    assert "ToolErrorData" in dsh_host.session.__all__
    # One cancellation error: what CancelToken raises is what a tool body raises.
    assert "AbortError" not in dsh_host.tools.__all__
    token = dsh_host.CancelToken()
    token.abort("user")
    with pytest.raises(dsh_host.AbortError) as raised:
        token.throw_if_aborted()
    assert raised.value.reason == "user" and str(raised.value) == "aborted: 'user'"
    assert str(dsh_host.AbortError()) == "tool call aborted"
    assert not hasattr(dsh_host.errors, "AbortedError")  # one name for one concept


def test_dead_code_and_private_copies_are_gone() -> None:
    import dsh_builtin_tools.bash

    import dsh_host.jsonsafe
    import dsh_host.llm.types
    import dsh_host.loader

    assert not hasattr(dsh_host.loader, "_EnvValue")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dsh_builtin_tools._sandbox")  # a re-export shim of the contract
    # One JSON.stringify number formatter, shared by the retry policy text and bash's markers.
    js_number = dsh_host.jsonsafe.js_number
    assert vars(dsh_builtin_tools.bash)["js_number"] is js_number
    assert vars(dsh_host.llm.types)["js_number"] is js_number
    assert [js_number(v) for v in (1500.0, 0.1, 2**60, 7)] == ["1500", "0.1", str(2**60), "7"]


def test_the_sdk_exports_a_typed_key_for_every_service() -> None:
    """``dsh_host.sdk`` is the plugin author's surface: every name resolves to a ``dsh_host``
    definition, and every service a shipped row provides has its typed key there."""
    import dsh_host.sdk as sdk
    from dsh_host.context import ServiceKey
    from dsh_host.shipped_plugins import SHIPPED_PLUGINS

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
        "assert loaded == ['dsh_host.lazy', 'dsh_host.sdk'], loaded\n"
        "from dsh_host.sdk import PersistenceService\n"
        "assert not any(m.startswith(('dsh_host.agent', 'dsh_host.llm', 'dsh_host.tools'))"
        " for m in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
