"""The provider guide's reading list stays short, and its reference page stays true.

``docs/providers.md`` section "1. Read first" names what a provider author must read. Its
size is measured here (the files it names, a directory counted as its Python files), so the
list cannot silently grow back to the ~2,000 lines of implementation it once was; and the
reference it points to, ``docs/provider-api.md``, is checked against the code: every bullet
that opens with a name or a signature names something ``dsh_host.sdk`` exports, taking
exactly the parameters shown, so the page cannot drift from what it documents.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import dsh_host.sdk as sdk

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "providers.md"
REFERENCE = ROOT / "docs" / "provider-api.md"

#: What a provider author must read, at most (storage's guide: its one module, ~500).
READING_BUDGET = 800

#: A bullet's opening: `` - `Name` `` or `` - `Name.attr(params)` `` (params optional).
BULLET_HEAD = re.compile(
    r"^- `(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?)(?:\((?P<params>[^`]*)\))?`"
)


def _section(text: str, heading: str) -> str:
    """The body of ``heading`` up to the next heading of any level."""
    start = text.index(heading + "\n") + len(heading) + 1
    following = re.search(r"^#{1,6} ", text[start:], re.MULTILINE)
    return text[start : start + following.start()] if following else text[start:]


def reading_list(text: str) -> list[str]:
    """The paths the "Read first" bullets name (the first backticked path of each bullet)."""
    paths = []
    for line in _section(text, "## 1. Read first").splitlines():
        if line.startswith("- "):
            found = re.match(r"- `([^`]+)`", line)
            assert found, f"a Read first bullet that names no file: {line!r}"
            paths.append(found.group(1))
    return paths


def lines_of(path: Path) -> int:
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return sum(len(file.read_text(encoding="utf-8").splitlines()) for file in files)


def test_the_reading_list_names_existing_files_within_the_budget() -> None:
    paths = reading_list(GUIDE.read_text(encoding="utf-8"))
    assert paths, "docs/providers.md has no Read first list"
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert missing == [], f"the Read first list names files that do not exist: {missing}"
    sizes = {path: lines_of(ROOT / path) for path in paths}
    total = sum(sizes.values())
    assert total <= READING_BUDGET, (
        f"docs/providers.md's Read first list is {total} lines ({sizes}), over the budget of "
        f"{READING_BUDGET}: document the names in docs/provider-api.md instead of pointing at "
        "implementations"
    )


def test_the_reading_list_is_parsed_as_written() -> None:
    """The parser reads bullets of the section only, and stops at the next heading."""
    text = "## 1. Read first\n\nIntro `x.py`.\n\n- `a.md`: one\n  more `c.py`\n- `b/`\n\n### Other\n- `d.py`\n"
    assert reading_list(text) == ["a.md", "b/"]


def _shown(params: str) -> list[str]:
    """Parameter names and markers as the page shows them: ``a, *, b=None`` -> a, *, b."""
    shown = []
    for part in params.split(","):
        part = part.strip()
        if part:
            shown.append(part.split("=", 1)[0].strip())
    return shown


def _actual(obj: object, method: bool) -> list[str]:
    parameters = list(inspect.signature(obj).parameters.values())  # type: ignore[arg-type]
    if method and parameters and parameters[0].name in ("self", "cls"):
        parameters = parameters[1:]
    out: list[str] = []
    for parameter in parameters:
        if parameter.kind is parameter.KEYWORD_ONLY and not any(
            name.startswith("*") for name in out
        ):
            out.append("*")
        if parameter.kind is parameter.VAR_POSITIONAL:
            out.append("*" + parameter.name)
        elif parameter.kind is parameter.VAR_KEYWORD:
            out.append("**" + parameter.name)
        else:
            out.append(parameter.name)
    return out


def reference_entries() -> list[tuple[int, str, str | None]]:
    """(line number, name, shown parameters or None) of every bullet that opens with a name."""
    entries = []
    for number, line in enumerate(REFERENCE.read_text(encoding="utf-8").splitlines(), 1):
        found = BULLET_HEAD.match(line)
        if found:
            entries.append((number, found.group("name"), found.group("params")))
    return entries


def test_the_reference_documents_a_surface() -> None:
    names = {name for _, name, _ in reference_entries()}
    # the seam's core must be on the page, not only reachable through the implementations
    for name in ("LlmAdapter.stream", "LlmRequest", "ModelInfo", "FinishChunk", "LlmError"):
        assert name in names, f"docs/provider-api.md does not document {name}"


@pytest.mark.parametrize(
    ("number", "name", "params"),
    reference_entries(),
    ids=[f"{name}@{number}" for number, name, _ in reference_entries()],
)
def test_each_reference_name_is_exported_with_the_parameters_shown(
    number: int, name: str, params: str | None
) -> None:
    head, _, attr = name.partition(".")
    assert hasattr(sdk, head), (
        f"docs/provider-api.md:{number} documents {head}, which dsh_host.sdk does not export"
    )
    obj = getattr(sdk, head)
    if attr:
        assert hasattr(obj, attr), f"docs/provider-api.md:{number}: {head} has no {attr}"
        raw = inspect.getattr_static(obj, attr)
        obj = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
    if params is None:
        return
    assert _shown(params) == _actual(obj, method=bool(attr)), (
        f"docs/provider-api.md:{number} shows {name}({params}); the code takes "
        f"({', '.join(_actual(obj, method=bool(attr)))})"
    )


def test_the_guide_points_only_at_names_plugins_may_import() -> None:
    """The guide names host modules only through the reference: a provider plugin imports
    ``dsh_host.sdk`` alone, so a ``dsh_host.<module>`` path or a ``dsh_host/_llm`` file in the
    guide would send its reader to an implementation (or to a name it may not import)."""
    text = GUIDE.read_text(encoding="utf-8")
    pointers = re.findall(r"dsh_host[./](?!sdk\b|_shipped_plugins\.py)[\w./]+", text)
    assert pointers == []
