"""Editing a composition's rows by plugin name: the one owner of "patch that row's config".

``dsh run`` (``--workspace``, ``--sandbox``, ``--approval``, ``--model``), ``dsh serve``
(``--root``, the approval policy, each session's workspace), the recorded terms a stored
session continues under, and the Python ``Agent`` all change a composition the same way: find
the enabled rows running a plugin (by canonical name, so DSH aliases such as
``@deepseek-ai/dsh-x`` match) and merge keys into their config. Rows are frozen, so an edit
is a new :class:`~dsh_host._loader.Row` with the same name, id and ``disabled`` flag; nothing
else about a row changes here.

A session's run terms (D22: workspace, sandbox mode, network, approval policy, what an
unanswered ask becomes) are edited by *term*, not by plugin name: each plugin declares which of
its config keys carry which term (:class:`~dsh_host._plugin.RunTermKeys`), and
:func:`patch_term` / :func:`term_value` find the rows through that declaration, so no front door
names the plugin that takes a term.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from ._loader import LocatedRow, Row, canonical_name, declared_plugin, resolve_plugin
from ._plugin import PluginMeta
from .errors import DshError

__all__ = [
    "Term",
    "config_of",
    "enabled",
    "merged",
    "patch",
    "patch_term",
    "patched",
    "runs",
    "runs_confined",
    "services_of",
    "takes_term",
    "term_rows",
    "term_value",
    "with_term",
]

#: A run term a row may take (the fields of :class:`~dsh_host._plugin.RunTermKeys`).
Term = Literal["workspace", "sandbox", "network", "approval_policy", "unanswered"]


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


@functools.cache
def _third_party_meta(name: str) -> PluginMeta | None:
    """What a plugin outside the shipped table declares (imported once per name); None when it
    cannot be imported: booting the row reports that, with the row's place."""
    try:
        factory, _ = resolve_plugin(name, name)
        meta = (factory() if isinstance(factory, type) else factory).dsh_plugin_meta()
    except (DshError, AttributeError, TypeError):
        return None
    return meta if isinstance(meta, PluginMeta) else None


def _terms(name: str) -> dict[str, str]:
    declared = declared_plugin(name)
    if declared is not None:
        return dict(declared.run_terms)
    meta = _third_party_meta(name)
    return dict(meta.run_terms.pairs()) if meta is not None and meta.run_terms else {}


def services_of(row: Row) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(provides, inject)`` of ``row``'s plugin (empty when it cannot be imported)."""
    declared = declared_plugin(row.name)
    if declared is not None:
        return declared.provides, declared.inject
    meta = _third_party_meta(row.name)
    return (meta.provides, meta.inject) if meta is not None else ((), ())


def runs_confined(row: Row) -> bool:
    """``row``'s plugin runs code or commands through the sandbox (``runs_confined``)."""
    declared = declared_plugin(row.name)
    if declared is not None:
        return declared.runs_confined
    meta = _third_party_meta(row.name)
    return meta is not None and meta.runs_confined


def takes_term(row: Row, term: Term) -> str | None:
    """The config key by which ``row`` takes ``term`` (None: it does not, or is disabled)."""
    return None if row.disabled else _terms(row.name).get(term)


def term_rows(located: Sequence[LocatedRow], term: Term) -> list[int]:
    """The indexes of the enabled rows that take ``term``, in order."""
    return [i for i, entry in enumerate(located) if takes_term(entry.row, term) is not None]


def term_value(located: Sequence[LocatedRow], term: Term, default: Any = None) -> Any:
    """``term`` as the first row taking it configures it (``default`` when that row leaves it
    unset, or when no row takes it)."""
    for entry in located:
        key = takes_term(entry.row, term)
        if key is not None:
            return (entry.row.config or {}).get(key, default)
    return default


def patch_term(located: list[LocatedRow], term: Term, value: Any) -> int:
    """Set ``term`` to ``value`` on every enabled row that takes it, in place; how many rows
    were patched (0: no row takes it; the caller decides if that is an error)."""
    hits = 0
    for index, entry in enumerate(located):
        key = takes_term(entry.row, term)
        if key is not None:
            located[index] = replace(entry, row=merged(entry.row, {key: value}))
            hits += 1
    return hits


def with_term(located: Sequence[LocatedRow], term: Term, value: Any) -> list[LocatedRow]:
    """A copy of ``located`` with :func:`patch_term` applied (``located`` is left as it was)."""
    out = list(located)
    patch_term(out, term, value)
    return out
