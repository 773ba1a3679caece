"""``--root DIR`` (``dsh run/chat/sessions`` and ``dsh serve``) goes to the file stores, which
say so themselves (``Plugin.root_key``): neither command names a store, so a file store is a
plugin declaration, not a host edit."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dsh_host._cli.common import CliUsageError, load_composition_terms
from dsh_host._server.command import ServeUsageError, build_compositions
from dsh_host._shipped_plugins import declared_root_keys


def composition(tmp_path: Path, *stores: str) -> Path:
    path = tmp_path / "dsh.yml"
    rows = ["- id: sessions\n  name: sessions\n"]
    rows += [f"- id: store-{n}\n  name: {store}\n" for n, store in enumerate(stores)]
    path.write_text("".join(rows), encoding="utf-8")
    return path


def test_root_sets_the_declared_key_of_every_file_store_row(tmp_path: Path) -> None:
    stores = ("session-persistence-jsonl", "session-persistence-sqlite")
    assert declared_root_keys() == dict.fromkeys(stores, "root")
    args = argparse.Namespace(config=str(composition(tmp_path, *stores)), root=str(tmp_path / "r"))
    _path, located, _terms = load_composition_terms(args)
    configs = {entry.row.name: entry.row.config for entry in located}
    assert configs == {
        "sessions": None,
        "session-persistence-jsonl": {"root": str(tmp_path / "r")},
        "session-persistence-sqlite": {"root": str(tmp_path / "r")},
    }


def test_root_without_a_file_store_names_the_stores_that_take_it(tmp_path: Path) -> None:
    path = composition(tmp_path, "session-persistence-postgres")
    args = argparse.Namespace(config=str(path), root=str(tmp_path / "r"))
    with pytest.raises(CliUsageError) as refused:
        load_composition_terms(args)
    assert str(refused.value) == (
        "--root needs a row running session-persistence-jsonl or session-persistence-sqlite "
        "in the composition, and it has none; add one or drop the flag"
    )


def test_serve_root_goes_to_the_file_store_of_the_composition(tmp_path: Path) -> None:
    root = str(tmp_path / "r")
    sqlite = composition(tmp_path, "session-persistence-sqlite")
    rows = build_compositions(str(sqlite), [], "demo", root)["default"]
    stores = [e.row for e in rows if e.row.name == "session-persistence-sqlite"]
    assert [row.config for row in stores] == [{"root": root}]  # was refused: "needs jsonl"

    postgres = composition(tmp_path, "session-persistence-postgres")
    with pytest.raises(ServeUsageError) as refused:
        build_compositions(str(postgres), [], "demo", root)
    assert str(refused.value) == (
        "--root needs a row running session-persistence-jsonl or session-persistence-sqlite "
        "in the composition"
    )
