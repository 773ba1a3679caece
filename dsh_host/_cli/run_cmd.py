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
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from .._agent import AGENT, AGENT_CHUNK, Agent, ChunkReceived
from .._composition_edits import term_rows, term_value
from .._front.demo import DEMO_PROMPT, DEMO_WORKSPACE
from .._front.models import ModelChoice
from .._front.models import parse_model as parse_model_spec
from .._front.runner import (
    Overrides,
    Plan,
    TermsRefused,
    configured_route,
    plan_continuation,
    portable_spec,
    terms_of,
    with_model,
)
from .._llm.attachments import attachment_blocks
from .._loader import LocatedRow, PluginHost, rows_needed_for
from .._persistence.keys import SESSION_PERSISTENCE
from .._persistence.persistence import SessionLoad, SessionNotFoundError
from .._session.events import SessionEvent, to_builtins, turn_end_kind
from .._session.events.data import RunTerms
from .._session.header import SessionHeader, new_session_id
from .._session.keys import SESSION_EVENT, SESSIONS, TOKEN_METER
from .._session.messages import (
    BlockEndChunk,
    ContentBlock,
    ReasoningBlock,
    ReasoningDeltaChunk,
    TextBlock,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    UserSource,
)
from .._session.repair import TOOL_OUTCOME_UNKNOWN
from .._session.terms import record_terms, recorded_terms
from .._session.tokens import TokenMeter, UsageTotals
from .._tools import TOOLS_PROGRESS, ToolProgress
from .._tools.keys import APPROVAL
from ..errors import ConfigError
from .answerer import install_terminal_answerer
from .approvals_cmd import EXIT_AWAITING, apply_approval_flag, print_pending, tree_pending
from .common import (
    CliUsageError,
    load_composition,
    load_composition_terms,
    patch_term_flag,
    persistence_rows,
    run_with_host,
)
from .hints import command_hint
from .interrupts import Interrupts
from .output import (
    StatusLine,
    console,
    decouple_stdout,
    settle_stdout,
    status_line,
    stdout_writer,
)
from .render import (
    MarkdownAnswer,
    approval_lines,
    blocks_text,
    continued,
    gutter_stream,
    retry_summary,
    short_id,
    terminal_safe,
    tool_result_lines,
    turn_end_line,
)
from .usage import usage_summary


def parse_model(spec: str) -> ModelChoice:
    try:
        return parse_model_spec(spec)
    except ConfigError as exc:
        raise CliUsageError(str(exc)) from None


def note(text: str) -> None:
    """One ``dsh: note:`` line on stderr (stdout may carry ``--json``)."""
    print(f"dsh: note: {terminal_safe(text)}", file=sys.stderr)


def compose(
    args: argparse.Namespace,
    *,
    workspace: str | None,
    demo_workspace: bool,
    by: str = "dsh run",
) -> tuple[list[LocatedRow], str, RunTerms]:
    """The composition of a new session with the command line's flags, its workspace, and the
    terms it is created under (recorded as its first ``run/terms`` event).

    The built-in demo script is the model only when ``demo_workspace`` (``dsh run`` on a new
    session) and neither ``--model`` nor the composition names one; it says so on stderr.
    """
    _, located, identity = load_composition_terms(args)
    spec: str | None = args.model
    if spec is None and configured_route(located) is None:
        if not demo_workspace:
            raise CliUsageError(
                "no model: the composition names none; pass --model SPEC (the built-in demo "
                "script runs only for `dsh run` on a new session)"
            )
        spec = "demo"
    if spec is not None:
        located = with_model(located, parse_model(spec), f"--model {spec}")
    demo = workspace is None and demo_workspace and spec == "demo"
    if demo:
        workspace = DEMO_WORKSPACE
    if workspace is not None:
        _prepare_workspace(
            workspace, create=demo or getattr(args, "create_workspace", False)
        )
        patch_term_flag(located, "workspace", workspace, "--workspace")
    if getattr(args, "approval", None) is not None:
        apply_approval_flag(located, args.approval)
    if getattr(args, "sandbox", None) is not None:
        patch_term_flag(located, "sandbox", args.sandbox, "--sandbox")
    cwd = _tools_workspace(located)
    own_row = spec is not None and parse_model(spec).row.id is not None
    terms = terms_of(
        located, composition=identity, spec=portable_spec(spec) if own_row and spec else None,
        by=by,
    )
    return located, cwd, terms


