"""A composition is parsed once per text and environment (docs/decisions.md D44): what comes
from the cache is what the parser makes, and what JSON cannot carry exactly is parsed every
time."""

from __future__ import annotations

import datetime
import json

import pytest

from dsh_host._composition_cache import cache_file, parse_rows_cached
from dsh_host._loader import parse_rows
from dsh_host.errors import ConfigError


def _remembered() -> list[str]:
    if not cache_file().exists():
        return []
    return [entry["text"] for entry in json.loads(cache_file().read_text())["compositions"]]


def test_a_remembered_composition_is_the_parsed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSH_TEST_CACHE_VALUE", "from the environment")
    text = (
        "# a comment\n- name: sessions\n\n- id: store\n  name: session-persistence-jsonl\n"
        "  config: {root: !env DSH_TEST_CACHE_VALUE, n: 1.5, flag: true, list: [1, null]}\n"
    )
    parsed = parse_rows(text, "c.yml", restricted="why")
    first = parse_rows_cached(text, "c.yml", restricted="why")
    assert _remembered() == [text]
    again = parse_rows_cached(text, "c.yml", restricted="why")
    assert first == again == parsed
    assert again[1].where == "c.yml:4 (row 2)"
    assert again[1].row.config == {"root": "from the environment", "n": 1.5, "flag": True,
                                   "list": [1, None]}  # fmt: skip
    # Another value of a variable the text read: parsed again, with the new value.
    monkeypatch.setenv("DSH_TEST_CACHE_VALUE", "changed")
    changed = parse_rows_cached(text, "c.yml", restricted="why")
    assert changed[1].row.config is not None and changed[1].row.config["root"] == "changed"
    # Unset: the parser's own error, whatever was remembered.
    monkeypatch.delenv("DSH_TEST_CACHE_VALUE")
    with pytest.raises(ConfigError, match="DSH_TEST_CACHE_VALUE is not set"):
        parse_rows_cached(text, "c.yml")


def test_what_json_cannot_carry_is_parsed_every_time() -> None:
    text = "- name: sessions\n  config: {when: 2024-01-02, nested: {3: three}}\n"
    rows = parse_rows_cached(text, "c.yml")
    assert rows[0].row.config == {"when": datetime.date(2024, 1, 2), "nested": {3: "three"}}
    assert _remembered() == []
    assert parse_rows_cached(text, "c.yml") == rows == parse_rows(text, "c.yml")


def test_a_row_error_comes_before_a_later_rows_error() -> None:
    """Rows are checked as they are built: the first bad row is the one reported."""
    text = "- just a string\n- name: x\n  config: !env DSH_TEST_CACHE_UNSET_VARIABLE\n"
    with pytest.raises(ConfigError, match=r"c.yml:1 \(row 1\): a row must be a mapping"):
        parse_rows_cached(text, "c.yml")


def _plant(text: str, rows: list[list[object]]) -> None:
    """Write the cache as a tool with write access to ``$XDG_CACHE_HOME`` could."""
    from dsh_host import __version__

    cache_file().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    cache_file().write_text(json.dumps({
        "format": 1, "dsh": __version__,
        "compositions": [{"text": text, "env": {}, "rows": rows}],
    }))  # fmt: skip
    cache_file().chmod(0o600)


def test_a_planted_entry_reaches_only_a_listing(tmp_path: pytest.TempPathFactory) -> None:
    """Every command but a listing parses its text itself: a planted entry cannot change the
    composition a run, a resume or a server uses (the control: a listing does take it)."""
    from pathlib import Path

    from dsh_host._compositions import load_config

    config = Path(str(tmp_path)) / "dsh.yml"
    text = "- name: sessions\n  config: {root: /the/real/root}\n"
    config.write_text(text)
    _plant(text, [[{"name": "sessions", "config": {"root": "/planted"}}, 1]])
    assert load_config(str(config)).rows[0].row.config == {"root": "/the/real/root"}
    listed = load_config(str(config), remembered=True).rows
    assert listed[0].row.config == {"root": "/planted"}


def test_a_remembered_row_that_imports_code_is_neither_taken_nor_kept() -> None:
    text = "- name: sessions\n"
    _plant(text, [[{"name": "os:system"}, 1]])
    rows = parse_rows_cached(text, "c.yml")
    assert [located.row.name for located in rows] == ["sessions"]
    coded = "- name: json:JSONDecoder\n"
    assert [located.row.name for located in parse_rows_cached(coded, "c.yml")] == [
        "json:JSONDecoder"
    ]
    assert coded not in _remembered()


def test_a_malformed_remembered_row_gives_the_parsers_answer() -> None:
    text = "- name: sessions\n"
    _plant(text, [[{"name": "sessions", "unknown": 1}, 1]])
    assert [located.row.name for located in parse_rows_cached(text, "c.yml")] == ["sessions"]
