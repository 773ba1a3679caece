"""The parsers of ``dsh run`` and ``dsh resume``; what they do is :mod:`.run_cmd`.

Kept apart so that ``dsh run --help`` (and a usage error) is answered without importing the
agent, the loader or the host: :mod:`.run_cmd` is imported when the command runs.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable
from typing import Any

from .._front.demo import DEMO_WORKSPACE
from .._front.models import MODEL_SPECS
from .._sandbox_modes import SANDBOX_MODES
from .flags import add_config_flag, add_root_flag


def _in_run_cmd(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler ``name`` of :mod:`.run_cmd`, imported when it runs."""

    def handler(args: argparse.Namespace) -> int:
        from . import run_cmd

        args.prompt = read_prompt(args.prompt, args.prompt_file)
        code: int = getattr(run_cmd, name)(args)
        return code

    return handler


#: Where a prompt too long for the command line comes from (``-`` or a pipe: standard input).
PROMPT_FILE_HELP = "read the prompt from FILE ('-': standard input)"


def _stdin_is_piped() -> bool:
    """Standard input is a pipe or a file (``echo task | dsh run``, ``dsh run < task.md``), not a
    terminal, ``/dev/null`` or a closed descriptor: only then is an absent PROMPT read from it."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def read_prompt(prompt: str | None, prompt_file: str | None) -> str | None:
    """The turn's prompt: PROMPT, ``-`` (standard input), ``--prompt-file FILE``, or a pipe.

    The command line caps an argument near 128 KiB, so a long prompt comes from a file or a
    pipe. A prompt read from somewhere is taken as it is, trailing newline aside; an empty one
    is refused, since a turn on nothing is a mistake rather than a request.
    """
    from .common import CliUsageError

    if prompt is not None and prompt_file is not None:
        raise CliUsageError("give the prompt once: PROMPT or --prompt-file, not both")
    source = prompt_file if prompt_file is not None else prompt if prompt == "-" else None
    if source is None and prompt is None and _stdin_is_piped():
        text = sys.stdin.read()
        return text.removesuffix("\n") if text.strip() else None
    if source is None:
        return prompt
    where = "standard input" if source == "-" else source
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as file:
                text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliUsageError(f"cannot read the prompt from {where}: {reason}") from None
    if not text.strip():
        raise CliUsageError(f"the prompt read from {where} is empty")
    return text.removesuffix("\n")


def add_parsers(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run one turn on a new session (or continue --session ID)",
        description="Run one agent turn to its end. Exit 0 when the turn completed, 1 otherwise.",
    )
    run.add_argument(
        "prompt",
        nargs="?",
        metavar="PROMPT",
        help="what to ask ('-' or a pipe: standard input; demo: optional)",
    )
    run.add_argument("--prompt-file", metavar="FILE", help=PROMPT_FILE_HELP)
    add_config_flag(run)
    add_root_flag(run)
    run.add_argument(
        "--session",
        metavar="ID",
        help="continue this stored session (repaired first); an unknown ID is an error unless "
        "--new is given",
    )
    run.add_argument(
        "--new",
        action="store_true",
        help="with --session ID: start a new session with this id (refused if it exists)",
    )
    model_flag(run)
    add_tool_flags(run, approvals=("ask", "never", "defer"))
    run.add_argument(
        "--attach",
        action="append",
        metavar="FILE",
        help="send an image (PNG, JPEG, GIF, WebP; at most 5 MiB) or a PDF (at most 10 MiB) "
        "with PROMPT; repeatable (20 MiB together)",
    )
    run.add_argument(
        "--reasoning",
        choices=("summary", "full", "off"),
        default="summary",
        help="how the model's reasoning is shown once it is done (while it streams, a terminal "
        "shows its latest words in the status line): summary (default) one dim line, full all "
        "of it, off nothing; the log keeps it either way",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.set_defaults(handler=_in_run_cmd("run_run"))

    resume = sub.add_parser(
        "resume",
        help="repair a stored session after a crash, then optionally run PROMPT",
        description="Open a stored session for write, append the repair closers (if any), "
        "flush, then run PROMPT as a new turn if given. Exit 3 if another process holds it.",
    )
    resume.add_argument("session_id", metavar="ID")
    resume.add_argument("prompt", nargs="?", metavar="PROMPT", help="a new turn after the repair")
    resume.add_argument("--prompt-file", metavar="FILE", help=PROMPT_FILE_HELP)
    add_config_flag(resume)
    add_root_flag(resume)
    model_flag(resume)
    add_tool_flags(resume, approvals=("ask", "never", "defer"))
    resume.add_argument("--json", action="store_true", help="print one JSON object at the end")
    resume.set_defaults(handler=_in_run_cmd("run_resume"))


def model_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="SPEC",
        help=f"{MODEL_SPECS} (default: a continued session's recorded model, else the "
        "composition's; a new `dsh run` with neither runs demo, a built-in scripted "
        "conversation); on a stored session the change is logged",
    )


_APPROVAL_HELP = {
    "ask": "ask (default): a call that needs approval is asked on the terminal (no terminal: "
    "it is not run)",
    "never": "never: nobody is asked, every such call is refused by the policy (the model is "
    "told so, in DSH's words 'the user rejected tool')",
    "defer": "defer: an unanswered ask waits for `dsh approvals decide` (the run exits 4)",
}


def add_tool_flags(parser: argparse.ArgumentParser, *, approvals: tuple[str, ...]) -> None:
    """``--workspace``, ``--create-workspace``, ``--approval``, ``--sandbox``."""
    parser.add_argument(
        "--workspace",
        metavar="DIR",
        help="directory the tools work in (default: a continued session's recorded "
        f"workspace, else the composition's; demo: {DEMO_WORKSPACE})",
    )
    parser.add_argument(
        "--create-workspace",
        action="store_true",
        help="create the --workspace directory if it does not exist",
    )
    parser.add_argument(
        "--approval",
        choices=approvals,
        help="approval policy override. " + "; ".join(_APPROVAL_HELP[a] for a in approvals),
    )
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        help="file-effect mode of bash (danger-full-access is not a sandbox)",
    )
