"""Which composition the CLI and the Python front door load, and how far it is trusted (D16).

A tool that works in a directory can write files there, so a composition is never loaded just
because it is in the current directory. The CLI takes, in this order:

1. a file named explicitly: ``--config FILE``, else ``$DSH_CONFIG``;
2. ``./dsh.yml`` if the user trusted it with ``dsh trust`` and its content is unchanged since
   (path and SHA-256 are recorded in ``$XDG_CONFIG_HOME/dsh/trusted.json``); a ``./dsh.yml``
   that is not trusted, or changed, is not read, and a one-line note on stderr says so;
3. the user's own ``$XDG_CONFIG_HOME/dsh/config.yml`` (``~/.config/dsh/config.yml``);
4. the shipped default.

Rows of a *trusted project file* may not choose executables or import code (``module:Attr``
rows, plugin config keys such as ``sandbox-local``'s ``runnerCommand``): the loader refuses
them, naming the file, row and key. Named files, the user's file and the shipped ones may.

The shipped YAML files live in the repository's ``configs/`` directory; a wheel carries them as
``dsh_host/_configs``. An editable install reads the repository copy, so there is exactly one
copy of each file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._composition_cache import parse_rows_cached
from ._loader import LocatedRow, check_rows, parse_rows
from ._userdirs import trust_store_file, user_config_file
from .errors import ConfigError

_PACKAGE = Path(__file__).resolve().parent  # dsh_host

#: The project file looked for in the current directory.
PROJECT_FILE = "dsh.yml"
#: Environment variable naming a composition, like ``--config``.
CONFIG_ENV = "DSH_CONFIG"

Origin = Literal["named", "trusted-project", "user", "shipped"]


def shipped_config_dir() -> Path:
    for candidate in (_PACKAGE / "_configs", _PACKAGE.parent / "configs"):
        if (candidate / "default.yml").is_file():
            return candidate
    raise FileNotFoundError(
        "the shipped compositions (default.yml) are missing from this installation; "
        "reinstall dsh or pass --config FILE"
    )


@dataclass(frozen=True, slots=True)
class Composition:
    """A composition file as loaded: where from, how trusted, its rows."""

    path: Path
    origin: Origin
    rows: list[LocatedRow]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; name a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc}") from None


def composition_digest(rows: Sequence[LocatedRow]) -> str:
    """SHA-256 of a composition's rows as loaded (name, id, config, disabled; canonical JSON):
    its identity in a session's run terms (where the file lies, or a comment in it, is not)."""
    plain = [
        {"name": r.row.name, "id": r.row.id, "config": r.row.config or {},
         "disabled": bool(r.row.disabled)}
        for r in rows
    ]
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return digest(text.encode("utf-8"))


def digest(data: bytes) -> str:
    import hashlib  # here: only a project composition is hashed (OpenSSL costs ~4 ms to load)

    return hashlib.sha256(data).hexdigest()


# -- the trust store -----------------------------------------------------------------------


