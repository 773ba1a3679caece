"""Where a session lives on disk: project key, session segment, generation names.

The session id is an arbitrary string chosen by a caller, so it is escaped into
exactly one safe path component before it touches the filesystem: no ``/``, no
``..``, no NUL can survive, and the mapping is injective (two ids never share a
directory). The escape works on UTF-16 code units, as DSH's does, so lone
surrogates survive and a directory written by DSH is found here.

The project key is the opposite trade-off: readable and lossy (separators
collapse, long paths are cut), because a person navigates it; sessions inside
one project directory are still told apart by their id segment.
"""

from __future__ import annotations

import os
import re
from typing import Final, Literal

__all__ = [
    "CURRENT_VERSION",
    "Compression",
    "decode_segment",
    "encode_segment",
    "generation_filename",
    "opposite_suffix_version",
    "parse_generation_filename",
    "project_dir_name",
    "project_key",
]

Compression = Literal["zstd", "none"]

#: The log format version this build writes (DSH 0.1.6-alpha.2, D1).
CURRENT_VERSION: Final = 3

_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_GENERATION: Final = re.compile(r"^session(?:\.v([1-9][0-9]*))?\.jsonl$")
_MAX_SAFE: Final = 2**53 - 1
_SLUG_UNITS: Final = 251


def _code_units(text: str) -> list[int]:
    raw = text.encode("utf-16-le", "surrogatepass")
    return [int.from_bytes(raw[i : i + 2], "little") for i in range(0, len(raw), 2)]


def _escape_unit(unit: int) -> str:
    char = chr(unit)
    if char in _SAFE:
        return char
    return f"~{unit:04X}"


def encode_segment(raw: str) -> str:
    """Escape ``raw`` into one injective, traversal-free path segment.

    ``A-Z a-z 0-9 . _ -`` stay literal; every other UTF-16 code unit (``~``
    included) becomes ``~XXXX``. The whole-string ``.`` and ``..`` are escaped
    too, since they are safe characters but not safe names.
    """
    if raw == "":
        raise ValueError("cannot encode an empty path segment")
    if raw == ".":
        return "~002E"
    if raw == "..":
        return "~002E~002E"
    return "".join(_escape_unit(unit) for unit in _code_units(raw))


def decode_segment(segment: str) -> str:
    """Invert :func:`encode_segment` (raises ``ValueError`` on a malformed segment)."""
    units: list[int] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "~":
            hexa = segment[i + 1 : i + 5]
            if len(hexa) != 4 or not re.fullmatch(r"[0-9A-F]{4}", hexa):
                raise ValueError(f"malformed escape in path segment {segment!r} at {i}")
            units.append(int(hexa, 16))
            i += 5
        elif char in _SAFE:
            units.append(ord(char))
            i += 1
        else:
            raise ValueError(f"unescaped character {char!r} in path segment {segment!r}")
    raw = b"".join(unit.to_bytes(2, "little") for unit in units)
    return raw.decode("utf-16-le", "surrogatepass")


def project_key(cwd: str) -> str:
    """The readable, bounded project directory name for ``cwd``: ``--<slug>--``."""
    if cwd == "":
        raise ValueError("cannot encode an empty project path")
    out: list[str] = []
    in_separator_run = False
    for unit in _code_units(cwd):
        if unit in (0x2F, 0x5C, 0x3A):  # / \ :
            if not in_separator_run:
                out.append("-")
            in_separator_run = True
        else:
            out.append(_escape_unit(unit))
            in_separator_run = False
    slug = "".join(out).lstrip("-") or "root"
    # The cut is in UTF-16 code units of the escaped slug, which is pure ASCII.
    return f"--{slug[:_SLUG_UNITS]}--"


def project_dir_name(cwd: str | None) -> str:
    """The project directory of a header: its project key, or ``_no-cwd``."""
    return "_no-cwd" if cwd is None else project_key(cwd)


def _suffix(compression: Compression) -> str:
    return ".zstd" if compression == "zstd" else ""


def generation_filename(version: int, compression: Compression) -> str:
    """``session.jsonl`` for v0, ``session.vN.jsonl`` after, plus ``.zstd`` when compressed."""
    if type(version) is not int or version < 0 or version > _MAX_SAFE:
        raise ValueError(f"generation version must be a non-negative safe integer, got {version!r}")
    base = "session.jsonl" if version == 0 else f"session.v{version}.jsonl"
    return base + _suffix(compression)


def parse_generation_filename(name: str, compression: Compression) -> int | None:
    """The generation number a canonical file name carries, or None if not canonical."""
    suffix = _suffix(compression)
    if compression == "none" and name.endswith(".zstd"):
        return None
    if not name.endswith(suffix):
        return None
    base = name[: len(name) - len(suffix)] if suffix else name
    match = _GENERATION.match(base)
    if match is None:
        return None
    if match.group(1) is None:
        return 0
    version = int(match.group(1))
    return version if version <= _MAX_SAFE else None


def opposite_suffix_version(name: str, compression: Compression) -> int | None:
    """The generation number when ``name`` is canonical for the *other* encoding."""
    return parse_generation_filename(name, "none" if compression == "zstd" else "zstd")


def is_absolute_cwd(cwd: str) -> bool:
    """True when ``cwd`` is an absolute path (POSIX rules, like Node's ``path.isAbsolute``)."""
    return os.path.isabs(cwd)
