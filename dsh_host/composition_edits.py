"""Editing a composition's rows by plugin name: the one owner of "patch that row's config".

``dsh run`` (``--workspace``, ``--sandbox``, ``--approval``, ``--model``), ``dsh serve``
(``--root``, the approval policy, each session's workspace), the recorded terms a stored
session continues under, and the Python ``Agent`` all change a composition the same way: find
the enabled rows running a plugin (by canonical name, so DSH aliases such as
``@deepseek-ai/dsh-x`` match) and merge keys into their config. Rows are frozen, so an edit
is a new :class:`~dsh_host.loader.Row` with the same name, id and ``disabled`` flag; nothing
else about a row changes here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .loader import LocatedRow, Row, canonical_name

__all__ = ["config_of", "enabled", "merged", "patch", "patched", "runs"]


def runs(row: Row, plugin: str) -> bool:
    """``row`` is enabled and runs ``plugin``."""
    return not row.disabled and canonical_name(row.name) == plugin


def merged(row: Row, values: Mapping[str, Any], *, keep_existing: bool = False) -> Row:
    """``row`` with ``values`` merged into its config (``keep_existing``: a key the row
    already sets keeps its value; ``values`` are only defaults)."""
    current = dict(row.config or {})
    config = {**values, **current} if keep_existing else {**current, **values}
    return Row(name=row.name, id=row.id, config=config, disabled=row.disabled)


def enabled(located: Sequence[LocatedRow], plugin: str) -> list[int]:
    """The indexes of the enabled rows running ``plugin``, in order."""
    return [i for i, entry in enumerate(located) if runs(entry.row, plugin)]


def config_of(located: Sequence[LocatedRow], plugin: str) -> dict[str, Any] | None:
    """A copy of the config of the first enabled row running ``plugin`` (None: no such row)."""
    hits = enabled(located, plugin)
    return dict(located[hits[0]].row.config or {}) if hits else None


def patch(
    located: list[LocatedRow],
    plugin: str,
    values: Mapping[str, Any],
    *,
    keep_existing: bool = False,
) -> int:
    """Merge ``values`` into every enabled row running ``plugin``, in place; how many rows
    were patched (0: the composition has no such row; the caller decides if that is an
    error)."""
    hits = enabled(located, plugin)
    for index in hits:
        entry = located[index]
        located[index] = replace(entry, row=merged(entry.row, values, keep_existing=keep_existing))
    return len(hits)


def patched(
    located: Sequence[LocatedRow], plugin: str, values: Mapping[str, Any]
) -> list[LocatedRow]:
    """A copy of ``located`` with :func:`patch` applied (``located`` is left as it was)."""
    out = list(located)
    patch(out, plugin, values)
    return out
