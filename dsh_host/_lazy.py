"""A package's public names, each imported from its defining module on first use (PEP 562).

The one implementation of lazy re-exports: ``dsh_host``, ``dsh_host._front`` and the plugin
surface ``dsh_host.sdk`` each list their names once and hand the table to :func:`lazy_names`;
the sdk exports it, so a plugin package (the JSONL store's) does the same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from importlib import import_module
from typing import Any


def lazy_names(
    package: str,
    defined_in: Mapping[str, str],
    submodules: Collection[str] | Mapping[str, str] = (),
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from the module
    ``defined_in[name]`` (relative to ``package`` unless it is a full ``dsh_host....`` name); a
    name in ``submodules`` is a module itself (``package.<name>``, or the module a mapping
    gives). The value is then kept in the package's globals, so later lookups skip the
    function."""

    def _module(name: str) -> Any:
        return import_module(name if name.startswith("dsh_host") else f".{name}", package)

    def __getattr__(name: str) -> Any:
        if name in submodules:
            target = submodules[name] if isinstance(submodules, Mapping) else name
            value: Any = _module(target)
        else:
            module = defined_in.get(name)
            if module is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
