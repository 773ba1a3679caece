"""``dsh run`` and ``dsh resume``: one turn on a session, printed as it happens.

``run`` starts a new session (or continues the stored ``--session ID``,
repairing it first if a crash interrupted it; ``--session ID --new`` starts
one with a chosen id); ``resume`` repairs a stored session and
optionally runs a new turn. Both print the transcript while it streams --
text as it arrives, every tool call with its call id, approvals, results --
and end with the session id and where the log is stored.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..agent import AGENT_CHUNK, Agent, ChunkReceived
from ..errors import ConfigError
from ..front.demo import DEMO_PROMPT, DEMO_WORKSPACE
from ..front.models import ModelChoice
from ..front.models import parse_model as parse_model_spec
from ..loader import LocatedRow, PluginHost, Row
from ..session.approvals import pending_approvals
from ..session.events import SessionEvent, to_builtins, turn_end_kind
from ..session.header import SessionHeader, new_session_id
from ..session.keys import SESSION_EVENT
from ..session.messages import BlockEndChunk, TextBlock, TextDeltaChunk, UserSource
from ..session.persistence import SessionNotFoundError
from ..shipped_plugins import declared_model_routes
from .answerer import install_terminal_answerer
from .approvals_cmd import EXIT_AWAITING, apply_approval_flag, print_pending
from .common import (
    CliUsageError,
    load_composition,
    patch_config,
    persistence_rows,
    rows_of,
    run_with_host,
)
from .hints import command_hint
from .interrupts import Interrupts
from .output import console
from .render import (
    approval_lines,
    blocks_text,
    continued,
    gutter_stream,
    retry_summary,
    terminal_safe,
    tool_result_lines,
    turn_end_line,
)
from .usage import logged_usage


def parse_model(spec: str) -> ModelChoice:
    try:
        return parse_model_spec(spec)
    except ConfigError as exc:
        raise CliUsageError(str(exc)) from None


def compose(
    args: argparse.Namespace,
    *,
    workspace: str | None,
    demo_workspace: bool,
    recorded: bool = False,
) -> tuple[list[LocatedRow], str]:
    """The composition with the command line's overrides, and the workspace to record.

    ``workspace`` is ``--workspace`` or, with ``recorded``, the one a continued session
    recorded (then a composition without a tools row simply has no workspace to set).
    """
    _, located = load_composition(args)
    choice = _configured_choice(located, parse_model(args.model))
    if choice.row.id is not None:  # a row of its own (else the composition's, patched)
        located = [r for r in located if r.row.id != choice.row.id]
        located.insert(0, LocatedRow(choice.row, f"--model {args.model}"))
    demo = workspace is None and demo_workspace and args.model == "demo"
    if demo:
        workspace = DEMO_WORKSPACE
    tools = any(not located[i].row.disabled for i in rows_of(located, "builtin-tools"))
    if workspace is not None and (tools or not recorded):
        flag = "--workspace" if not recorded else "the session's recorded workspace"
        _prepare_workspace(
            workspace, create=demo or getattr(args, "create_workspace", False), flag=flag
        )
        patch_config(located, ("builtin-tools",), "workspace", workspace, "--workspace")
    if getattr(args, "approval", None) is not None:
        apply_approval_flag(located, args.approval)
    if getattr(args, "sandbox", None) is not None:
        patch_config(located, ("builtin-tools",), "sandbox", args.sandbox, "--sandbox")
    located = [_with_agent_model(r, choice) for r in located]
    return located, _tools_workspace(located)


def _routed(choice: ModelChoice) -> bool:
    """True for a ``PREFIX:MODEL`` spec (a plugin's declared route), not demo/scripted."""
    return any(choice.row.name == plugin for plugin, _ in declared_model_routes().values())


def _configured_choice(located: list[LocatedRow], choice: ModelChoice) -> ModelChoice:
    """``--model PREFIX:M`` on a composition that configures a row of that prefix's plugin
    (``llm-openai-compatible``, ``llm-anthropic``): that row as configured (endpoint, key,
    provider route), with only its model name replaced by M. Otherwise the spec's own row."""
    if not _routed(choice):
        return choice
    plugin = choice.row.name
    rows = [i for i in rows_of(located, plugin) if not located[i].row.disabled]
    if not rows:
        return choice
    patch_config(located, (plugin,), "model", choice.model, "--model")
    config = located[rows[0]].row.config or {}
    provider = config.get("provider", choice.provider)
    return ModelChoice(
        Row(name=choice.row.name, config=dict(config)),  # no id: nothing is added
        provider if isinstance(provider, str) else choice.provider,
        choice.model,
    )


def _tools_workspace(located: list[LocatedRow]) -> str:
    """The directory the tools work in (recorded as the session's ``cwd``): the tools row's
    ``workspace`` made absolute, else the current directory."""
    for index in rows_of(located, "builtin-tools"):
        row = located[index].row
        if not row.disabled:
            configured = (row.config or {}).get("workspace", ".")
            if isinstance(configured, str) and configured:
                return os.path.abspath(os.path.expanduser(configured))
    return os.getcwd()


def stored_header(args: argparse.Namespace, session_id: str) -> SessionHeader | None:
    """The header of the stored session ``session_id`` (None: not stored), read from the
    composition's store before the full composition boots (its tools need the workspace)."""
    rows = persistence_rows(load_composition(args)[1])

    async def body(host: PluginHost) -> SessionHeader | None:
        store = host.ctx.get("sessionPersistence")
        if store is None:
            return None
        for listing in await store.list(unreadable=[]):  # another damaged log is no obstacle
            if listing.header.id == session_id:
                header: SessionHeader = listing.header
                return header
        try:  # not listed: the store's own verdict on the id (malformed, too long, absent)
            await store.inspect(session_id)
        except SessionNotFoundError:
            return None
        return None

    return run_with_host(rows, body)


def recorded_workspace(args: argparse.Namespace, session_id: str) -> str | None:
    """The workspace ``session_id`` recorded (its header's ``cwd``), or None."""
    header = stored_header(args, session_id)
    if header is None or not isinstance(header.cwd, str):
        return None
    return header.cwd


def _prepare_workspace(workspace: str, *, create: bool, flag: str = "--workspace") -> None:
    """The workspace must be a directory; it is created only when asked (or for the demo)."""
    path = Path(workspace)
    if path.is_dir():
        return
    if path.exists():
        raise CliUsageError(f"{flag} {workspace}: not a directory")
    if not create:
        hint = "pass --create-workspace" if flag == "--workspace" else (
            "pass --workspace DIR to continue it elsewhere, or --create-workspace"
        )
        raise CliUsageError(f"{flag} {workspace}: no such directory; create it, or {hint}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CliUsageError(
            f"{flag} {workspace}: cannot create it: {error.strerror or error}"
        ) from None


def _with_agent_model(located: LocatedRow, choice: ModelChoice) -> LocatedRow:
    if located.row.name != "agent":
        return located
    config = dict(located.row.config or {})
    config.setdefault("provider", choice.provider)
    if _routed(choice):
        config["model"] = choice.model  # --model PREFIX:M names the model: M
    else:
        config.setdefault("model", choice.model)
    row = Row(name="agent", id=located.row.id, config=config, disabled=located.row.disabled)
    return replace(located, row=row)


# -- live transcript ---------------------------------------------------------------------


@dataclass
class Transcript:
    """Prints a run as it happens; silent under --json (stdout carries one object)."""

    quiet: bool
    _mid_line: bool = False
    _approval: Any = None

    def _print(self, text: str, style: str | None = None, *, multiline: bool = False) -> None:
        """Print one transcript line; control characters in it are shown escaped, never sent."""
        if self.quiet:
            return
        if self._mid_line:
            console().print()
            self._mid_line = False
        console().print(terminal_safe(text, multiline=multiline), style=style, markup=False)

    def install(self, host: PluginHost) -> None:
        # Observers only (`agent/chunk`, `session/event`): the bus contains a printer that
        # fails (a closed pipe), so printing can stop but never cut the turn.
        host.ctx.on(AGENT_CHUNK, self._on_chunk)
        host.ctx.on(SESSION_EVENT, self._on_event)
        self._approval = host.ctx.get("approval")
        if _ACTIVITY.isEnabledFor(logging.INFO):  # `dsh -v`: every event as it is appended
            host.ctx.on(SESSION_EVENT, _log_event)

    def _on_chunk(self, received: ChunkReceived) -> None:
        # Only the agent loop's steps emit `agent/chunk`: a maintenance request (a compaction
        # summary, ...) is not the assistant speaking and is not printed live.
        if self.quiet:
            return
        chunk = received.chunk
        if isinstance(chunk, TextDeltaChunk) and chunk.text:
            text = terminal_safe(chunk.text)
            text = gutter_stream(text, at_line_start=not self._mid_line)
            console().print(text, end="", markup=False, highlight=False)
            self._mid_line = not chunk.text.endswith("\n")
        elif isinstance(chunk, BlockEndChunk) and isinstance(chunk.block, TextBlock):
            if self._mid_line:
                console().print()
                self._mid_line = False

    def _on_event(self, session: Any, event: SessionEvent) -> None:
        # Called for every append: do nothing (not even a conversion) unless it is shown.
        kind = event.type
        if self.quiet or kind not in _SHOWN_EVENTS:
            return
        if kind == "user/message":
            message = event.data  # a user/message's data is the message itself
            if isinstance(message.source, UserSource):  # not plugin notices or context
                said = continued(terminal_safe(f"you: {blocks_text(message.content)}"))
                self._print(said, "bold", multiline=True)
            return
        if kind == "tool/result":
            for style, text in tool_result_lines(event.data):
                self._print(text, style)
            return
        data = to_builtins(event.data)
        if kind == "tool/call":
            self._print(f"⚙ {data.get('name')} [{data.get('callId')}] {data.get('arguments', '')}",
                        "cyan")
        elif kind in ("approval/asked", "approval/decided"):
            [(style, text)] = approval_lines(kind, data)
            if kind == "approval/decided":
                text += self._decided_by(session, data)
            self._print(text, style)
        elif kind == "llm/retry":
            self._print(f"↻ {retry_summary(data)}", "yellow")
        elif kind == "turn/end":
            style, text = turn_end_line(data)
            self._print(text, style)

    def _decided_by(self, session: Any, data: dict[str, Any]) -> str:
        """Who rejected: under policy ``never`` nobody was asked, the policy refused."""
        policy = getattr(self._approval, "effective_policy", None)
        if data.get("outcome") != "rejected" or policy is None or policy(session) != "never":
            return ""
        return " by the approval policy never (no one was asked)"


_ACTIVITY = logging.getLogger("dsh.session")


def _log_event(session: Any, event: SessionEvent) -> None:
    _ACTIVITY.info("%s #%d %s", session.id, event.seq, event.type)


_SHOWN_EVENTS = frozenset(
    {
        "user/message",
        "tool/call",
        "tool/result",
        "approval/asked",
        "approval/decided",
        "llm/retry",
        "turn/end",
    }
)


# -- run / resume --------------------------------------------------------------------------


async def _finish(args: argparse.Namespace, host: PluginHost, agent: Agent, reason: Any,
                  transcript: Transcript) -> dict[str, Any]:
    # The turn's closing events are made durable before the run reports anything: a
    # "completed" printed here is on disk, not in a write-behind buffer.
    await host.ctx.sessions.flush(agent.session)
    kind = turn_end_kind(reason) if reason is not None else None
    store = host.ctx.get("sessionPersistence")
    where = store.locate(agent.session.header).path if store is not None else None
    turn = agent.last_turn if reason is not None else None
    return {
        "sessionId": agent.session.id,
        "turnEnd": _turn_end(kind, reason),
        "events": len(agent.session.events),
        "where": where,
        "pendingApprovals": pending_approvals(agent.session.events, agent.session.id),
        "usage": _usage(agent.session.events, turn),
        "finalText": _final_text(agent.session.events, turn),
    }


def _turn_end(kind: str | None, reason: Any) -> dict[str, Any] | None:
    """``{kind}``, plus ``code`` and ``message`` when the turn end carries them."""
    if kind is None:
        return None
    out: dict[str, Any] = {"kind": kind}
    data = to_builtins(reason)
    if isinstance(data, dict):
        found = data.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        code = error.get("code") or data.get("code")
        message = error.get("message") or data.get("message")
        if code is not None:
            out["code"] = code
        if message is not None:
            out["message"] = message
    return out


def _usage(events: Any, turn: int | None) -> dict[str, dict[str, int] | None]:
    """Token counts of the model's answers: this turn's (None without a turn) and the session's."""
    events = list(events)
    return {
        "turn": logged_usage(events, turn) if turn is not None else None,
        "total": logged_usage(events),
    }


def _final_text(events: Any, turn: int | None) -> str | None:
    """The text of the turn's last assistant message that has text, or None."""
    if turn is None:
        return None
    for event in reversed(events):
        if event.type != "assistant/message" or event.data.turn != turn:
            continue
        text = "".join(b.text for b in event.data.message.content if isinstance(b, TextBlock))
        if text:
            return text
    return None


def _report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    completed = result["turnEnd"] is None or result["turnEnd"]["kind"] == "completed"
    if args.json:
        payload = {
            k: result[k] for k in ("sessionId", "turnEnd", "events", "usage", "finalText")
        }
        if "closers" in result:
            payload["closers"] = result["closers"]
        if result.get("pendingApprovals"):
            payload["pendingApprovals"] = result["pendingApprovals"]
        print(json.dumps(payload))
    else:
        print_pending(result.get("pendingApprovals") or ())
        out = console()
        where = result["where"] or "memory only (this composition stores no sessions)"
        out.print(f"session {result['sessionId']} · {result['events']} events · {where}",
                  style="dim", markup=False)
        if result["where"]:
            hint = command_hint("dsh", "sessions", "show", result["sessionId"])
            out.print(f"  inspect: {hint}", style="dim", markup=False)
    if result.get("pendingApprovals"):
        return EXIT_AWAITING
    return 0 if completed else 1


def _continue_or_start(args: argparse.Namespace) -> tuple[list[LocatedRow], str, bool]:
    """Compose ``dsh run``: with ``--session ID`` of a stored session, in its workspace."""
    header = stored_header(args, args.session) if args.session else None
    _check_new_flag(args, stored=header is not None)
    recorded = header.cwd if header is not None and isinstance(header.cwd, str) else None
    if args.workspace is None and recorded is not None:
        located, cwd = compose(args, workspace=recorded, demo_workspace=False, recorded=True)
    else:
        located, cwd = compose(args, workspace=args.workspace, demo_workspace=header is None)
    return located, cwd, header is not None


def run_run(args: argparse.Namespace) -> int:
    located, cwd, stored = _continue_or_start(args)
    prompt = args.prompt
    if prompt is None:
        if args.model != "demo":
            raise CliUsageError("PROMPT is required unless --model is demo")
        prompt = DEMO_PROMPT
    transcript = Transcript(quiet=args.json)
    interrupts = Interrupts()

    async def body(host: PluginHost) -> dict[str, Any]:
        transcript.install(host)
        _install_answerer(host, interrupts)
        service = host.ctx.agent
        if stored:
            # Ownership first: a second writer is refused (exit 3) before any repair is shown.
            agent = await service.resume(args.session)
            closers: list[dict[str, Any]] | None = repair_rows(agent)
            print_closers(transcript, closers or [])
        else:
            closers = None
            agent = service.create(session_id=args.session or new_session_id(), cwd=cwd)
        reason = await _interruptible_turn(agent, prompt, interrupts)
        result = await _finish(args, host, agent, reason, transcript)
        if closers is not None:
            result["closers"] = closers
        await agent.aclose()
        return result

    code = _report(args, run_with_host(located, body, interrupts=interrupts))
    return interrupts.exit_code if interrupts.exit_code is not None else code


def _check_new_flag(args: argparse.Namespace, *, stored: bool) -> None:
    """``--session ID`` continues a stored session; only ``--new`` starts one with that id."""
    if args.new and args.session is None:
        raise CliUsageError("--new needs --session ID (the id of the session to start)")
    if args.session is None:
        return
    if stored and args.new:
        raise CliUsageError(
            f"--session {args.session} --new: a session with this id is already stored; drop "
            "--new to continue it"
        )
    if not stored and not args.new:
        raise CliUsageError(
            f"--session {args.session}: no stored session has this id (see `dsh sessions "
            "list`); pass --new to start a new session with it"
        )


def _install_answerer(host: PluginHost, interrupts: Interrupts) -> None:
    install_terminal_answerer(host.ctx, on_interrupt=lambda: interrupts.deliver(signal.SIGINT))


async def _interruptible_turn(agent: Agent, prompt: str, interrupts: Interrupts) -> Any:
    """One turn that the first SIGINT / SIGTERM / SIGHUP cancels cooperatively (D18)."""
    interrupts.target(agent.cancel)
    try:
        return await agent.run_turn(prompt)
    finally:
        interrupts.target(None)


def repair_rows(agent: Agent) -> list[dict[str, Any]]:
    """The closers the resume appended (``agent.repairs``), one summary row each."""
    closers = []
    for event in agent.repairs:
        data = to_builtins(event.data)
        entry: dict[str, Any] = {"type": event.type, "seq": event.seq}
        if event.type == "tool/result":
            error = data.get("error") or {}
            entry["callId"] = data.get("message", {}).get("source", {}).get("callId")
            entry["code"] = error.get("code")
        closers.append(entry)
    return closers


def print_closers(transcript: Transcript, closers: list[dict[str, Any]]) -> None:
    if not closers:
        transcript._print("session is balanced; nothing to repair", "dim")
        return
    for closer in closers:
        if closer["type"] == "tool/result":
            label = {
                "TOOL_NOT_STARTED": "NOT_STARTED",
                "TOOL_OUTCOME_UNKNOWN": "OUTCOME_UNKNOWN",
            }.get(closer.get("code") or "", closer.get("code") or "?")
            transcript._print(f"repair: {closer['callId']} {label}", "yellow")
        else:
            transcript._print(f"repair: {closer['type']}", "yellow")


def run_resume(args: argparse.Namespace) -> int:
    workspace = args.workspace
    recorded = workspace is None
    if recorded:
        workspace = recorded_workspace(args, args.session_id)
        if args.prompt is None and workspace is not None and not os.path.isdir(workspace):
            workspace = None  # a repair runs no tool: a workspace gone since is no obstacle
    located, _cwd = compose(args, workspace=workspace, demo_workspace=False, recorded=recorded)
    transcript = Transcript(quiet=args.json)
    interrupts = Interrupts()

    async def body(host: PluginHost) -> dict[str, Any]:
        transcript.install(host)
        _install_answerer(host, interrupts)
        agent = await host.ctx.agent.resume(args.session_id)  # SessionNotFoundError: exit 2
        closers = repair_rows(agent)  # what this resume appended, not a second read's guess
        print_closers(transcript, closers)
        reason = None
        if args.prompt is not None:
            reason = await _interruptible_turn(agent, args.prompt, interrupts)
        result = await _finish(args, host, agent, reason, transcript)
        result["closers"] = closers
        await agent.aclose()
        return result

    code = _report(args, run_with_host(located, body, interrupts=interrupts))
    return interrupts.exit_code if interrupts.exit_code is not None else code
