"""``dsh_host._session.events`` is split by concern (issue 17): one module per concern, one face.

The package's names are what the 1,504-line module exported; each is defined in exactly one of
the concern modules, and no concern module grows back into the whole.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import dsh_host._session.events as events

CONCERNS = ("envelope", "reasons", "data", "registry", "coerce", "codec")


def test_each_name_is_defined_in_one_concern_module() -> None:
    package = Path(events.__file__).parent
    assert sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__") == sorted(CONCERNS)
    for name in events.__all__:
        value = getattr(events, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            module = value.__module__
            assert module.rsplit(".", 1)[-1] in CONCERNS, (name, module)


def test_no_concern_module_is_the_whole_again() -> None:
    for concern in CONCERNS:
        module = importlib.import_module(f"dsh_host._session.events.{concern}")
        lines = Path(module.__file__ or "").read_text(encoding="utf-8").count("\n")
        assert lines < 500, f"{concern}.py has {lines} lines: split it by concern"
