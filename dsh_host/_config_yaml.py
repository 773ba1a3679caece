"""A composition's YAML, parsed: each row's plain data and line, and the environment it read.

This is the only module that imports PyYAML (``yaml.reader`` alone compiles a large regex at
import), so a command whose composition is remembered unchanged (:mod:`._composition_cache`,
docs/decisions.md D44) does not load it. The only custom tag is ``!env NAME`` /
``!env [NAME, default]``; nothing in a composition can evaluate code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from ._loader import where_of
from .errors import ConfigError

__all__ = ["ComposedRows", "compose_rows"]

T = TypeVar("T")

#: Each row's data (as YAML built it), its 0-based line and what ``each`` made of it, then every
#: variable ``!env`` read with the value it had (None: unset).
ComposedRows = tuple[list[tuple[Any, int, T]], dict[str, str | None]]


class _Loader(yaml.SafeLoader):
    """SafeLoader plus ``!env``; any other tag stays an error."""

    #: The variables ``!env`` read while constructing (set per row by :func:`compose_rows`).
    env_read: dict[str, str | None]


def _construct_env(loader: _Loader, node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        name = loader.construct_scalar(node)
        default: str | None = None
        has_default = False
    elif isinstance(node, yaml.SequenceNode):
        items = loader.construct_sequence(node)
        if len(items) != 2 or not all(isinstance(i, str) for i in items):
            raise ConfigError(
                f"line {node.start_mark.line + 1}: !env takes NAME or [NAME, default] "
                f"(two strings), got {items!r}"
            )
        name, default = items
        has_default = True
    else:
        raise ConfigError(f"line {node.start_mark.line + 1}: !env takes NAME or [NAME, default]")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"line {node.start_mark.line + 1}: !env needs a variable name")
    value = os.environ.get(name)
    loader.env_read[name] = value
    if value is None:
        if has_default:
            return str(default)
        raise ConfigError(
            f"line {node.start_mark.line + 1}: environment variable {name} is not set "
            f"(used by `!env {name}`); set it or write `!env [{name}, default]`"
        )
    return value


_Loader.add_constructor("!env", _construct_env)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``:3:1: malformed YAML: <problem> (<context>)``, placed in the file it came from.

    PyYAML's own text names the stream it was handed (``"<unicode string>"``), not the file.
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return f": malformed YAML: {exc}"
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else str(problem)
    return f":{mark.line + 1}:{mark.column + 1}: malformed YAML: {detail}"


def compose_rows(text: str, source: str, each: Callable[[Any, str], T]) -> ComposedRows[T]:
    """Parse a composition's text into each row's data and line, calling ``each(data, where)``
    on every row as it is built (its errors come in row order, before a later row is read);
    every error names ``source`` and the line (a :class:`ConfigError`)."""
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}{_yaml_problem(exc)}") from None
    if node is None or not isinstance(node, yaml.SequenceNode):
        raise ConfigError(f"config {source} must be a top-level YAML array of entries")
    rows: list[tuple[Any, int, T]] = []
    env_read: dict[str, str | None] = {}
    for index, item in enumerate(node.value):
        line = item.start_mark.line
        where = where_of(source, line, index)
        loader = _Loader("")
        loader.env_read = env_read
        try:
            data = loader.construct_document(item)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        finally:
            loader.dispose()
        rows.append((data, line, each(data, where)))
    return rows, env_read