def _tools_workspace(located: list[LocatedRow]) -> str:
    """The directory the tools work in (recorded as the session's ``cwd``): the workspace term
    of the rows that take it, made absolute, else the current directory."""
    if term_rows(located, "workspace"):
        configured = term_value(located, "workspace", ".")
        if isinstance(configured, str) and configured:
            return os.path.abspath(os.path.expanduser(configured))
    return os.getcwd()


def stored_session(args: argparse.Namespace, session_id: str) -> SessionLoad | None:
    """What the stored session ``session_id`` holds (None: not stored), read from the
    composition's store before the full composition boots (its tools need the workspace)."""
    rows = persistence_rows(load_composition(args)[1])

    async def body(host: PluginHost) -> SessionLoad | None:
        store = host.ctx.get(SESSION_PERSISTENCE)
        if store is None:
            return None
        try:
            load: SessionLoad = await store.inspect(session_id)
        except SessionNotFoundError:
            return None
        return load

    return run_with_host(rows, body)


def stored_header(args: argparse.Namespace, session_id: str) -> SessionHeader | None:
    """The header of the stored session ``session_id`` (None: not stored)."""
    load = stored_session(args, session_id)
    return load.header if load is not None else None


def recorded_workspace(args: argparse.Namespace, session_id: str) -> str | None:
    """The workspace ``session_id`` recorded (its terms', else its header's ``cwd``), or None."""
    load = stored_session(args, session_id)
    if load is None:
        return None
    terms = recorded_terms(load.events)
    if terms is not None and terms.workspace is not None:
        return terms.workspace
    return load.header.cwd if isinstance(load.header.cwd, str) else None


#: What a repair boots: the agent and its store, and every row whose plugin declares
#: ``boots_for_repair`` (the approval row, whose events are evidence; rows that follow every
#: append, such as a trace exporter, which a repair's closers must reach; sub-agents, which
#: refine a delegating call's closer from its child's log, D24).
REPAIR_SERVICES: tuple[str, ...] = ("agent", "sessionPersistence")


def continue_session(
    args: argparse.Namespace,
    load: SessionLoad,
    *,
    by: str,
    runs_turn: bool = True,
    legacy_approval: str | None = None,
    needs_tools: bool = False,
    compare_only: bool = False,
) -> tuple[list[LocatedRow], Plan]:
    """The composition a stored session continues under: its recorded terms, with this
    command's explicit flags as logged overrides (:func:`~dsh_host._front.runner.plan_continuation`
    decides; a refusal is one ``dsh: error:`` line and nothing is written). ``legacy_approval``
    is the approval flag a session without recorded terms is assumed to run under.
    ``needs_tools``: boot the tools even when no turn runs (a decision binds the tool's
    definition as registered here). ``compare_only`` (the harness replay, D32): nothing runs or
    is recorded, so the composition loaded here is taken as if it were named (it is what the log
    is compared with) and no note about terms is printed."""
    _, located, identity = load_composition_terms(args)
    approval = getattr(args, "approval", None)
    recorded = recorded_terms(load.events)
    if approval is None and recorded is None:
        approval = legacy_approval
    model = args.model
    workspace = getattr(args, "workspace", None)
    overrides = Overrides(
        model=parse_model(model) if model is not None else None,
        model_spec=model,
        workspace=os.path.abspath(os.path.expanduser(workspace)) if workspace else None,
        sandbox=getattr(args, "sandbox", None),
        approval_policy="ask" if approval == "defer" else approval,
        unanswered="defer" if approval == "defer" else None,
        composition_named=compare_only or getattr(args, "config", None) is not None,
    )
    try:
        plan = plan_continuation(
            located, session_id=load.id, recorded=recorded, composition=identity,
            overrides=overrides, by=by, runs_turn=runs_turn,
            repair_only=not runs_turn and not needs_tools,
            cwd=load.header.cwd if isinstance(load.header.cwd, str) else None,
        )
    except TermsRefused as exc:
        raise CliUsageError(str(exc)) from None
    rows = plan.rows
    if not runs_turn and not needs_tools:
        # A repair runs no tool: it needs the store and the agent, not the workspace (which
        # may be gone, or hold the store: `Agent(store=...)` inside its workspace), and the
        # rows that follow the log (a trace exporter), which its closers must reach.
        return rows_needed_for(rows, REPAIR_SERVICES, repair=True), plan
    if plan.terms.workspace is not None and term_rows(rows, "workspace"):
        flag = "--workspace" if workspace else "the session's recorded workspace"
        _prepare_workspace(
            plan.terms.workspace, create=getattr(args, "create_workspace", False), flag=flag
        )
    for text in () if compare_only else plan.notes:
        note(text)
    return rows, plan


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


