"""One curated public surface (issue 17 item 4), checked the way httpx's ``test_exported_members`` is.

- ``dsh_host`` exports what an application or a plugin needs, and no host internals;
- each public subpackage exports only what its own modules define (a type has one public home:
  the session layer's wire types are not re-exported by ``dsh_host.llm``);
- no class or function is exported by two packages, except the front door that ``dsh_host``
  re-exports from ``dsh_host.front`` on purpose;
- one class per concept: one ``ToolError`` (the exception), one cancellation error.
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
    "TurnFailedError", "tool",
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
