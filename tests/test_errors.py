"""The exception tree drawn in ``dsh_host/errors.py`` is the real one (one error tree).

Every ``DshError`` subclass in ``dsh_host`` and the shipped plugins appears exactly once in the
drawing, under its real parent, with the module that defines it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import dsh_host
import dsh_host.errors
from dsh_host.errors import DshError

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>\w+)\s+(?P<module>[\w.]+)$")


def import_everything() -> None:
    for info in pkgutil.walk_packages(dsh_host.__path__, "dsh_host."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    for package_dir in sorted(PLUGINS.iterdir()):
        if (package_dir / "__init__.py").exists():
            package = importlib.import_module(package_dir.name)
            for info in pkgutil.walk_packages(package.__path__, f"{package_dir.name}."):
                importlib.import_module(info.name)


def drawn_tree() -> dict[str, tuple[str | None, str]]:
    """name -> (parent name, module) as drawn in the docstring."""
    doc = dsh_host.errors.__doc__ or ""
    block = doc.split("::\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    out: dict[str, tuple[str | None, str]] = {}
    stack: list[tuple[int, str]] = []
    for raw in block.splitlines():
        match = LINE.match(raw.strip("\n")[4:])
        assert match, f"cannot read tree line {raw!r}"
        depth = len(match.group("indent")) // 4
        name = match.group("name")
        while stack and stack[-1][0] >= depth:
            stack.pop()
        assert name not in out, f"{name} is drawn twice"
        out[name] = (stack[-1][1] if stack else None, match.group("module"))
        stack.append((depth, name))
    return out


def real_tree() -> dict[str, tuple[str | None, str]]:
    out: dict[str, tuple[str | None, str]] = {"DshError": (None, "dsh_host.errors")}
    todo = [DshError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if not sub.__module__.startswith("dsh_"):
                continue  # test-local subclasses
            parent = next(b for b in sub.__mro__[1:] if issubclass(b, DshError))
            out[sub.__name__] = (parent.__name__, sub.__module__)
            todo.append(sub)
    return out


def test_drawn_tree_matches_the_code() -> None:
    import_everything()
    drawn, real = drawn_tree(), real_tree()
    missing = sorted(set(real) - set(drawn))
    stale = sorted(set(drawn) - set(real))
    assert not missing, f"add to the tree in dsh_host/errors.py: {missing}"
    assert not stale, f"remove from the tree in dsh_host/errors.py: {stale}"
    wrong = {name: (drawn[name], real[name]) for name in real if drawn[name] != real[name]}
    assert not wrong, f"drawn (parent, module) differs from the code: {wrong}"