# -- live transcript ---------------------------------------------------------------------


#: A live line is cut to its last this many characters (a tool printing no newline).
_LIVE_LINE_CHARS: Final = 1000


@dataclass
class Transcript:
    """Prints a run as it happens; silent under --json (stdout carries one object).

    On a terminal the model's text is gathered while it streams and printed at the end of
    its block as rendered markdown (:class:`~dsh_host._cli.render.MarkdownAnswer`, behind the
    gutter), and the :func:`~dsh_host._cli.output.status_line` says what runs meanwhile
    ("model thinking…", "model writing…", "bash: <description>"). Into a pipe the text
    streams raw as it arrives and no status line exists.

    The model's reasoning is shown as it streams, never kept from the turn nor changing it
    (the same observers): on a terminal its latest words in the status line; once the model
    moves on (text, a tool call, the end of the answer) one dim line, by ``reasoning``:
    ``summary`` (default) its first line and length, ``full`` all of it, ``off`` nothing.
    """

    quiet: bool
    #: Print the person's prompt as ``you: ...`` (not in the chat, where they just typed it).
    echo_prompt: bool = True
    #: how the model's reasoning is shown once it is done: ``summary``, ``full`` or ``off``
    reasoning: Literal["summary", "full", "off"] = "summary"
    _mid_line: bool = False
    _approval: Any = None
    _answer: list[str] = field(default_factory=list)
    #: the running tools' live output: its last whole lines and the line still being written
    _live: deque[str] = field(default_factory=lambda: deque(maxlen=StatusLine.TAIL_ROWS))
    _live_partial: str = ""
    _thinking: list[str] = field(default_factory=list)

    @property
    def _rich(self) -> bool:
        return console().is_terminal

    def _print(self, text: str, style: str | None = None, *, multiline: bool = False) -> None:
        """Print one transcript line; control characters in it are shown escaped, never sent."""
        if self.quiet:
            return
        with status_line().clear():
            self._end_answer()
            console().print(terminal_safe(text, multiline=multiline), style=style, markup=False)

    def _end_reasoning(self) -> None:
        """Close the reasoning in progress: one dim line (or all of it), then nothing more."""
        if not self._thinking:
            return
        text, self._thinking = "".join(self._thinking).strip(), []
        if not text or self.reasoning == "off":
            return
        if self._mid_line:
            console().print()
            self._mid_line = False
        if self.reasoning == "full":
            shown = continued(terminal_safe(f"✻ thought: {text}", multiline=True))
        else:
            first = text.split("\n", 1)[0].strip()
            if len(first) > _THOUGHT_CHARS:
                first = first[: _THOUGHT_CHARS - 1].rstrip() + "…"
            elif first != text:
                first += " …"
            shown = terminal_safe(
                f"✻ thought: {first} ({len(text.split())} words)", multiline=False
            )
        console().print(shown, style="dim", markup=False, highlight=False)

    def _end_answer(self) -> None:
        """Close the model text in progress: the rendered answer, or the raw stream's line."""
        self._end_reasoning()
        if self._answer:
            text, self._answer = "".join(self._answer), []
            console().print(MarkdownAnswer(text))
        if self._mid_line:
            console().print()
            self._mid_line = False

    def _status(self, label: str) -> None:
        if not self.quiet:
            status_line().show(terminal_safe(label, multiline=False))

    def install(self, host: PluginHost) -> None:
        # Observers only (`agent/chunk`, `session/event`): the bus contains a printer that
        # fails (a closed pipe), so printing can stop but never cut the turn; and from a
        # turn's start to finish() printing only queues (a slow reader never holds it up).
        host.ctx.on(AGENT_CHUNK, self._on_chunk)
        host.ctx.on(SESSION_EVENT, self._on_event)
        host.ctx.on(TOOLS_PROGRESS, self._on_progress)
        self._approval = host.ctx.get(APPROVAL)
        if _ACTIVITY.isEnabledFor(logging.INFO):  # `dsh -v`: every event as it is appended
            host.ctx.on(SESSION_EVENT, _log_event)

    def finish(self) -> None:
        """The run is over (its log flushed): the answer in progress is printed, the status
        line is gone, and everything queued is written out, waiting for the reader."""
        if not self.quiet:
            with status_line().clear():
                self._end_answer()
            status_line().hide()
        settle_stdout()

    def _on_chunk(self, received: ChunkReceived) -> None:
        # Only the agent loop's steps emit `agent/chunk`: a maintenance request (a compaction
        # summary, ...) is not the assistant speaking and is not printed live.
        if self.quiet:
            return
        chunk = received.chunk
        if self._thinking and not isinstance(chunk, ReasoningDeltaChunk):
            if not isinstance(chunk, BlockEndChunk) or isinstance(chunk.block, ReasoningBlock):
                with status_line().clear():
                    self._end_reasoning()
        if isinstance(chunk, TextDeltaChunk) and chunk.text:
            if self._rich:
                self._answer.append(chunk.text)
                self._status("model writing…")
                return
            text = terminal_safe(chunk.text)
            text = gutter_stream(text, at_line_start=not self._mid_line)
            console().print(text, end="", markup=False, highlight=False)
            self._mid_line = not chunk.text.endswith("\n")
        elif isinstance(chunk, ReasoningDeltaChunk):
            self._thinking.append(chunk.text)
            tail = " ".join("".join(self._thinking[-40:]).split())[-_THOUGHT_TAIL:]
            self._status(f"thinking: {tail}" if tail else "model reasoning…")
        elif isinstance(chunk, ToolCallDeltaChunk):
            self._status("model writing a tool call…")
        elif isinstance(chunk, BlockEndChunk) and isinstance(chunk.block, TextBlock):
            if self._answer or self._mid_line:
                with status_line().clear():
                    self._end_answer()
                self._status("model thinking…")

    def _on_progress(self, progress: ToolProgress) -> None:
        """A running tool's output, live: its last lines above the status line (a terminal
        only; into a pipe the result is printed once, as the log has it)."""
        if self.quiet or not self._rich:
            return
        *done, partial = (self._live_partial + progress.text).split("\n")
        self._live.extend(done)
        self._live_partial = partial[-_LIVE_LINE_CHARS:]
        shown = [*self._live, self._live_partial] if self._live_partial else [*self._live]
        # A carriage return rewrites its line (a progress bar): the part after the last one.
        status_line().show_tail(
            [terminal_safe(line.rsplit("\r", 1)[-1], multiline=False) for line in shown]
        )

    def _end_live(self) -> None:
        self._live.clear()
        self._live_partial = ""
        status_line().show_tail(())

    def _on_event(self, session: Any, event: SessionEvent) -> None:
        # Called for every append: do nothing (not even a conversion) unless it is shown.
        kind = event.type
        if self.quiet or kind not in _SHOWN_EVENTS:
            return
        if kind == "user/message":
            message = event.data  # a user/message's data is the message itself
            # The person's prompt, not plugin notices or context.
            if isinstance(message.source, UserSource) and self.echo_prompt:
                said = continued(terminal_safe(f"you: {blocks_text(message.content)}"))
                self._print(said, "bold", multiline=True)
            return
        if kind == "step/start":
            self._status("model thinking…")
            return
        if kind == "turn/start":  # until finish(), after the turn's log is flushed
            decouple_stdout()
            return
        if kind == "tool/result":
            self._end_live()
            for style, text in tool_result_lines(event.data):
                self._print(text, style)
            self._status("model thinking…")
            return
        data = to_builtins(event.data)
        if kind == "tool/call":
            name, arguments = data.get("name"), data.get("arguments", "")
            self._print(f"⚙ {name} [{short_id(data.get('callId'))}] {arguments}", "cyan")
            self._status(f"{name}: {_described(arguments) or 'running'}")
        elif kind in ("approval/asked", "approval/decided"):
            [(style, text)] = approval_lines(kind, data)
            if kind == "approval/decided":
                text += self._decided_by(session, data)
            self._print(text, style)
        elif kind == "llm/retry":
            self._print(f"↻ {retry_summary(data)}", "yellow")
        elif kind == "turn/end":
            self._end_live()
            style, text = turn_end_line(data)
            with stdout_writer().kept():  # how the turn ended is never dropped
                self._print(text, style)
            status_line().hide()

    def _decided_by(self, session: Any, data: dict[str, Any]) -> str:
        """Who rejected: under policy ``never`` nobody was asked, the policy refused."""
        policy = getattr(self._approval, "effective_policy", None)
        if data.get("outcome") != "rejected" or policy is None or policy(session) != "never":
            return ""
        return " by the approval policy never (no one was asked)"


