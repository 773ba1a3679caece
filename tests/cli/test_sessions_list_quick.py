"""``dsh sessions list`` answers from the store's own synchronous header read and the list
cache, with no composition booted and no event loop, when every log is unchanged since it was
last summarized (docs/decisions.md D39) -- and prints exactly what the booted listing prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .cli_helpers import dsh

#: ``dsh`` in this interpreter, then which event loop it imported (one JSON line on stderr):
#: every booted composition runs in one.
_LISTING = """
import json, sys
from dsh_host._cli.main import main
code = main(sys.argv[1:])
loaded = [m for m in ("asyncio", "trio") if m in sys.modules]
print(json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def _listing(cwd: Path, env: dict[str, str], *args: str) -> tuple[str, list[str]]:
    full_env = {**os.environ, **env}
    full_env.pop("DSH_SESSION_ROOT", None)
    done = subprocess.run(
        [sys.executable, "-c", _LISTING, "sessions", "list", *args],
        cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stderr.splitlines()[-1])
    return done.stdout, loaded


def test_an_unchanged_root_is_listed_without_booting_and_as_the_booted_listing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for prompt in ("first", "second"):
        made = dsh("run", prompt, "--root", str(root), "--json", cwd=tmp_path, env=env)
        assert made.returncode == 0, made.stderr
    for form in ((), ("--json",)):
        booted, _ = _listing(tmp_path, env, "--root", str(root), "--fresh", *form)
        quick, loaded = _listing(tmp_path, env, "--root", str(root), *form)
        assert loaded == []  # no event loop: nothing was booted
        assert quick == booted
        assert len(quick.splitlines()) == 2 + (not form)

    # A log that changed since is read through the booted store, and shown as it is now.
    made = dsh("run", "third", "--root", str(root), "--json", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    after, loaded = _listing(tmp_path, env, "--root", str(root), "--json")
    assert "asyncio" in loaded
    assert [row["title"] for row in map(json.loads, after.splitlines())] == [
        "third", "second", "first"
    ]  # fmt: skip
    again, loaded = _listing(tmp_path, env, "--root", str(root), "--json")
    assert loaded == [] and again == after


#: ``dsh`` in this interpreter, then every module it loaded (one JSON line on stderr).
_MODULES = """
import json, sys
from dsh_host._cli.main import main
code = main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
sys.exit(code)
"""

#: What a listing of an unchanged root (its composition parsed before, every summary
#: remembered) does not import (docs/decisions.md D44): the YAML parser, OpenSSL's hashes, the
#: live session and its store, crash repair, the summary and usage folds, the storage writer.
NOT_FOR_AN_UNCHANGED_LISTING = frozenset({
    "yaml", "hashlib", "_hashlib",
    "dsh_host._session.session", "dsh_host._session.store", "dsh_host._session.repair",
    "dsh_host._session.approvals", "dsh_host._session.surface", "dsh_host._session.summary",
    "dsh_host._session.usage", "dsh_host._session.request_header",
    "dsh_host._persistence.storage", "dsh_host._persistence.write_behind",
    "dsh_host._cli.transcript_json",
})


def _run(cwd: Path, env: dict[str, str], *args: str) -> tuple[str, set[str]]:
    full_env = {**os.environ, **env}
    full_env.pop("DSH_SESSION_ROOT", None)
    done = subprocess.run(
        [sys.executable, "-c", _MODULES, *args],
        cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, set(json.loads(done.stderr.splitlines()[-1]))


def _titles(out: str) -> list[str]:
    return [row["title"] for row in map(json.loads, out.splitlines())]


def test_an_unchanged_root_is_listed_without_the_modules_it_does_not_run(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for prompt in ("first", "second"):
        made = dsh("run", prompt, "--root", str(root), "--json", cwd=tmp_path, env=env)
        assert made.returncode == 0, made.stderr
    booted, _ = _run(tmp_path, env, "sessions", "list", "--root", str(root), "--fresh", "--json")
    quick, modules = _run(tmp_path, env, "sessions", "list", "--root", str(root), "--json")
    assert quick == booted and _titles(quick) == ["second", "first"]
    assert not NOT_FOR_AN_UNCHANGED_LISTING & modules, sorted(
        NOT_FOR_AN_UNCHANGED_LISTING & modules
    )


def test_an_edited_composition_is_seen_by_the_next_listing(tmp_path: Path) -> None:
    """The parsed composition is remembered by its very text and the variables its ``!env``
    tags read: an edit of the file, a changed variable, or a file that no longer parses is
    seen at once (never a stale composition)."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for name in ("a", "b"):
        made = dsh("run", f"in {name}", "--root", str(tmp_path / name), "--json", cwd=tmp_path,
                   env=env)  # fmt: skip
        assert made.returncode == 0, made.stderr
    config = tmp_path / "config.yml"

    def listed(text: str, **variables: str) -> tuple[list[str], bool]:
        """The titles listed, and whether the YAML was parsed (else: remembered)."""
        config.write_text(text)
        out, modules = _run(tmp_path, {**env, **variables}, "sessions", "list", "--config",
                            str(config), "--json")  # fmt: skip
        return _titles(out), "yaml" in modules

    row = "- name: sessions\n- name: session-persistence-jsonl\n  config:\n    root: {}\n"
    assert listed(row.format(tmp_path / "a")) == (["in a"], True)
    assert listed(row.format(tmp_path / "a")) == (["in a"], False)  # remembered
    assert listed(row.format(tmp_path / "b")) == (["in b"], True)  # the file was edited
    by_variable = row.format("!env [DSH_TEST_LIST_ROOT, " + str(tmp_path / "a") + "]")
    assert listed(by_variable) == (["in a"], True)  # unset: the default
    assert listed(by_variable) == (["in a"], False)
    assert listed(by_variable, DSH_TEST_LIST_ROOT=str(tmp_path / "b")) == (["in b"], True)
    assert listed(by_variable, DSH_TEST_LIST_ROOT=str(tmp_path / "b")) == (["in b"], False)
    assert listed(by_variable, DSH_TEST_LIST_ROOT=str(tmp_path / "a")) == (["in a"], True)
    assert listed(by_variable) == (["in a"], True)  # unset again
    # A text that does not parse is the parser's error, whatever was remembered before.
    config.write_text(row.format(tmp_path / "a") + "  - [unclosed\n")
    full_env = {**os.environ, **env}
    full_env.pop("DSH_SESSION_ROOT", None)
    done = subprocess.run(
        [sys.executable, "-m", "dsh_host", "sessions", "list", "--config", str(config)],
        cwd=tmp_path, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "malformed YAML" in done.stderr, done.stderr
