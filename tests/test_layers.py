"""Layers point down: host → session → persistence → llm | tools → agent → sdk → front → server
→ cli (each a private ``_``-prefixed package of ``dsh_host``).

``dsh_host.testing`` (the test doubles for plugin authors) sits above them all: it may use any
layer, and no module of ``dsh_host`` imports it.

An import of a higher layer (or of a peer: llm and tools do not know each other) is named here
with the file and line, so the offending edge is obvious. Plugins import only ``dsh_host.sdk``
and themselves: they meet other plugins through services, never by import, and the host modules
behind the sdk can move without breaking one.

One deliberate exception: the package ``dsh_host/__init__.py`` (host layer) re-exports the front
door (``Agent``, ``tool``, ``ToolContext`` from ``dsh_host._front``) *lazily*, from a module
``__getattr__`` (plus an ``if TYPE_CHECKING:`` import for type checkers). Nothing of the front door
is imported when ``dsh_host`` or any lower layer is, so the layering of what actually loads is
unchanged; every other import in that file is checked like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOST = REPO / "dsh_host"

#: ``sdk`` (the plugin author's surface, :mod:`dsh_host.sdk`) re-exports from every layer below
#: the front door, so it sits above the agent; nothing in ``dsh_host`` imports it.
LAYERS = {
    "host": 0,
    "_session": 1,
    "_persistence": 2,
    "_llm": 3,
    "_tools": 3,
    "_agent": 4,
    "sdk": 5,
    "_front": 6,
    "_server": 7,
    "_cli": 8,
    "testing": 9,  # dsh_host.testing: test doubles over every layer; nothing imports it
}


def layer_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "dsh_host":
        return None
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "host"


def lazy_front_door_imports(tree: ast.Module) -> set[int]:
    """ids of the import nodes of ``__getattr__`` / ``if TYPE_CHECKING:`` at module level."""
    lazy: set[int] = set()
    for node in tree.body:
        is_getattr = isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        is_type_checking = (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        )
        if is_getattr or is_type_checking:
            lazy.update(id(sub) for sub in ast.walk(node) if isinstance(sub, ast.ImportFrom))
    return lazy


def imported_modules(
    path: Path, package: str, *, lazy_front: bool = False
) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = lazy_front_door_imports(tree) if lazy_front else set()
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip and isinstance(node, ast.ImportFrom):
            if node.level == 1 and (node.module or "").startswith("_"):
                continue
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.append((node.lineno, module))
    return out


def module_name(path: Path, root: Path) -> tuple[str, str]:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    package = ".".join(parts[:-1])  # the package a relative import starts from
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts), package


def test_dsh_host_layers_import_only_downward() -> None:
    problems = []
    for path in sorted(HOST.rglob("*.py")):
        if path.name == "__main__.py":  # `python -m dsh_host` is the CLI's entry, by design
            continue
        name, package = module_name(path, REPO)
        own = layer_of_module(name)
        assert own is not None
        lazy_front = path == HOST / "__init__.py"
        for line, target in imported_modules(path, package, lazy_front=lazy_front):
            other = layer_of_module(target)
            if other is None or other == own:
                continue
            if LAYERS[other] >= LAYERS[own]:
                problems.append(f"{path.relative_to(REPO)}:{line}: {own} imports {target} ({other})")
    assert problems == []


@pytest.mark.parametrize(
    "plugin", sorted(p.name for p in (REPO / "plugins").iterdir() if (p / "__init__.py").exists())
)
def test_plugins_never_import_each_other(plugin: str) -> None:
    root = REPO / "plugins"
    problems = []
    for path in sorted((root / plugin).rglob("*.py")):
        _name, package = module_name(path, root)
        for line, target in imported_modules(path, package):
            head = target.split(".")[0]
            if head.startswith("dsh_") and head not in ("dsh_host", plugin):
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert problems == []


def test_importing_dsh_host_does_not_load_the_front_door() -> None:
    code = (
        "import sys, dsh_host\n"
        "assert not any(m.startswith(('dsh_host._front', 'dsh_host._agent')) for m in sys.modules)\n"
        "from dsh_host import Agent, ToolContext, tool\n"
        "assert Agent.__module__ == 'dsh_host._front.agent' and 'dsh_host._front' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr


#: What a shipped plugin may import of ``dsh_host``: the plugin author's surface, nothing else
#: (issue 33: the plugins reached 49 host modules before).
PLUGIN_SURFACE = {"dsh_host.sdk"}


def is_plugin_code(path: Path) -> bool:
    """A plugin's own modules; its tests (if it ships any) are not plugin code."""
    return "tests" not in path.parts and not path.name.startswith("test_")


@pytest.mark.parametrize(
    "plugin", sorted(p.name for p in (REPO / "plugins").iterdir() if (p / "__init__.py").exists())
)
def test_plugins_import_only_the_sdk_of_the_host(plugin: str) -> None:
    root = REPO / "plugins"
    problems = []
    for path in sorted((root / plugin).rglob("*.py")):
        if not is_plugin_code(path):
            continue
        _name, package = module_name(path, root)
        for line, target in imported_modules(path, package):
            if target.split(".")[0] == "dsh_host" and target not in PLUGIN_SURFACE:
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert problems == [], "import these names from dsh_host.sdk instead"


def test_the_sdk_is_imported_by_no_host_module() -> None:
    """The sdk is for plugins; a host module importing it would import every layer."""
    problems = []
    for path in sorted(HOST.rglob("*.py")):
        if path == HOST / "sdk.py":
            continue
        _name, package = module_name(path, REPO)
        for line, target in imported_modules(path, package):
            if target == "dsh_host.sdk" or target.startswith("dsh_host.sdk."):
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert problems == []


def service_names() -> set[str]:
    from dsh_host._shipped_plugins import SHIPPED_PLUGINS

    return {service for declared in SHIPPED_PLUGINS.values() for service in declared.provides}


def test_host_and_plugin_code_reach_services_by_typed_key() -> None:
    """``ctx.get(APPROVAL)`` is an ``ApprovalProvider | None`` to mypy; ``ctx.get("approval")``
    and ``ctx.approval`` are ``Any``. Code (not tests) uses the keys, so a renamed or retyped
    service is a type error, not a runtime surprise."""
    services = service_names()
    problems = []
    sources = [*sorted(HOST.rglob("*.py")), *sorted((REPO / "plugins").rglob("*.py"))]
    for path in sources:
        if "tests" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            receiver: ast.expr | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                first = node.args[0] if node.args else None
                by_name = isinstance(first, ast.Constant) and first.value in services
                if node.func.attr in ("get", "service", "provide") and by_name:
                    receiver = node.func.value
            elif isinstance(node, ast.Attribute) and node.attr in services:
                receiver = node.value
            if receiver is not None and ast.unparse(receiver).endswith("ctx"):
                where = f"{path.relative_to(REPO)}:{receiver.lineno}"
                problems.append(f"{where}: {ast.unparse(node)}")
    assert problems == [], "use the service's ServiceKey (dsh_host.sdk exports them all)"


def test_one_module_takes_flock() -> None:
    """Write ownership has one owner (``dsh_host/_persistence/lock.py``, exported by the sdk as
    ``SessionLock``); a storage that calls ``flock`` itself would re-implement its refusals
    (symlinks, FIFOs, a replaced inode). Search, not a list: every call in host and plugins."""
    owner = HOST / "_persistence" / "lock.py"
    calls = []
    for path in sorted([*HOST.rglob("*.py"), *(REPO / "plugins").rglob("*.py")]):
        if path == owner or "tests" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("flock", "lockf"):
                calls.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert calls == []