def _described(arguments: Any) -> str:
    """A call's ``description`` argument (``bash`` asks for one), else ""."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return ""
    found = parsed.get("description") if isinstance(parsed, dict) else None
    return found if isinstance(found, str) else ""


#: the first line of a reasoning summary is cut to this many characters
_THOUGHT_CHARS = 100
#: the status line shows the reasoning's last this-many characters while it streams
_THOUGHT_TAIL = 60

_ACTIVITY = logging.getLogger("dsh.session")


def _log_event(session: Any, event: SessionEvent) -> None:
    _ACTIVITY.info("%s #%d %s", session.id, event.seq, event.type)


_SHOWN_EVENTS = frozenset(
    {
        "user/message",
        "step/start",
        "turn/start",
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
    await host.ctx.service(SESSIONS).flush(agent.session)
    transcript.finish()
    kind = turn_end_kind(reason) if reason is not None else None
    store = host.ctx.get(SESSION_PERSISTENCE)
    where = store.locate(agent.session.header).path if store is not None else None
    turn = agent.last_turn if reason is not None else None
    return {
        "sessionId": agent.session.id,
        "turnEnd": _turn_end(kind, reason),
        "events": len(agent.session.events),
        "where": where,
        "pendingApprovals": await tree_pending(host, agent.session.events, agent.session.id),
        "usage": _usage(host, agent, turn),
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


def _usage(host: PluginHost, agent: Agent, turn: int | None) -> dict[str, Any]:
    """Usage and cost of every billed call: this turn's (None without a turn) and the session's,
    priced by the composed token meter (its ``prices:``), else by the catalogue alone."""
    meter = host.ctx.get(TOKEN_METER)
    if not isinstance(meter, TokenMeter):
        meter = TokenMeter()
    session = agent.session
    turn_totals = meter.turn_usage(session).get(turn, UsageTotals()) if turn is not None else None
    return {
        "turn": usage_summary(turn_totals) if turn_totals is not None else None,
        "total": usage_summary(meter.usage(session)),
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
        if "reconciled" in result:
            payload["reconciled"] = result["reconciled"]
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


def _continue_or_start(
    args: argparse.Namespace,
) -> tuple[list[LocatedRow], str, RunTerms | Plan]:
    """Compose ``dsh run``: a new session's rows and terms, or (``--session ID`` of a stored
    session) the plan it continues under."""
    load = stored_session(args, args.session) if args.session else None
    _check_new_flag(args, stored=load is not None)
    if load is not None:
        located, plan = continue_session(args, load, by="dsh run --session")
        return located, plan.terms.workspace or os.getcwd(), plan
    located, cwd, terms = compose(args, workspace=args.workspace, demo_workspace=True)
    return located, cwd, terms


def run_run(args: argparse.Namespace) -> int:
    if args.attach and args.prompt is None:
        raise CliUsageError("--attach needs a PROMPT to send the files with")
    attachments = attachment_blocks(args.attach or ())  # a bad file fails before anything
    located, cwd, terms = _continue_or_start(args)
    text: str | None = args.prompt
    if text is None:
        if not (isinstance(terms, RunTerms) and _is_demo(terms)):
            raise CliUsageError("PROMPT is required unless the model is the built-in demo")
        text = DEMO_PROMPT
    prompt: str | list[ContentBlock] = (
        [TextBlock(text=text), *attachments] if attachments else text
    )
    transcript = Transcript(quiet=args.json, reasoning=args.reasoning)
    interrupts = Interrupts()

    async def body(host: PluginHost) -> dict[str, Any]:
        transcript.install(host)
        _install_answerer(host, interrupts)
        service = host.ctx.service(AGENT)
        if isinstance(terms, Plan):
            # Ownership first: a second writer is refused (exit 3) before any repair is shown.
            agent = await service.resume(args.session)
            closers: list[dict[str, Any]] | None = repair_rows(agent)
            print_closers(transcript, closers or [])
            print_reconciled(transcript, reconciled_rows(agent))
            adopt(agent, terms)
        else:
            closers = None
            agent = service.create(session_id=args.session or new_session_id(), cwd=cwd)
            record_terms(agent.session, terms)
            if _is_demo(terms) and args.model is None:  # the demo says so, once it runs
                transcript._print(DEMO_NOTICE, "dim")
        reason = await _interruptible_turn(agent, prompt, interrupts)
        result = await _finish(args, host, agent, reason, transcript)
        if closers is not None:
            result["closers"] = closers
        await agent.aclose()
        return result

    code = _report(args, run_with_host(located, body, interrupts=interrupts))
    return interrupts.exit_code if interrupts.exit_code is not None else code


DEMO_NOTICE = (
    "no model is configured: this is the built-in demo script (pass --model SPEC, or use a "
    "composition with a model row, for a real model)"
)


def _is_demo(terms: RunTerms) -> bool:
    return terms.model is not None and terms.model.spec == "demo"


def adopt(agent: Agent, plan: Plan) -> None:
    """Before anything runs: log the terms this command changed (or assumed)."""
    if plan.record is not None:
        record_terms(agent.session, plan.record)


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


async def _interruptible_turn(
    agent: Agent, prompt: str | list[ContentBlock], interrupts: Interrupts
) -> Any:
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


def reconciled_rows(agent: Agent) -> list[dict[str, Any]]:
    """What the resume's reconcilers found (``agent.reconciled``, D26), one row each."""
    return [
        {"callId": r.call_id, "tool": r.tool, "verdict": r.verdict, "detail": r.detail}
        for r in agent.reconciled
    ]


