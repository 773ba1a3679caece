"""Every install line dsh prints or documents installs dsh, with an extra that exists.

PyPI's ``dsh`` is another project, so ``pip install 'dsh[serve]'`` would install a stranger's
code. The test searches the whole tree (code, docs, compositions, CI) instead of listing the
places that happen to carry a hint today.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from dsh_host._loader import resolve_plugin
from dsh_host.errors import (
    DISTRIBUTION,
    MissingExtraError,
    UnknownPluginError,
    install_hint,
    require_extra,
)

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
SEARCHED = ("*.py", "*.md", "*.yml", "*.toml", "*.html", "run")
SKIPPED_DIRS = {".git", ".venv", "node_modules", "results", "__pycache__"}
#: ``pip install 'NAME[extra]'`` as a hint or a doc writes it (quoted or not).
REQUIREMENT = re.compile(r"pip install (?:-[-a-zA-Z]+ )*[\"']?([A-Za-z0-9_.-]+)\[([a-z0-9,-]+)\]")


def _files() -> list[Path]:
    found: list[Path] = []
    for pattern in SEARCHED:
        for path in ROOT.rglob(pattern):
            if path != Path(__file__).resolve() and not SKIPPED_DIRS.intersection(
                path.relative_to(ROOT).parts
            ):
                found.append(path)
    return found


def test_the_distribution_has_its_own_name() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "dsh-harness"
    assert PYPROJECT["project"]["scripts"] == {"dsh": "dsh_host._cli:main"}


def test_every_requirement_with_an_extra_names_this_distribution_and_a_real_extra() -> None:
    seen = 0
    wrong: list[str] = []
    for path in _files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name, extras in REQUIREMENT.findall(line):
                if name == ".":  # a checkout's own extras: `pip install -e '.[test]'`
                    continue
                seen += 1
                where = f"{path.relative_to(ROOT)}:{lineno}"
                if name != DISTRIBUTION:
                    wrong.append(f"{where}: {name}[{extras}] (expected {DISTRIBUTION})")
                wrong.extend(
                    f"{where}: no extra {extra!r} in pyproject.toml"
                    for extra in extras.split(",")
                    if extra not in EXTRAS
                )
    assert seen >= 6, f"the search found only {seen} install lines: is the pattern stale?"
    assert wrong == []


def test_extras_that_include_others_name_this_distribution() -> None:
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        for requirement in requirements:
            if requirement.startswith("dsh"):
                name, _, rest = requirement.partition("[")
                assert name == DISTRIBUTION, f"extra {extra!r}: {requirement!r}"
                assert rest.rstrip("]") in EXTRAS


def test_a_missing_dsh_module_is_a_bug_not_an_extra() -> None:
    with pytest.raises(ModuleNotFoundError) as caught:
        with require_extra("mcp"):
            import dsh_not_a_module  # type: ignore[import-not-found]  # noqa: F401  (absent on purpose)
    assert not isinstance(caught.value, MissingExtraError)


def test_a_missing_third_party_module_names_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught:
        with require_extra("postgres"):
            import psycopg_is_not_installed_here  # type: ignore[import-not-found]  # noqa: F401  (absent)
    assert str(caught.value) == (
        "needs the postgres extra (psycopg_is_not_installed_here is not installed): "
        f"{install_hint('postgres')}"
    )


def test_a_plugin_row_without_its_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real plugin package, with its third-party import made to fail as in a bare venv."""
    for name in list(sys.modules):
        if name == "psycopg" or name.startswith(("psycopg.", "dsh_session_persistence_postgres")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ModuleNotFoundError
    with pytest.raises(UnknownPluginError) as caught:
        resolve_plugin("session-persistence-postgres", "c.yml row 2")
    assert str(caught.value) == (
        "c.yml row 2: plugin 'session-persistence-postgres' needs the postgres extra "
        "(psycopg is not installed): pip install 'dsh-harness[postgres]'"
    )
