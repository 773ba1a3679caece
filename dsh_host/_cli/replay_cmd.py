"""``dsh replay ID --model SPEC``: re-run a session's prompts against another model (D28).

The replay is a new session forked from ID before its first turn (the source is only read);
tools with side effects never execute in it (they are served from the record or refused, see
:mod:`dsh_host._agent.replay`); the comparison is printed at the end.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .flags import add_config_flag, add_root_flag

if TYPE_CHECKING:
    from .._agent.harness import HarnessReport
    from .._agent.replay import ReplayReport


def add_parser(sub: Any) -> None:
    replay = sub.add_parser(
        "replay",
        help="re-run a stored session's prompts against another model, without new effects",
        description="Fork ID before its first turn, run each recorded prompt with --model in "
        "the child (read-only tools run; other tools are answered from the record or refused), "
        "then compare tool calls, final answers, ends, tokens and cost turn by turn. Exit 0 "
        "when the replay ran (whether or not it diverged); --fail-on-divergence exits 1 on a "
        "divergence. --same-model is the harness mode (D32): no model call, each recorded "
        "request is derived again and compared part by part; exit 1 on any difference.",
    )
    replay.add_argument("session_id", metavar="ID")
    add_config_flag(replay)
    add_root_flag(replay)
    mode = replay.add_mutually_exclusive_group(required=True)
    mode.add_argument("--model", metavar="SPEC",
                      help="the model to replay with (as for `dsh run --model`)")  # fmt: skip
    mode.add_argument("--same-model", action="store_true",
                      help="harness mode: call no model, re-derive every recorded request "
                      "with this build's composition (system prompt, tool schemas, runtime "
                      "context, messages) and compare it with the log; exit 1 on any "
                      "difference")  # fmt: skip
    replay.add_argument("--from", dest="from_turn", type=int, default=1, metavar="TURN",
                        help="keep the turns before TURN as recorded and replay from it "
                        "(default: 1)")  # fmt: skip
    replay.add_argument("--id", dest="child_id", metavar="CHILD",
                        help="the replay session's id (default: a fresh one)")  # fmt: skip
    replay.add_argument("--fail-on-divergence", action="store_true",
                        help="exit 1 when the replay diverged from the source")  # fmt: skip
    replay.add_argument("--json", action="store_true", help="print the report as one JSON object")
    replay.set_defaults(handler=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    if args.same_model:
        return run_harness(args)
    report = replay_report(args)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        _print(report, args.model)
    return 1 if args.fail_on_divergence and report.diverged else 0


def replay_report(args: argparse.Namespace) -> ReplayReport:
    """The model replay (D28) of ``args.session_id`` with ``args.model`` (``--from``, ``--id``)
    under the composition ``args`` names; the replay is a new session in the same store."""
    from .._agent.replay import replay_stored
    from .._loader import PluginHost
    from .._persistence.persistence import SessionNotFoundError
    from .common import CliUsageError, run_with_host
    from .run_cmd import adopt, continue_session, stored_session

    if args.from_turn < 1:
        raise CliUsageError(f"--from {args.from_turn}: turns are numbered from 1")
    load = stored_session(args, args.session_id)
    if load is None:
        raise SessionNotFoundError(f'session "{args.session_id}" not found')
    located, plan = continue_session(args, load, by="dsh replay")

    async def body(host: PluginHost) -> ReplayReport:
        return await replay_stored(
            host.ctx, args.session_id, child_id=args.child_id, from_turn=args.from_turn,
            prepare=lambda agent: adopt(agent, plan),
        )  # fmt: skip

    return run_with_host(located, body)


def harness_report(args: argparse.Namespace) -> HarnessReport:
    """The harness replay of ``args.session_id`` under the composition ``args`` names (its
    ``--config`` / ``--root``, else the one ``dsh`` uses here) with the recorded model."""
    from .._agent.harness import harness_replay
    from .._loader import PluginHost
    from .._persistence.persistence import SessionNotFoundError
    from .._session.terms import recorded_terms
    from .common import run_with_host
    from .run_cmd import continue_session, stored_session

    load = stored_session(args, args.session_id)
    if load is None:
        raise SessionNotFoundError(f'session "{args.session_id}" not found')
    # Another composition is the point of the comparison, not a term to refuse; nothing is
    # written, so no terms are recorded either.
    # A session that predates run terms names no model to route: its requests are derived
    # without one (the adapter's defaults are then not resolved again: the config part says so).
    terms = recorded_terms(load.events)
    located, _plan = continue_session(
        args, load, by="dsh replay", compare_only=True, runs_turn=terms is not None,
        needs_tools=True,
    )  # fmt: skip

    async def body(host: PluginHost) -> HarnessReport:
        return await harness_replay(host.ctx, args.session_id)

    return run_with_host(located, body)


def run_harness(args: argparse.Namespace) -> int:
    from .common import CliUsageError

    for flag, given in (("--from", args.from_turn != 1), ("--id", args.child_id is not None),
                        ("--fail-on-divergence", args.fail_on_divergence)):  # fmt: skip
        if given:
            raise CliUsageError(f"{flag} is for a replay with --model; --same-model creates no "
                                "session and always exits 1 on a difference")  # fmt: skip
    report = harness_report(args)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        from .output import console
        from .render import terminal_safe

        console().print(terminal_safe(report.render()), markup=False)
    return 0 if report.identical else 1


def _cost(source: str | None, replay: str | None, delta: str | None) -> str:
    """``$0.004 -> $0.0052 (+$0.0012)``, or what is unknown (a model without a price)."""
    from decimal import Decimal

    from .render import dollars

    if source is None or replay is None or delta is None:
        known = [f"{side} {dollars(Decimal(value))}"
                 for side, value in (("source", source), ("replay", replay))
                 if value is not None]  # fmt: skip
        return "unknown (a model without a price" + ("; " + ", ".join(known) if known else "") + ")"
    change = Decimal(delta)
    sign = "-" if change < 0 else "+"
    before, after = dollars(Decimal(source)), dollars(Decimal(replay))
    return f"{before} -> {after} ({sign}{dollars(abs(change))})"


def _calls(side: dict[str, Any] | None) -> str:
    if side is None:
        return "-"
    calls = side["calls"]
    return f"{len(calls)} tool call(s)" + (
        " [" + ", ".join(c["tool"] for c in calls) + "]" if calls else ""
    )


def _print(report: Any, model: str) -> None:
    from .output import console
    from .render import terminal_safe

    out = console()

    def line(text: str, style: str | None = None) -> None:
        out.print(terminal_safe(text), style=style, markup=False)

    line(f"replay of {report.source} with {model} -> {report.replay}")
    for row in report.turns:
        source, replay = row["source"], row["replay"]
        state = "same" if row["divergence"] is None else f"diverged: {row['divergence']['kind']}"
        line(f"turn {row['turn']}: {state}", None if row["divergence"] is None else "yellow")
        line(f"  source: {_calls(source)}; ended {source['end']}")
        line(f"  replay: {_calls(replay)}; ended {replay['end'] if replay else '-'}")
        if replay is not None:
            line(f"  tokens: input {row['inputTokensDelta']:+d}, output "
                 f"{row['outputTokensDelta']:+d}", "dim")  # fmt: skip
            line(f"  cost: {_cost(source['costUsd'], replay['costUsd'], row['costUsdDelta'])}",
                 "dim")  # fmt: skip
        diff = row.get("finalTextDiff")
        if diff:
            for text in diff.splitlines():
                line(f"  {text}", "dim")
    first = report.first_divergence
    if first is None:
        line("no divergence: every turn made the same calls and gave the same answer")
    else:
        line(f"first divergence: turn {first['turn']}, {first['kind']}", "yellow")