def print_reconciled(transcript: Transcript, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        detail = f" ({row['detail']})" if row["detail"] else ""
        transcript._print(
            f"reconciled: {row['callId']} {row['tool']} {row['verdict']}{detail}",
            "yellow" if row["verdict"] == "unknown" else "dim",
        )


def print_closers(transcript: Transcript, closers: list[dict[str, Any]]) -> None:
    if not closers:
        transcript._print("session is balanced; nothing to repair", "dim")
        return
    for closer in closers:
        if closer["type"] == "tool/result":
            label = {
                "TOOL_NOT_STARTED": "NOT_STARTED",
                "TOOL_OUTCOME_UNKNOWN": "OUTCOME_UNKNOWN",
            }.get(closer.get("code") or "", closer.get("code") or "ANSWERED")  # D24: refined
            transcript._print(f"repair: {closer['callId']} {label}", "yellow")
        else:
            transcript._print(f"repair: {closer['type']}", "yellow")


def _may_reconcile(load: SessionLoad) -> bool:
    """A repair-only resume boots the whole composition (its tools, whose reconcilers may know
    what happened, D26) when the repair leaves a call outcome-unknown and the session's recorded
    workspace is still there; otherwise only the store and the agent, as before."""
    unknown = any(
        c.type == "tool/result" and getattr(getattr(c.data, "error", None), "code", None)
        == TOOL_OUTCOME_UNKNOWN
        for c in load.closers  # ``inspect`` computed them: not another walk of the log (D37)
    )
    if not unknown:
        return False
    terms = recorded_terms(load.events)
    workspace = terms.workspace if terms is not None else None
    if workspace is None and isinstance(load.header.cwd, str):
        workspace = load.header.cwd
    return workspace is not None and os.path.isdir(workspace)


def run_resume(args: argparse.Namespace) -> int:
    load = stored_session(args, args.session_id)
    if load is None:
        raise SessionNotFoundError(f'session "{args.session_id}" not found')
    located, plan = continue_session(
        args, load, by="dsh resume", runs_turn=args.prompt is not None,
        needs_tools=_may_reconcile(load),
    )  # fmt: skip
    transcript = Transcript(quiet=args.json)
    interrupts = Interrupts()

    async def body(host: PluginHost) -> dict[str, Any]:
        transcript.install(host)
        _install_answerer(host, interrupts)
        # SessionNotFoundError: exit 2
        agent = await host.ctx.service(AGENT).resume(args.session_id)
        closers = repair_rows(agent)  # what this resume appended, not a second read's guess
        print_closers(transcript, closers)
        reconciled = reconciled_rows(agent)
        print_reconciled(transcript, reconciled)
        reason = None
        if args.prompt is not None:
            adopt(agent, plan)
            reason = await _interruptible_turn(agent, args.prompt, interrupts)
        result = await _finish(args, host, agent, reason, transcript)
        result["closers"] = closers
        if reconciled:
            result["reconciled"] = reconciled
        await agent.aclose()
        return result

    code = _report(args, run_with_host(located, body, interrupts=interrupts))
    return interrupts.exit_code if interrupts.exit_code is not None else code
