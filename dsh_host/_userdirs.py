"""Where dsh keeps the user's own files (XDG base directories, D15/D16).

* ``$XDG_CONFIG_HOME/dsh/`` (``~/.config/dsh``): ``config.yml``, the user's own composition,
  and ``trusted.json``, the project files the user trusted with ``dsh trust``;
* ``$XDG_DATA_HOME/dsh/sessions`` (``~/.local/share/dsh/sessions``): the default session root of
  ``session-persistence-jsonl`` (``$DSH_SESSION_ROOT`` overrides it);
* ``$XDG_CACHE_HOME/dsh/`` (``~/.cache/dsh``): what can be computed again, e.g. the summaries
  ``dsh sessions list`` remembers (:mod:`dsh_host._cli.list_cache`).

Both live outside any project directory, so a tool working in a workspace cannot plant a
composition for the next run or rewrite the log that records it. Per the XDG specification a
relative ``XDG_*`` value is ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "SESSION_ROOT_ENV",
    "cache_home",
    "config_home",
    "data_home",
    "default_session_root",
    "trust_store_file",
    "user_config_file",
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
