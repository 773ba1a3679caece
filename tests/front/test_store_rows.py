"""``Agent(store=...)``: a URL goes to the store whose plugin declares its scheme
(``Plugin.store_url``), anything else is a directory of the default file store. The front door
names no URL-addressed store, so adding one is a plugin declaration, not a host edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_host import Agent
from dsh_host._loader import Row
from dsh_host._shipped_plugins import declared_store_urls


def persistence(agent: Agent) -> Row:
    return next(row for row in agent.rows() if row.id == "session-persistence")


@pytest.mark.parametrize("url", ["postgresql://dsh@db/sessions", "postgres://dsh@db/sessions"])
def test_a_declared_url_scheme_composes_its_store(url: str) -> None:
    assert declared_store_urls()["postgresql"] == ("session-persistence-postgres", "dsn")
    row = persistence(Agent("demo", store=url))
    assert (row.name, row.config) == ("session-persistence-postgres", {"dsn": url})


def test_any_other_store_is_a_file_store_root(tmp_path: Path) -> None:
    row = persistence(Agent("demo", store=tmp_path / "sessions"))
    assert (row.name, row.config) == (
        "session-persistence-jsonl",
        {"root": str(tmp_path / "sessions")},
    )
    unknown = persistence(Agent("demo", store="redis://cache/0"))  # no store declares redis
    assert (unknown.name, unknown.config) == ("session-persistence-jsonl", {"root": "redis://cache/0"})
