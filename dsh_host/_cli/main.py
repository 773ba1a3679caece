"""``dsh``: argument parsing, dispatch, and the one place user errors become messages.

Exit codes (a contract): 0 success, 1 "the thing ran but did not succeed"
(a turn that did not complete, a recoverable log, rows not active), 2 usage
or input error (bad flag, unknown session, bad config, corrupt log for
``verify``), 3 the session is held by another process, 4 the turn ended
awaiting approval (``dsh run --approval defer``, ``dsh approvals decide``), 128 + N a signal
(130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; see :mod:`.interrupts`), 70 an internal
error (a bug: one line, the traceback with ``-v``). A :class:`DshError` never
reaches the user as a traceback: it is printed as one line. A closed output
pipe (``dsh sessions list | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from .signals import exit_on_signals

EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE: an internal error, never a user mistake

#: Each subcommand: the module (relative to ``dsh_host``) whose ``add_parser`` / ``add_parsers``
#: builds it, and its line in ``dsh --help``. Only the module of the command being run is
#: imported (``dsh --help`` imports none), so a command starts without loading the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("_cli.run_args", "run one turn on a new session (or continue --session ID)"),
    "resume": (
        "_cli.run_args",
        "repair a stored session after a crash, then optionally run PROMPT",
    ),
    "chat": ("_cli.chat_cmd", "interactive multi-turn session (also `dsh` alone on a terminal)"),
    "plugins": (
        "_cli.plugins_cmd",
        "show each row of a composition: plugin, entry point, services, hooks, state",
    ),
    "sessions": ("_cli.sessions_cmd", "list, show, verify, export and fork stored sessions"),
    "replay": (
        "_cli.replay_cmd",
        "re-run a stored session's prompts against another model, without new effects",
    ),
    "trust": (
        "_cli.trust_cmd",
        "let dsh load ./dsh.yml (or FILE) from its directory while it is unchanged",
    ),
    "approvals": (
        "_cli.approvals_cmd",
        "list and decide approvals that wait (dsh run --approval defer)",
    ),
    "audit": (
        "_cli.audit_cmd",
        "check an attested session export offline (`dsh sessions export ID --attest`)",
    ),
    "serve": (
        "_server.command",
        "serve sessions over HTTP (API, event streams, approvals, web inspector)",
    ),
}


class _VersionAction(argparse.Action):
    """``--version``: the version of this dsh."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from .. import __version__

        print(f"dsh {__version__}")  # on stdout, as argparse's own version action prints
        parser.exit()


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if known."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``dsh`` parser. With ``argv``, only the subcommand it names is built in full
    (the others get their ``--help`` line only); without, every one is."""
    parser = argparse.ArgumentParser(
        prog="dsh",
        description="Run LLM agents on a crash-safe, append-only session log. "
        "On a terminal, `dsh` alone opens an interactive session (`dsh chat`).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log plugin activity")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _command_of(argv) if argv is not None else None
    wanted = {m for name, (m, _) in COMMANDS.items() if argv is None or name == chosen}
    built: set[str] = set()
    for name, (module_name, line) in COMMANDS.items():
        if module_name not in wanted:
            sub.add_parser(name, help=line, add_help=False)
        elif module_name not in built:  # its module adds all of its commands at once
            built.add(module_name)
            module = importlib.import_module(f"..{module_name}", __package__)
            adder = getattr(module, "add_parsers", None) or module.add_parser
            adder(sub)
    return parser


def _not_a_boot_failure(record: logging.LogRecord) -> bool:
    """Drop the host's "failed to apply" log line: a command boots with ``open_host``, which
    raises for every row that did not activate, with the reason, so the error is printed once
    (as the ``dsh: error:`` line). ``-v`` keeps the log line."""
    return not str(record.msg).startswith("plugin row %r (%s) failed to apply")


def _on_a_terminal() -> bool:
    try:
        return os.isatty(0) and os.isatty(1)
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_signals()  # no KeyboardInterrupt traceback, whatever the moment (D18)
    if argv is None:  # the process's own command line: the process ends with this command
        # The interpreter's last garbage collections walk every object the imports made (a
        # thousand classes); frozen, they are skipped, a third of a short command's wall time.
        # Nothing of dsh waits for a collection at exit: logs and the trust store are written,
        # flushed and closed explicitly, locks go with the process, and atexit handlers (this
        # one among them) all run before those collections.
        atexit.register(gc.freeze)
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="dsh: %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("dsh.host").addFilter(_not_a_boot_failure)
    handler = getattr(args, "handler", None)
    if handler is None:
        # `dsh` alone: the interactive session on a terminal, the help elsewhere.
        if args.command is not None or not _on_a_terminal():
            parser.print_help()
            return EXIT_USAGE
        words = ["-v", "chat"] if args.verbose else ["chat"]
        args = build_parser(words).parse_args(words)
        handler = args.handler
    try:
        try:
            code: int = handler(args)
        finally:
            _no_status_line()
        return code
    except KeyboardInterrupt:
        print("dsh: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`dsh sessions list | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        return _failed(exc, verbose=args.verbose)


def _no_status_line() -> None:
    """The command is over, however it ended: a live status line it left is erased before
    any error line is printed (a line on top of a spinner reads as garbage)."""
    from .output import settle_stdout, status_line, stdout_writer

    if status_line.cache_info().currsize:  # only if the command ever had one
        status_line().hide()
    if stdout_writer.cache_info().currsize:  # whatever is still queued, in order, before it
        settle_stdout()


def _failed(exc: Exception, *, verbose: bool) -> int:
    """Report what stopped a command in one line; the exit code it means."""
    from .._persistence.persistence import SessionAlreadyOwnedError
    from ..errors import DshError
    from .common import CommandInterrupted

    if isinstance(exc, CommandInterrupted):
        print(f"dsh: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    if isinstance(exc, DshError):
        # One plain line (no wrapping, no markup): users grep and paste these.
        print(f"dsh: error: {exc}", file=sys.stderr)
        if isinstance(exc, SessionAlreadyOwnedError):
            return EXIT_LOCKED
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    # A bug of ours, not a user mistake: one line, details on -v.
    from .._agent.loop import error_chain  # here: a user error (above) needs no agent loop

    print(
        f"dsh: internal error: {error_chain(exc)} (please report it; run with -v for the "
        "traceback)",
        file=sys.stderr,
    )
    if verbose:
        traceback.print_exception(exc)
    return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
