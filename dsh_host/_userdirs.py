"""Where dsh keeps the user's own files (XDG base directories, D15/D16).

* ``$XDG_CONFIG_HOME/dsh/`` (``~/.config/dsh``): ``config.yml``, the user's own composition,
  and ``trusted.json``, the project files the user trusted with ``dsh trust``;
* ``$XDG_DATA_HOME/dsh/sessions`` (``~/.local/share/dsh/sessions``): the default session root of
  ``session-persistence-jsonl`` (``$DSH_SESSION_ROOT`` overrides it);
* ``$XDG_CACHE_HOME/dsh/`` (``~/.cache/dsh``): what can be computed again, e.g. the summaries
  ``dsh sessions list`` remembers (:mod:`dsh_host._cli.list_cache`) and the compositions it
  parsed (:mod:`dsh_host._composition_cache`). Only a listing trusts what is there: a tool may
  be let write ``~/.cache`` (docs/decisions.md D44).

Both live outside any project directory, so a tool working in a workspace cannot plant a
composition for the next run or rewrite the log that records it. Per the XDG specification a
relative ``XDG_*`` value is ignored.
"""

from __future__ import annotations

import json
import os
import stat
from contextlib import suppress
from pathlib import Path
from typing import Any

from . import __version__

__all__ = [
    "SESSION_ROOT_ENV",
    "cache_home",
    "config_home",
    "data_home",
    "default_session_root",
    "read_cache_document",
    "trust_store_file",
    "user_config_file",
    "write_cache_document",
]

#: Environment variable naming the session root (overrides the XDG default).
SESSION_ROOT_ENV = "DSH_SESSION_ROOT"


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path(os.path.expanduser(fallback))


def config_home() -> Path:
    """``$XDG_CONFIG_HOME``, else ``~/.config``."""
    return _xdg("XDG_CONFIG_HOME", "~/.config")


def data_home() -> Path:
    """``$XDG_DATA_HOME``, else ``~/.local/share``."""
    return _xdg("XDG_DATA_HOME", "~/.local/share")


def cache_home() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return _xdg("XDG_CACHE_HOME", "~/.cache")


def user_config_file() -> Path:
    """The user's own composition: ``$XDG_CONFIG_HOME/dsh/config.yml``."""
    return config_home() / "dsh" / "config.yml"


def trust_store_file() -> Path:
    """Project files trusted with ``dsh trust``: ``$XDG_CONFIG_HOME/dsh/trusted.json``."""
    return config_home() / "dsh" / "trusted.json"


def default_session_root() -> str:
    """``$DSH_SESSION_ROOT`` if set, else ``$XDG_DATA_HOME/dsh/sessions``."""
    configured = os.environ.get(SESSION_ROOT_ENV, "")
    if configured:
        return os.path.expanduser(configured)
    return str(data_home() / "dsh" / "sessions")


def read_cache_document(path: Path, max_bytes: int, layout: int, key: str) -> Any:
    """What :func:`write_cache_document` stored under ``key`` in one of dsh's cache files, or
    None when there is nothing we trust: missing, a symbolic link, not a regular file, another
    user's, larger than ``max_bytes``, not JSON, another ``layout`` or another dsh version's
    file. The caller checks the value's shape."""
    try:  # not through a symlink; a directory or another owner's file is not ours
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as file:
            st = os.fstat(file.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > max_bytes:
                return None
            data = file.read(max_bytes + 1)
    except OSError:
        return None
    try:
        document = json.loads(data)
    except ValueError:
        return None
    if (
        not isinstance(document, dict)
        or document.get("format") != layout
        or document.get("dsh") != __version__
    ):
        return None
    return document.get(key)


def write_cache_document(path: Path, layout: int, key: str, value: Any) -> None:
    """Replace ``path`` with ``value`` under ``key``, stamped with ``layout`` and this dsh's
    version, as compact JSON, atomically (a new file of mode 0600, never through a symbolic
    link, renamed over it; the directory made 0700). Raises OSError when it cannot: a cache the
    caller may do without."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    document = {"format": layout, "dsh": __version__, key: value}
    data = json.dumps(document, separators=(",", ":")).encode("utf-8")
    temporary = directory / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
