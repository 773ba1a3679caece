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
import contextlib
import importlib.metadata
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from ..agent.loop import error_chain
from ..errors import DshError
from ..session.persistence import SessionAlreadyOwnedError
from . import approvals_cmd, chat_cmd, plugins_cmd, run_cmd, sessions_cmd, trust_cmd
from .common import CommandInterrupted
from .interrupts import exit_on_signals

EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE: an internal error, never a user mistake


def _version() -> str:
    try:
        return importlib.metadata.version("dsh")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsh",
        description="Run LLM agents on a crash-safe, append-only session log.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log plugin activity")
    parser.add_argument("--version", action="version", version=f"dsh {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run_cmd.add_parsers(sub)
    chat_cmd.add_parser(sub)
    plugins_cmd.add_parser(sub)
    sessions_cmd.add_parser(sub)
    trust_cmd.add_parser(sub)
    approvals_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    exit_on_signals()  # no KeyboardInterrupt traceback, whatever the moment (D18)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="dsh: %(name)s: %(message)s",
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        # `dsh` alone: the interactive session on a terminal, the help elsewhere.
        if not chat_cmd.on_a_terminal():
            parser.print_help()
            return EXIT_USAGE
        args = parser.parse_args(["-v", "chat"] if args.verbose else ["chat"])
        handler = args.handler
    try:
        code: int = handler(args)
        return code
    except CommandInterrupted as exc:
        print(f"dsh: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except DshError as exc:
        # One plain line (no wrapping, no markup): users grep and paste these.
        print(f"dsh: error: {exc}", file=sys.stderr)
        if isinstance(exc, SessionAlreadyOwnedError):
            return EXIT_LOCKED
        return int(getattr(exc, "exit_code", EXIT_USAGE))
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
    except Exception as exc:  # a bug of ours, not a user mistake: one line, details on -v
        print(
            f"dsh: internal error: {error_chain(exc)} (please report it; run with -v for the "
            "traceback)",
            file=sys.stderr,
        )
        if args.verbose:
            traceback.print_exc()
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
