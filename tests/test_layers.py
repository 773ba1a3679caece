"""Layers point down: host → session → llm | tools → agent → front → server → cli.

``dsh_host.testing`` (the test doubles for plugin authors) sits above them all: it may use any
layer, and no module of ``dsh_host`` imports it.

An import of a higher layer (or of a peer: llm and tools do not know each other) is named here
with the file and line, so the offending edge is obvious. Plugins import only ``dsh_host`` and
themselves: they meet other plugins through services, never by import.

One deliberate exception: the package ``dsh_host/__init__.py`` (host layer) re-exports the front
door (``Agent``, ``tool``, ``ToolContext`` from ``dsh_host.front``) *lazily*, from a module
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

LAYERS = {"host": 0, "session": 1, "llm": 2, "tools": 2, "agent": 3, "front": 4, "server": 5, "cli": 6,
          "testing": 7}  # dsh_host.testing: test doubles over every layer; nothing imports it


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
            if node.level == 1 and (node.module or "").split(".")[0] == "front":
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
        "assert not any(m.startswith(('dsh_host.front', 'dsh_host.agent')) for m in sys.modules)\n"
        "from dsh_host import Agent, ToolContext, tool\n"
        "assert Agent.__module__ == 'dsh_host.front.agent' and 'dsh_host.front' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
