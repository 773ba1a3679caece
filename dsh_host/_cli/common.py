"""What every command shares: the composition with command-line overrides, and running a host.

Overrides patch the ``config`` of the row that runs a given plugin, so a flag
like ``--root`` works with any composition that has a JSONL (or SQLite) persistence row,
whatever its id. A flag whose row is missing is a usage error that says which
row the composition lacks.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from .._composition_edits import Term, enabled, patch, patch_term
from .._compositions import composition_digest, load_config
from .._loader import LocatedRow, PluginHost, canonical_name, open_host, rows_needed_for
from .._persistence.keys import SESSION_PERSISTENCE
from .._session.events.data import CompositionTerms
from .._shipped_plugins import declared_root_keys, declared_term_takers
from ..errors import ConfigError, DshError
from .interrupts import Interrupts, exit_on_signals

T = TypeVar("T")


class CliUsageError(DshError):
    """A flag or argument the user can fix (exit 2)."""

    code = "CLI_USAGE"
    exit_code = 2


def rows_of(located: Sequence[LocatedRow], plugin: str) -> list[int]:
    return [i for i, r in enumerate(located) if canonical_name(r.row.name) == plugin]


def patch_term_flag(located: list[LocatedRow], term: Term, value: Any, flag: str) -> None:
    """Set run term ``term`` to ``value`` on every enabled row that takes it; a usage error
    naming ``flag`` when there is none."""
    if not patch_term(located, term, value):
        takers = " or ".join(declared_term_takers(term)) or "a plugin declaring it"
        raise CliUsageError(
            f"{flag} needs a row that takes the {term} term ({takers}) in the composition, "
            "and it has none; add one or drop the flag"
        )


def patch_config_keys(
    located: list[LocatedRow], keys: Mapping[str, str], value: Any, flag: str
) -> None:
    """Set ``config[keys[plugin]] = value`` on every enabled row running a plugin of ``keys``;
    a usage error naming ``flag`` when there is none."""
    if not any(enabled(located, plugin) for plugin in keys):
        raise CliUsageError(
            f"{flag} needs a row running {' or '.join(keys)} in the composition, and it has "
            "none; add one or drop the flag"
        )
    for plugin, key in keys.items():
        patch(located, plugin, {key: value})


def load_composition(
    args: argparse.Namespace, *, remembered: bool = False
) -> tuple[Path, list[LocatedRow]]:
    """The composition with ``--root`` applied (no run terms: a reader does not hash the rows,
    docs/decisions.md D44). ``remembered``: see :func:`dsh_host._compositions.load_config`."""
    composition = load_config(getattr(args, "config", None), remembered=remembered)
    _apply_root(args, composition.rows)
    return composition.path, composition.rows


def load_composition_terms(
    args: argparse.Namespace,
) -> tuple[Path, list[LocatedRow], CompositionTerms]:
    """The composition with ``--root`` applied, and its identity for the run terms (its file,
    and the digest of its rows as loaded: where sessions are stored is not a term)."""
    composition = load_config(getattr(args, "config", None))
    path, located = composition.path, composition.rows
    identity = CompositionTerms(
        name=str(path.resolve()), digest=composition_digest(located)
    )
    _apply_root(args, located)
    return path, located, identity


def _apply_root(args: argparse.Namespace, located: list[LocatedRow]) -> None:
    root = getattr(args, "root", None)
    if root is not None:
        root_path = Path(root)
        if root_path.exists() and not root_path.is_dir():
            raise CliUsageError(f"--root {root}: exists and is not a directory")
        # the file stores say which config key holds their directory (Plugin.root_key)
        patch_config_keys(located, declared_root_keys(), str(root_path), "--root")


def persistence_rows(located: Sequence[LocatedRow]) -> list[LocatedRow]:
    """The rows a command that only reads stored sessions boots: the ``sessionPersistence``
    provider and what it needs (a tools row's boot checks do not concern a reader)."""
    return rows_needed_for(located, ("sessionPersistence",))


class CommandInterrupted(DshError):
    """A signal stopped the command before it had a result (exit 128 + the signal)."""

    code = "INTERRUPTED"

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_with_host(
    located: Sequence[LocatedRow],
    body: Callable[[PluginHost], Awaitable[T]],
    *,
    interrupts: Interrupts | None = None,
    backend: str = "trio",
) -> T:
    """Boot the composition (under trio by default), run ``body(host)``, dispose everything.

    ``backend="asyncio"`` is for a body that awaits an asyncio-only library
    (``dsh chat``'s line editor); the host runs on both.

    With ``interrupts``, SIGINT / SIGTERM / SIGHUP are handled for the whole
    command (see :mod:`.interrupts`): the body points it at the running turn;
    a signal with no turn running cancels the command, which then raises
    :class:`CommandInterrupted` once the host is disposed.
    """

    async def plain() -> T:
        async with open_host(located) as host:
            return await body(host)

    if interrupts is None:
        return anyio.run(plain, backend=backend)
    watched = interrupts

    async def main() -> list[T]:
        out: list[T] = []
        failure: Exception | None = None  # raised outside the task group: no ExceptionGroup
        async with anyio.create_task_group() as group:
            command = anyio.CancelScope()
            group.start_soon(watched.watch, command)
            try:
                with command:
                    async with open_host(located) as host:
                        out.append(await body(host))
            except Exception as exc:
                failure = exc
            finally:
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return out

    try:
        out = anyio.run(main, backend=backend)
    finally:
        # Once the loop is gone (reporting, exiting) a signal exits at once: no
        # KeyboardInterrupt during interpreter shutdown.
        exit_on_signals()
    if not out:
        received = watched.received
        name = received.name if received is not None else "a signal"
        raise CommandInterrupted(f"interrupted by {name}", watched.exit_code or 130)
    return out[0]


def persistence(host: PluginHost) -> Any:
    service = host.ctx.get(SESSION_PERSISTENCE)
    if service is None:
        raise ConfigError(
            "this composition stores no sessions (no row provides sessionPersistence); "
            "use a composition with session-persistence-jsonl, e.g. the shipped default"
        )
    return service
