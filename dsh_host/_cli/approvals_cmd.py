"""``dsh approvals list | decide`` and ``dsh run --approval defer`` (D19): approvals that wait.

``dsh run --approval defer`` runs headless: an ask nobody answers is deferred,
the turn ends ``awaiting-approval``, every pending call is printed (session id,
call id, tool, escaped arguments) and the command exits **4**. Later, from any
process, ``dsh approvals list`` shows what waits and ``dsh approvals decide
SESSION CALL allow|deny`` records the decision (bound to the call's
``argsDigest``, one-shot) and, unless ``--no-continue``, continues the session
in its recorded workspace: the decided calls run (or get the rejection text),
then the model. Exit codes: 0 the continued turn completed (or the decision was
recorded with ``--no-continue``), 4 it is awaiting approval again, 2 unknown
session or call / already decided / not pending / arguments changed, 3 another
process holds the session, 1 the continued turn ended otherwise.

A parent whose delegating call waits on its child's asks (D36) ends awaiting too; the child's
pending calls are listed with ``waitedOnBy``, and deciding one continues the top waiting parent.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
from collections.abc import Sequence
from typing import Any, Final, cast

import msgspec

from .._agent import AGENT, Agent
from .._loader import LocatedRow, PluginHost
from .._persistence.keys import SESSION_PERSISTENCE
from .._persistence.persistence import SessionNotFoundError
from .._session.approvals import (
    AWAITING_APPROVAL,
    mark_waiters,
    pending_approvals,
    pending_in_tree,
    waiting_calls,
    waiting_root,
)
from .._session.keys import SESSIONS
from .answerer import _escape
from .common import (
    load_composition,
    patch_term_flag,
    persistence,
    run_with_host,
)
from .flags import add_config_flag, add_root_flag
from .hints import command_hint
from .interrupts import Interrupts
from .output import console

__all__ = [
    "EXIT_AWAITING",
    "add_parser",
    "apply_approval_flag",
    "print_pending",
    "tree_pending",
]

#: Exit code of a command whose turn ended awaiting approval.
EXIT_AWAITING: Final = 4


def apply_approval_flag(located: list[LocatedRow], value: str) -> None:
    """``--approval ask|never|defer``: the policy, or ``ask`` with unanswered asks deferred."""
    if value == "defer":
        patch_term_flag(located, "approval_policy", "ask", "--approval")
        patch_term_flag(located, "unanswered", "defer", "--approval")
    else:
        patch_term_flag(located, "approval_policy", value, "--approval")


def print_pending(rows: Sequence[dict[str, Any]]) -> None:
    """The human listing: everything from the log is escaped for the terminal."""
    out = console()
    for row in rows:
        session, call = _escape(row["sessionId"]), _escape(row["callId"])
        out.print(
            f"awaiting approval: session {session} · call {call} · tool {_escape(row['tool'])}",
            style="yellow",
            markup=False,
            highlight=False,
        )
        out.print(f"  arguments: {_escape(row['arguments'])}", markup=False, highlight=False)
        if row.get("sandboxMode") is not None:
            out.print(
                f"  asked under: sandbox {_escape(row['sandboxMode'])}, network "
                f"{_escape(str(row.get('network')))}",
                markup=False, highlight=False,
            )
        for waiter in row.get("waitedOnBy") or ():
            out.print(
                f"  waited on by: session {_escape(waiter['sessionId'])} · call "
                f"{_escape(waiter['callId'])} (deciding continues that session too)",
                markup=False,
                highlight=False,
            )
        out.print(
            "  decide: "
            + command_hint(
                "dsh", "approvals", "decide", row["sessionId"], row["callId"], "allow|deny"
            ),
            style="dim",
            markup=False,
            highlight=False,
        )


async def tree_pending(host: PluginHost, events: Sequence[Any], session_id: str) -> list[
    dict[str, Any]
]:
    """The pending approvals of a session and of the child sessions its calls wait on (D36)."""
    store = host.ctx.get(SESSION_PERSISTENCE)

    async def read(other: str) -> Sequence[Any] | None:
        if store is None:
            return None
        try:
            load = await store.inspect(other)
        except SessionNotFoundError:
            return None
        return cast("Sequence[Any]", load.events)

    return await pending_in_tree(events, session_id, read)


def is_awaiting(reason: Any) -> bool:
    if reason is None:
        return False
    data = msgspec.to_builtins(reason)
    return isinstance(data, dict) and data.get("kind") == AWAITING_APPROVAL


def add_parser(sub: Any) -> None:
    approvals = sub.add_parser(
        "approvals",
        help="list and decide approvals that wait (dsh run --approval defer)",
        description="Approvals deferred by `dsh run --approval defer`: list them, decide one.",
    )
    commands = approvals.add_subparsers(dest="approvals_command", metavar="SUBCOMMAND")
    approvals.set_defaults(handler=lambda args: _usage(approvals))

    listing = commands.add_parser("list", help="every pending approval across stored sessions")
    add_config_flag(listing)
    add_root_flag(listing)
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=run_list)

    decide = commands.add_parser(
        "decide",
        help="record a decision for a pending call, then continue the session",
        description="Record allow or deny for one pending call (bound to its logged arguments, "
        "one-shot) and, unless --no-continue, continue the session in its recorded workspace. "
        "Exit 0 completed, 4 awaiting approval again, 2 not pending / already decided / "
        "unknown, 3 held by another process.",
    )
    decide.add_argument("session_id", metavar="SESSION")
    decide.add_argument("call_id", metavar="CALL_ID")
    decide.add_argument("decision", choices=("allow", "deny"))
    decide.add_argument("--reason", metavar="TEXT", help="why (recorded with the decision)")
    decide.add_argument(
        "--args-digest",
        metavar="HEX",
        help="refuse unless the call's argsDigest is this (the one `approvals list` showed)",
    )
    decide.add_argument(
        "--no-continue", action="store_true", help="only record the decision; run nothing"
    )
    add_config_flag(decide)
    add_root_flag(decide)
    _continue_flags(decide)
    decide.set_defaults(handler=run_decide)

    resume = commands.add_parser(
        "continue",
        help="continue a session whose pending calls are all decided",
        description="Apply the recorded decisions (after `decide --no-continue`, or a crash "
        "between a decision and its turn) and continue the session in its recorded workspace. "
        "Exit 0 completed, 4 awaiting approval (again, or some call is still undecided), 2 "
        "nothing awaits approval / unknown session, 3 held by another process.",
    )
    resume.add_argument("session_id", metavar="SESSION")
    add_config_flag(resume)
    add_root_flag(resume)
    _continue_flags(resume)
    resume.set_defaults(handler=run_continue, call_id=None, decision=None, no_continue=False)


def _continue_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="SPEC",
        help="the model that continues the session (default: its recorded one); the change "
        "is logged",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# -- list --------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    _, located = load_composition(args)

    async def body(host: PluginHost) -> list[dict[str, Any]]:
        store = persistence(host)
        rows: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        for listing in await store.list():
            try:
                load = await store.inspect(listing.header.id)
            except Exception:  # one unreadable log must not hide the others' approvals
                continue
            rows.extend(pending_approvals(load.events, load.header.id))
            waiting.extend(waiting_calls(load.events, load.header.id))
        mark_waiters(rows, waiting)  # a parent whose delegation waits on a child's ask (D36)
        rows.sort(key=lambda r: (r["askedAt"], r["sessionId"], r["callId"]))
        return rows

    rows = run_with_host(located, body)
    if args.json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=True))
    elif not rows:
        console().print("no approvals are pending", style="dim", markup=False)
    else:
        print_pending(rows)
    return 0


# -- decide ------------------------------------------------------------------------------


def _decided_by() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"dsh approvals decide by {user}@{socket.gethostname()} (pid {os.getpid()})"


def run_continue(args: argparse.Namespace) -> int:
    return run_decide(args)


def _waiting_root(args: argparse.Namespace, load: Any) -> str | None:
    """The top session of the chain of parents whose delegating calls wait on ``load`` (D36),
    or None when no parent waits on it."""
    from .run_cmd import stored_session

    chain = waiting_root(load)
    try:
        wanted = next(chain)
        while True:
            wanted = chain.send(stored_session(args, wanted))
    except StopIteration as done:
        return cast("str | None", done.value)


def run_decide(args: argparse.Namespace) -> int:
    """``decide`` (``args.decision`` set) and ``continue`` (None): see the module docstring.

    A decision for a child session a parent's delegating call waits on (D36) is recorded in
    the child, then the top waiting parent is continued: its delegating call re-attaches to
    the child, which applies the decision and answers it.
    """
    from .run_cmd import Transcript, adopt, continue_session, stored_session

    # The session's recorded terms: read it first (this also reports an unknown session,
    # exit 2, before anything else is booted for it).
    load = stored_session(args, args.session_id)
    if load is None:
        raise SessionNotFoundError(f'session "{args.session_id}" not found')
    if args.decision is None and not args.no_continue:
        root = _waiting_root(args, load)
        if root is not None:  # the child alone would run without its declared role (D36)
            if not args.json:
                console().print(
                    f"session {_escape(args.session_id)} is a sub-agent that session "
                    f"{_escape(root)} waits on; continuing {_escape(root)}",
                    markup=False,
                    highlight=False,
                )
            return run_decide(argparse.Namespace(**{**vars(args), "session_id": root}))
    if args.decision is not None and not args.no_continue:
        root = _waiting_root(args, load)
        if root is not None:
            recorded = run_decide(argparse.Namespace(**{**vars(args), "no_continue": True,
                                                        "json": True, "quiet_json": True}))
            if recorded != 0:
                return recorded
            if not args.json:
                verb = "allowed" if args.decision == "allow" else "denied"
                console().print(
                    f"{verb} call {_escape(args.call_id)} of session "
                    f"{_escape(args.session_id)}; continuing session {_escape(root)}, which "
                    "waits on it",
                    markup=False,
                    highlight=False,
                )
            return run_decide(argparse.Namespace(**{
                **vars(args), "session_id": root, "call_id": None, "decision": None,
            }))
    # Headless: a session without recorded terms is assumed to defer a new ask again (what
    # `approvals` always did); one with terms continues under them, whatever they say.
    located, plan = continue_session(
        args, load, by=f"dsh approvals {'decide' if args.decision else 'continue'}",
        runs_turn=not args.no_continue, legacy_approval="defer", needs_tools=True,
    )
    transcript = Transcript(quiet=args.json)
    interrupts = Interrupts()

    async def body(host: PluginHost) -> dict[str, Any]:
        transcript.install(host)
        agent: Agent = await host.ctx.service(AGENT).resume(args.session_id)
        try:
            adopt(agent, plan)  # a decision is made, and bound, under the terms in force
            if args.decision is not None:
                await agent.decide(
                    args.call_id,
                    args.decision,
                    reason=args.reason,
                    decided_by=_decided_by(),
                    args_digest=args.args_digest,
                )
            reason: Any = None
            if not args.no_continue:
                interrupts.target(agent.cancel)
                try:
                    reason = await agent.continue_turn()
                finally:
                    interrupts.target(None)
            await host.ctx.service(SESSIONS).flush(agent.session)
            transcript.finish()  # flushed: now the printing may wait for the reader
            return {
                "sessionId": agent.session.id,
                "callId": args.call_id,
                "decision": args.decision,
                "continued": not args.no_continue,
                "turnEnd": msgspec.to_builtins(reason) if reason is not None else None,
                "pendingApprovals": await tree_pending(
                    host, agent.session.events, agent.session.id
                ),
                "events": len(agent.session.events),
            }
        finally:
            await agent.aclose()

    result = run_with_host(located, body, interrupts=interrupts)
    if interrupts.exit_code is not None:
        return interrupts.exit_code
    turn_end = result["turnEnd"]
    kind = turn_end.get("kind") if isinstance(turn_end, dict) else None
    if getattr(args, "quiet_json", False):
        pass  # the decision half of a decide that continues a waiting parent (D36)
    elif args.json:
        print(json.dumps({**result, "turnEnd": {"kind": kind} if kind else None}))
    else:
        if args.decision is not None:
            verb = "allowed" if args.decision == "allow" else "denied"
            console().print(
                f"{verb} call {_escape(args.call_id)} of session {_escape(args.session_id)}",
                markup=False,
                highlight=False,
            )
        if result["pendingApprovals"]:
            print_pending(result["pendingApprovals"])
    if kind == AWAITING_APPROVAL:
        return EXIT_AWAITING
    return 0 if kind in (None, "completed") else 1
