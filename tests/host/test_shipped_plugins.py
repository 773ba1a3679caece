"""The shipped plugins' declared metadata (``dsh_host._shipped_plugins``) and what it is for.

A command that only reads stored sessions resolves the composition from what each shipped
plugin declares, importing only the rows it boots (issue 25: importing every row's plugin was
most of ``dsh sessions list``). The table must say what ``pyproject.toml`` and the plugin
classes say; a reader must still refuse what a boot refuses for the rows it boots, and what no
command may do (D16) for every row.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dsh_host import _loader as loader
from dsh_host._compositions import shipped_config_dir
from dsh_host._loader import (
    LocatedRow,
    Row,
    check_rows,
    declared_plugin,
    load_rows,
    resolve_plugin,
    rows_needed_for,
)
from dsh_host._shipped_plugins import SHIPPED_PLUGINS
from dsh_host.errors import DISTRIBUTION, ConfigError, DshError, UnknownPluginError

REPO = Path(__file__).resolve().parents[2]
PERSISTENCE = ("sessionPersistence",)


def pyproject_entry_points() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return dict(project["entry-points"]["dsh.plugins"])


def test_the_table_is_pyprojects_entry_points() -> None:
    assert {name: p.entry_point for name, p in SHIPPED_PLUGINS.items()} == pyproject_entry_points()


def test_the_installed_entry_points_are_the_table() -> None:
    installed = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="dsh.plugins")
        if ep.dist is not None and ep.dist.name == DISTRIBUTION
    }
    assert installed == {name: p.entry_point for name, p in SHIPPED_PLUGINS.items()}


@pytest.mark.parametrize("name", sorted(SHIPPED_PLUGINS))
def test_each_line_says_what_its_plugin_declares(name: str) -> None:
    declared = SHIPPED_PLUGINS[name]
    factory, value = resolve_plugin(name, "test")
    assert value == declared.entry_point
    meta = factory().dsh_plugin_meta()
    assert (meta.provides, meta.inject, meta.executable_keys) == (
        declared.provides,
        declared.inject,
        declared.executable_keys,
    )
    route = meta.model_route
    assert (None if route is None else (route.prefix, route.provider)) == declared.model_route
    assert meta.root_key == declared.root_key
    url = meta.store_url
    assert (None if url is None else (url.schemes, url.key)) == declared.store_url
    terms = meta.run_terms
    assert (() if terms is None else terms.pairs()) == declared.run_terms
    assert meta.boots_for_repair == declared.boots_for_repair
    assert meta.runs_confined == declared.runs_confined
    assert meta.project_files == declared.project_files


def test_a_shipped_name_resolves_without_the_entry_point_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_scan() -> dict[str, Any]:
        raise AssertionError("scanned the installed entry points")

    monkeypatch.setattr(loader, "installed_plugins", no_scan)
    factory, value = resolve_plugin("session-persistence-jsonl", "test")
    assert value == "dsh_session_persistence_jsonl:SessionPersistenceJsonl"
    assert factory.__name__ == "SessionPersistenceJsonl"
    with pytest.raises(AssertionError, match="scanned"):
        resolve_plugin("no-such-plugin", "test")


def test_an_alias_is_the_shipped_plugin_unless_a_distribution_registers_it_as_spelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert declared_plugin("dsh-sandbox-local") is SHIPPED_PLUGINS["sandbox-local"]
    assert declared_plugin("@deepseek-ai/dsh-sandbox-local") is SHIPPED_PLUGINS["sandbox-local"]
    assert declared_plugin("host.sample_plugins:Echo") is None
    assert declared_plugin("no-such-plugin") is None
    registered = importlib.metadata.EntryPoint(
        "dsh-sandbox-local", "host.sample_plugins:Echo", "dsh.plugins"
    )
    monkeypatch.setattr(loader, "installed_plugins", lambda: {"dsh-sandbox-local": registered})
    assert declared_plugin("dsh-sandbox-local") is None
    assert resolve_plugin("dsh-sandbox-local", "test")[1] == "host.sample_plugins:Echo"


def default_rows(**patches: dict[str, Any]) -> list[LocatedRow]:
    """The shipped default composition, with ``config`` replaced on the rows named."""
    rows = load_rows(shipped_config_dir() / "default.yml")
    out = []
    for located in rows:
        config = patches.get(located.row.name)
        if config is not None:
            located = replace(located, row=replace_row(located.row, config=config))
        out.append(located)
    return out


def replace_row(row: Row, **changes: Any) -> Row:
    fields: dict[str, Any] = {
        "name": row.name, "id": row.id, "config": row.config, "disabled": row.disabled
    }
    fields.update(changes)
    return Row(**fields)


def names(rows: list[LocatedRow]) -> list[str]:
    return [located.row.name for located in rows]


def test_a_reader_boots_the_persistence_row_and_what_it_injects() -> None:
    assert names(rows_needed_for(default_rows(), PERSISTENCE)) == [
        "sessions",
        "session-persistence-jsonl",
    ]


def test_a_row_a_reader_does_not_boot_is_not_validated() -> None:
    """A broken tools row fails every command that boots it, not the listing of sessions."""
    rows = default_rows(**{"builtin-tools": {"workspce": "."}})
    with pytest.raises(ConfigError, match=r"config\.workspce: unknown key"):
        check_rows(rows)
    assert names(rows_needed_for(rows, PERSISTENCE)) == ["sessions", "session-persistence-jsonl"]


def same_failure(rows: list[LocatedRow]) -> str:
    """The error of ``rows_needed_for``, which must be the one validating every row gives."""
    with pytest.raises(DshError) as full:
        check_rows(rows)
    with pytest.raises(type(full.value)) as reader:
        rows_needed_for(rows, PERSISTENCE)
    assert str(reader.value) == str(full.value)
    return str(reader.value)


def test_a_broken_persistence_row_fails_the_reader_as_a_boot_does() -> None:
    message = same_failure(default_rows(**{"session-persistence-jsonl": {"root": 5}}))
    assert "(session-persistence-jsonl): config.root: expected str | null, got int" in message


def test_an_unknown_plugin_fails_the_reader_wherever_it_is() -> None:
    rows = [*default_rows(), LocatedRow(Row(name="no-such-plugin"), "x.yml:99 (row 17)")]
    with pytest.raises(UnknownPluginError) as info:
        rows_needed_for(rows, PERSISTENCE)
    assert str(info.value).startswith("x.yml:99 (row 17): unknown plugin 'no-such-plugin'; ")
    assert "session-persistence-jsonl" in str(info.value)
    same_failure(rows)


def test_a_module_row_is_imported_and_validated_to_learn_what_it_provides() -> None:
    rows = [
        *default_rows(),
        LocatedRow(Row(name="host.sample_plugins:Echo", config={"times": "x"}), "x.yml:99 (row 17)"),
    ]
    assert "config.times: expected int, got str" in same_failure(rows)
    echo = [*default_rows(), LocatedRow(Row(name="host.sample_plugins:Echo"), "x.yml:99 (row 17)")]
    assert names(rows_needed_for(echo, ("echo",))) == ["host.sample_plugins:Echo"]


def restricted(rows: list[LocatedRow]) -> list[LocatedRow]:
    return [replace(located, restricted="a trusted project file may not") for located in rows]


def test_trusted_config_refusals_hold_for_rows_a_reader_does_not_boot() -> None:
    """A trusted project file's sandbox row that chooses the runner, or a row that imports
    code: refused by the reader too, with the boot's message, though it boots neither."""
    runner = {"network": "deny", "runnerCommand": ["/bin/sh"]}
    message = same_failure(restricted(default_rows(**{"sandbox-local": runner})))
    assert "config key runnerCommand of sandbox-local chooses an executable" in message
    planted = restricted([*default_rows(), LocatedRow(Row(name="planted_module:Plugin"), "r")])
    assert "imports Python code by module path" in same_failure(planted)


def test_a_line_that_no_longer_matches_its_plugin_makes_the_reader_import_every_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The table said the persistence row injects nothing: trusted, it would boot without the
    ``sessions`` row. The imported row says otherwise, so every row is imported and validated."""
    stale = replace(SHIPPED_PLUGINS["session-persistence-jsonl"], inject=())
    monkeypatch.setitem(SHIPPED_PLUGINS, "session-persistence-jsonl", stale)
    assert names(rows_needed_for(default_rows(), PERSISTENCE)) == [
        "sessions",
        "session-persistence-jsonl",
    ]
    broken = default_rows(**{"builtin-tools": {"workspce": "."}})
    with pytest.raises(ConfigError, match=r"config\.workspce: unknown key"):
        rows_needed_for(broken, PERSISTENCE)
