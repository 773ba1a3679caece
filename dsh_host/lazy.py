"""A package's public names, each imported from its defining module on first use (PEP 562)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from importlib import import_module
from typing import Any


def lazy_names(
    package: str, defined_in: Mapping[str, str], submodules: Collection[str] = ()
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from ``package.<defined_in[name]>``
    (a name in ``submodules`` is that submodule itself), and is then kept in the package's
    globals, so later lookups skip the function."""

    def __getattr__(name: str) -> Any:
        if name in submodules:
            value: Any = import_module(f".{name}", package)
        else:
            module = defined_in.get(name)
            if module is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
