"""Where compositions are found (the CLI and the ``Agent`` front door share this).

The shipped YAML files live in the repository's ``configs/`` directory; a
wheel carries them as ``dsh_host/_configs``. An editable install reads the
repository copy, so there is exactly one copy of each file.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_config_dir() -> Path:
    for candidate in (_PACKAGE / "_configs", _PACKAGE.parent / "configs"):
        if (candidate / "default.yml").is_file():
            return candidate
    raise FileNotFoundError(
        "the shipped compositions (default.yml) are missing from this installation; "
        "reinstall dsh or pass --config FILE"
    )


def resolve_config(path: str | None) -> Path:
    """``--config FILE`` if given, else ``./dsh.yml`` if present, else the shipped default."""
    if path is not None:
        return Path(path)
    local = Path("dsh.yml")
    if local.is_file():
        return local
    return shipped_config_dir() / "default.yml"
