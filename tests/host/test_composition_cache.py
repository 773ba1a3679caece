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