def _trusted() -> dict[str, str]:
    """``{realpath: sha256}`` of the trusted project files; a missing store trusts nothing."""
    store = trust_store_file()
    try:
        document = json.loads(store.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"the trust store {store} is unreadable ({exc}); fix or delete it, then run "
            "`dsh trust` again for the files you trust"
        ) from None
    files = document.get("files") if isinstance(document, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ConfigError(
            f'the trust store {store} is not {{"files": {{path: sha256}}}}; fix or delete it'
        )
    return dict(files)


def _write_trusted(files: dict[str, str]) -> Path:
    """Replace the trust store atomically (temp file, fsync, rename, fsync the directory)."""
    store = trust_store_file()
    store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = json.dumps({"files": dict(sorted(files.items()))}, indent=2) + "\n"
    import tempfile  # here: only a trust decision writes

    fd, temp = tempfile.mkstemp(prefix=".trusted.", suffix=".tmp", dir=store.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, store)
    except BaseException:
        os.unlink(temp)
        raise
    directory = os.open(store.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return store


def trust(path: Path, check: Callable[[bytes, Path], None] | None = None) -> tuple[Path, str]:
    """Record ``path`` (canonical) with the SHA-256 of its current bytes.

    The file must load as a trusted project file would (its plugins resolve, their configs
    validate, no row imports code or chooses an executable): trusting a file that would be
    refused at every run helps nobody, so the refusal comes now, with the same message.
    ``check`` replaces that composition check for another kind of project file a plugin reads
    only when trusted (the ``hooks`` plugin's ``.claude/hooks.json``); it raises to refuse.
    """
    data = _read(path)
    if check is not None:
        check(data, path)
    else:
        check_rows(parse_rows(_decode(data, path), str(path), restricted=restriction(path)))
    canonical = Path(os.path.realpath(path))
    files = _trusted()
    files[str(canonical)] = digest(data)
    _write_trusted(files)
    return canonical, files[str(canonical)]


def revoke(path: Path) -> bool:
    """Forget ``path``; False when it was not trusted."""
    files = _trusted()
    if files.pop(os.path.realpath(path), None) is None:
        return False
    _write_trusted(files)
    return True


def trusted_files() -> dict[str, str]:
    return _trusted()


# -- resolution ------------------------------------------------------------------------------


def restriction(path: Path) -> str:
    """Why rows of the trusted project file ``path`` may not choose executables or import code,
    and the fix (appended to the loader's refusal)."""
    return (
        f"{path} is a project file loaded because it is trusted (`dsh trust`), and options that "
        f"choose executables or import code are honoured only from your user config "
        f"({user_config_file()}) or a file named with --config / ${CONFIG_ENV}: move this row "
        f"there, or name the file (--config {path})"
    )


def _note(text: str) -> None:
    print(f"dsh: note: {text}", file=sys.stderr)


def _project_file(remembered: bool) -> Composition | None:
    local = Path(PROJECT_FILE)
    if not local.is_file():
        return None
    recorded = _trusted().get(os.path.realpath(local))
    if recorded is None:
        _note(
            f"./{PROJECT_FILE} was not loaded: a project file is read only when named "
            f"(--config {PROJECT_FILE} or ${CONFIG_ENV}) or trusted (`dsh trust`)"
        )
        return None
    data = _read(local)
    if recorded != digest(data):
        _note(
            f"./{PROJECT_FILE} was not loaded: it changed since you trusted it; review it, then "
            f"run `dsh trust` again (or name it with --config {PROJECT_FILE})"
        )
        return None
    # Parse the very bytes that were hashed: no window between the check and the read.
    parse = parse_rows_cached if remembered else parse_rows
    rows = parse(_decode(data, local), str(local), restricted=restriction(local))
    return Composition(local, "trusted-project", rows)


def _named(path: Path, origin: Origin, remembered: bool) -> Composition:
    data = _read(path)
    parse = parse_rows_cached if remembered else parse_rows
    return Composition(path, origin, parse(_decode(data, path), str(path)))


def load_config(flag: str | None, *, remembered: bool = False) -> Composition:
    """The composition the CLI runs (see the module docstring for the order).

    ``remembered``: the rows may come from the parsed-composition cache when the text is
    unchanged. Only a command that runs nothing and records nothing asks for it (``dsh
    sessions list``): the cache lives under ``$XDG_CACHE_HOME``, which a tool may be allowed to
    write, so every other command parses the text itself (docs/decisions.md D44)."""
    if flag is not None:
        return _named(Path(flag), "named", remembered)
    env = os.environ.get(CONFIG_ENV, "")
    if env:
        return _named(Path(env), "named", remembered)
    project = _project_file(remembered)
    if project is not None:
        return project
    user = user_config_file()
    if user.is_file():
        return _named(user, "user", remembered)
    return _named(shipped_config_dir() / "default.yml", "shipped", remembered)
