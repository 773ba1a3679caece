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
