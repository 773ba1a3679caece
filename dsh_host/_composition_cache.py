"""Compositions as parsed before: a command whose composition file is unchanged does not parse
its YAML again (docs/decisions.md D44).

Parsing a composition is a function of its text and of the environment variables its ``!env``
tags read, nothing else; importing PyYAML for it was the largest single cost of a short command
(``dsh sessions list``). So each parsed text is remembered with every row's plain data and line
and the value of every variable ``!env`` read (or that it was unset), in
``$XDG_CACHE_HOME/dsh/compositions.json`` (mode 0600 in a 0700 directory). A text is taken
from it only when it is the very text read now, character for character, and every variable it
read has the same value (or is still unset); anything else parses the text again. Only a parse
that succeeded is remembered, and only when its data is plain JSON that reads back as the same
values and types (a YAML timestamp, a binary or a non-string key is parsed every time), so an
error is always the parser's own. Which file is the composition, whether a project file is
trusted and unchanged, and the restriction of its rows are decided outside, on every run, as
before. The rows are then converted and located exactly as a parse makes them
(:func:`dsh_host._loader.convert_row`, :func:`dsh_host._loader.where_of`).

Who may use it: only a command that runs nothing and records nothing (``dsh sessions list``,
through ``load_config(..., remembered=True)``). The file lives under ``$XDG_CACHE_HOME``, which
the sandbox does not keep tools from writing (a tool may well be given ``~/.cache`` for its
package manager), unlike the configuration directory; so a command that runs a model or a tool,
or records run terms, parses its text itself, and an entry planted in the cache can change at
most what a listing reads. Even there, an entry with a row that imports code (``module:Attr``)
is not taken, nor kept: a listing never imports a module because the cache named it.

A cache: a missing, unreadable or malformed file, or an entry of the wrong shape, is ignored and
rewritten; a cache directory that cannot be written leaves every command parsing, as before.
"""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

from ._loader import LocatedRow, convert_row, imports_code, where_of
from ._userdirs import cache_home, read_cache_document, write_cache_document
from .errors import ConfigError

__all__ = ["cache_file", "parse_rows_cached"]

#: The layout of the file; another layout (or another dsh version's file) is ignored.
FORMAT: Final = 1
#: At most this many texts are remembered (the most recently parsed).
MAX_ENTRIES: Final = 8
#: A larger file is not read (and is replaced).
MAX_BYTES: Final = 4 << 20


def cache_file() -> Path:
    """``$XDG_CACHE_HOME/dsh/compositions.json``."""
    return cache_home() / "dsh" / "compositions.json"


def parse_rows_cached(text: str, source: str, *, restricted: str | None = None) -> list[LocatedRow]:
    """What :func:`dsh_host._loader.parse_rows` returns for ``text``: from the cache when this
    very text was parsed before under the same values of the variables it read, else parsed
    (and remembered)."""
    path = cache_file()
    entries = _read(path)
    for entry in entries:
        if entry["text"] == text and all(
            os.environ.get(name) == value for name, value in entry["env"].items()
        ):
            try:
                remembered = [
                    LocatedRow(convert_row(data, where_of(source, line, i)),
                               where_of(source, line, i), restricted)
                    for i, (data, line) in enumerate(entry["rows"])
                ]  # fmt: skip
            except ConfigError:  # not what a parse of ours kept: parse, and report its error
                break
            # A row that imports code (``module:Attr``) is never taken from the cache: an entry
            # planted there could otherwise make a listing import a module of its choosing.
            if not any(imports_code(located.row.name) for located in remembered):
                return remembered
            break
    from ._config_yaml import compose_rows

    composed, env_read = compose_rows(text, source, convert_row)
    rows = [LocatedRow(row, where_of(source, line, i), restricted)
            for i, (_, line, row) in enumerate(composed)]  # fmt: skip
    plain = [[data, line] for data, line, _ in composed]
    if _exact(plain) and not any(imports_code(row.row.name) for row in rows):
        kept = [e for e in entries if e["text"] != text][-(MAX_ENTRIES - 1):]
        with suppress(OSError):  # a read-only or full cache directory: parsed every time
            _write(path, [*kept, {"text": text, "env": env_read, "rows": plain}])
    return rows


def _exact(value: Any) -> bool:
    """``value`` is JSON that reads back as equal values of the same types."""
    if value is None or type(value) in (str, int, bool):
        return True
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if type(value) is list:
        return all(_exact(item) for item in value)
    if type(value) is dict:
        return all(type(k) is str and _exact(v) for k, v in value.items())
    return False


def _well_formed(entry: object) -> bool:
    if not isinstance(entry, dict) or set(entry) != {"text", "env", "rows"}:
        return False
    env, rows = entry["env"], entry["rows"]
    return (
        isinstance(entry["text"], str)
        and isinstance(env, dict)
        and all(isinstance(v, str | None) for v in env.values())
        and isinstance(rows, list)
        and all(
            isinstance(row, list) and len(row) == 2 and type(row[1]) is int and row[1] >= 0
            for row in rows
        )
    )


def _read(path: Path) -> list[dict[str, Any]]:
    entries = read_cache_document(path, MAX_BYTES, FORMAT, "compositions")
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if _well_formed(entry)]


def _write(path: Path, entries: list[dict[str, Any]]) -> None:
    write_cache_document(path, FORMAT, "compositions", entries)
