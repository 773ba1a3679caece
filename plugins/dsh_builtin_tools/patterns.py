"""Every pattern a model chooses or a workspace plants runs in RE2, a linear-time engine.

A backtracking engine (Python's ``re``) can take exponential time on a pattern such as
``(a+)+$`` against ``aaaa…b``, and it does so inside one C call that holds the GIL: the whole
harness freezes (Ctrl-C and SIGTERM are only handled between bytecodes), and under ``dsh serve``
every session with it. The patterns here come from the model (``grep``'s regex, ``glob``'s
pattern, ``grep``'s ``glob``) or from files a command may have written (every ``.gitignore``), so
they are compiled in one place, with RE2 (``google-re2``): matching is linear in the input,
whatever the pattern. What RE2 cannot run in linear time it does not accept (backreferences,
lookaround), and the model reads why.

gitignore patterns are translated by ``pathspec`` and matched by its RE2 backend (a
``re2.Set``). ``pathspec`` also compiles each line with Python's ``re`` (never to match, only
to build), which is linear but slow on huge lines, so a ``.gitignore`` line longer than
:data:`MAX_IGNORE_LINE` characters is skipped (no path can be longer than ``PATH_MAX``, 4096
bytes, which such a line would be written to match).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pathspec
import re2

from dsh_host.sdk import ToolError

__all__ = ["MAX_IGNORE_LINE", "Globs", "LineRegex", "PatternError", "glob_pattern", "line_regex"]

#: Longest ``.gitignore`` line used (characters); longer lines are skipped.
MAX_IGNORE_LINE: Final = 4096
_UNSUPPORTED_HINT: Final = (
    "patterns use RE2 syntax, which runs in linear time: backreferences (\\1) and lookaround "
    "((?=, (?!, (?<=, (?<!) are not supported; escape literal characters like ( or [ with a "
    "backslash"
)


class PatternError(ToolError):
    """A pattern the linear-time engine refuses (``PATTERN_UNSUPPORTED``)."""

    code = "PATTERN_UNSUPPORTED"


def _options(*, ignore_case: bool = False) -> Any:
    options = re2.Options()
    options.log_errors = False  # the refusal goes to the model, not to the terminal
    options.case_sensitive = not ignore_case
    return options


def _reason(error: Exception) -> str:
    detail = error.args[0] if error.args else error
    return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)


class LineRegex:
    """A compiled ``grep`` regex: RE2, searched one line at a time."""

    def __init__(self, pattern: str, compiled: Any) -> None:
        self.pattern = pattern
        self._compiled = compiled

    def search(self, line: str) -> bool:
        return self._compiled.search(line) is not None


def line_regex(pattern: str, *, ignore_case: bool = False) -> LineRegex:
    """``pattern`` compiled by RE2, or a :class:`PatternError` saying what RE2 refused."""
    try:
        return LineRegex(pattern, re2.compile(pattern, _options(ignore_case=ignore_case)))
    except re2.error as error:
        raise PatternError(f"invalid pattern: {_reason(error)} ({_UNSUPPORTED_HINT})") from None


def _safe(path: str) -> str:
    """A listed path as RE2 can take it: bytes of a name that are not UTF-8 (kept by
    ``os.fsdecode`` as lone surrogates) become U+FFFD, as the model sees them."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class Globs:
    """gitignore-syntax patterns (``pathspec``'s translation) matched by RE2."""

    def __init__(self, spec: pathspec.GitIgnoreSpec) -> None:
        self._spec = spec

    def match(self, path: str) -> bool:
        """Whether the patterns select ``path`` (relative, ``/``-separated; a trailing ``/``
        marks a directory), with gitignore's precedence (the last matching line decides)."""
        return bool(self._spec.match_file(_safe(path)))

    @classmethod
    def compile(cls, lines: Sequence[str]) -> Globs:
        """Compile ``lines``; ``ValueError`` (from pathspec) or ``re2.error`` on a refusal."""
        return cls(pathspec.GitIgnoreSpec.from_lines(lines, backend="re2"))


def glob_pattern(pattern: str, what: str = "pattern") -> Globs:
    """One model-chosen glob (``glob``'s ``pattern``, ``grep``'s ``glob``), or a
    :class:`PatternError` naming the argument."""
    try:
        return Globs.compile([pattern])
    except (ValueError, re2.error) as error:
        raise PatternError(
            f"invalid {what} {pattern!r}: {_reason(error)} (gitignore syntax, e.g. *.py or "
            "src/**/*.ts)"
        ) from None


def ignore_rules(lines: Sequence[str]) -> Globs | None:
    """The rules of one ``.gitignore`` (None when it has none that RE2 takes).

    A planted file must not stop the listing: a line longer than :data:`MAX_IGNORE_LINE`, or one
    RE2 refuses (its memory budget, say), is skipped and the other lines still apply.
    """
    kept = [line for line in lines if len(line) <= MAX_IGNORE_LINE]
    if not kept:
        return None
    try:
        return Globs.compile(kept)
    except (ValueError, re2.error):
        pass
    usable = []
    for line in kept:
        try:
            Globs.compile([line])
        except (ValueError, re2.error):
            continue
        usable.append(line)
    if not usable:
        return None
    try:
        return Globs.compile(usable)
    except (ValueError, re2.error):
        return None
