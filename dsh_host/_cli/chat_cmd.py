"""``dsh chat`` (and ``dsh`` alone on a terminal): a multi-turn session at a prompt.

One prompt line with history (prompt_toolkit; the history file is
``$XDG_DATA_HOME/dsh/chat-history``), then each turn's live transcript as
``dsh run`` prints it, approvals asked inline (``allow once? [y/N]``).

- **Ctrl-C during a turn** cancels that turn cooperatively, as in ``dsh run``
  (:mod:`.interrupts`): its running tool is asked to stop, its unanswered calls
  are closed in the log, the turn ends ``aborted``, and the prompt comes back.
  A second Ctrl-C within the grace period still exits at once.
- **Ctrl-C at the prompt** clears the line; **Ctrl-D** (on an empty line) exits.
- Slash commands: ``/help``, ``/new``, ``/sessions``, ``/resume ID``,
  ``/usage``, ``/compact``, ``/exit``.

The session is created with the first prompt (``/resume`` first leaves no
empty session behind). The tools' workspace is fixed when the composition
boots, so ``/resume`` of a session recorded in another workspace reboots the
composition there (a ``--workspace`` given on the command line wins).
"""

from __future__ import annotations

import argparse
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .._agent import AGENT, Agent
from .._cancel import CancelToken
from .._front.runner import Plan
from .._loader import LocatedRow, PluginHost
from .._persistence.persistence import SessionNotFoundError
from .._session.compaction import (
    MANUAL_COMPACTION_TEXTS,
    CompactionEngine,
    ManualCompactionError,
    compacted_text,
)
from .._session.events.data import RunTerms
from .._session.header import new_session_id
from .._session.keys import COMPACTION, SESSIONS, TOKEN_METER
from .._session.messages import UserSource
from .._session.prices import PriceTable
from .._session.terms import record_terms
from .._session.tokens import TokenMeter
from .._userdirs import data_home
from ..errors import DshError
from .answerer import install_terminal_answerer, is_interactive
from .common import CliUsageError, persistence, run_with_host
from .flags import add_config_flag, add_root_flag
from .interrupts import Interrupts
from .list_cache import ListCache
from .output import console
from .render import terminal_safe, transcript_lines, usage_lines, when
from .run_args import add_tool_flags, model_flag
from .run_cmd import (
    Transcript,
    adopt,
    compose,
    continue_session,
    print_closers,
    repair_rows,
    stored_session,
)
from .sessions_cmd import listing_summary

PROMPT: Final = "dsh> "
#: Shown by ``/compact`` when no row provides the ``compaction`` service.
NO_COMPACTION: Final = (
    "no compaction plugin is loaded; add compaction-basic to the composition"
)
HELP: Final = """\
commands:
  /help         this list
  /new          start a new session with the next prompt
  /sessions     the stored sessions, newest first
  /resume ID    continue a stored session (repaired first if a crash interrupted it)
  /usage        token usage of this session
  /compact      summarise older history now (needs a compaction plugin)
  /exit         leave (or Ctrl-D)
keys: Ctrl-C cancels the running turn (at the prompt: clears the line), Ctrl-D exits"""


def add_parser(sub: Any) -> None:
    chat = sub.add_parser(
        "chat",
        help="interactive multi-turn session (also `dsh` alone on a terminal)",
        description="A prompt for many turns on one session: history, the live transcript, "
        "approvals asked inline; Ctrl-C cancels the running turn, Ctrl-D exits. "
        "Type /help at the prompt for the commands.",
    )
    add_config_flag(chat)
    add_root_flag(chat)
    chat.add_argument("--session", metavar="ID", help="start by resuming this stored session")
    model_flag(chat)
    add_tool_flags(chat, approvals=("ask", "never"))
    chat.set_defaults(handler=run_chat)


def history_file() -> Path:
    """Where the prompt history is kept: ``$XDG_DATA_HOME/dsh/chat-history``."""
    return data_home() / "dsh" / "chat-history"


@dataclass
class _Switch:
    """Leave this composition and resume ``session_id`` under its own terms (``current``: the
    session this chat was on, to come back to if that is refused)."""

    session_id: str
    current: str | None


def private_history() -> Path:
    """The history file, readable by its owner only: it holds every prompt typed, which is as
    private as the session logs (kept 0700). Made 0600 before prompt_toolkit appends to it, and
    an older file is narrowed to 0600; a symlink in its place is refused, not followed."""
    path = history_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise CliUsageError(f"cannot open the chat history {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def on_a_terminal() -> bool:
    """stdin and stdout are both a terminal (where ``dsh`` alone opens the chat)."""
    return is_interactive(0) and is_interactive(1)


def run_chat(args: argparse.Namespace) -> int:
    if not on_a_terminal():
        raise CliUsageError(
            "dsh chat needs a terminal on stdin and stdout; for one turn without one use "
            '`dsh run "PROMPT"`'
        )
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    prompt: PromptSession[str] = PromptSession(history=FileHistory(str(private_history())))
    resume_id: str | None = args.session
    fallback: str | None = None
    while True:
        try:
            located, cwd, start = _compose_chat(args, resume_id)
        except DshError as exc:
            if resume_id is None or resume_id == args.session:
                raise
            # A /resume this chat cannot honour: say why, and go back to where it was.
            console().print(f"dsh: error: {terminal_safe(str(exc))}", style="red", markup=False)
            resume_id, fallback = fallback, None
            continue
        if resume_id is not None and resume_id != args.session:
            console().print(
                f"(session {resume_id} works in {cwd}; restarting the tools there)",
                style="dim", markup=False,
            )
        chat = _Chat(args, prompt, cwd, resume_id, start)
        outcome = run_with_host(
            located,
            chat.run,
            interrupts=chat.interrupts,
            backend="asyncio",  # prompt_toolkit runs on asyncio; the host runs on both
        )
        if outcome is None:
            return 0
        fallback, resume_id = outcome.current, outcome.session_id


def _compose_chat(
    args: argparse.Namespace, resume_id: str | None
) -> tuple[list[LocatedRow], str, RunTerms | Plan]:
    """A new chat's rows and terms, or the plan of the stored session it resumes: a session
    continues under its recorded terms (this command's flags are logged overrides)."""
    if resume_id is None:
        located, cwd, terms = compose(
            args, workspace=args.workspace, demo_workspace=False, by="dsh chat"
        )
        return located, cwd, terms
    load = stored_session(args, resume_id)
    if load is None:
        raise SessionNotFoundError(f'no stored session "{resume_id}" (see /sessions)')
    located, plan = continue_session(args, load, by="dsh chat /resume")
    return located, plan.terms.workspace or os.getcwd(), plan


#: Turns of a resumed session shown as its recap.
RECAP_TURNS: Final = 2
#: Sessions `/sessions` lists.
SESSIONS_SHOWN: Final = 20


class _Chat:
    """One composition's share of a chat: the prompt loop on a booted host."""

    def __init__(
        self,
        args: argparse.Namespace,
        prompt: Any,
        cwd: str,
        resume_id: str | None,
        start: RunTerms | Plan,
    ) -> None:
        self.args = args
        self.resume_id = resume_id
        self.start = start
        self.prompt = prompt
        self.cwd = cwd
        self.interrupts = Interrupts()
        # The person's prompt is on the screen already (they typed it after `dsh>`).
        self.transcript = Transcript(quiet=False, echo_prompt=False)
        self.host: PluginHost | None = None
        self.agent: Agent | None = None

    def say(self, text: str, style: str | None = "dim") -> None:
        console().print(terminal_safe(text), style=style, markup=False)

    async def run(self, host: PluginHost) -> _Switch | None:
        self.host = host
        self.transcript.install(host)
        install_terminal_answerer(
            host.ctx, on_interrupt=lambda: self.interrupts.deliver(signal.SIGINT)
        )
        self.say(
            f"dsh chat · workspace {self.cwd} · model {self._model()} · /help for commands, "
            "Ctrl-D to exit"
        )
        try:
            if self.resume_id is not None:
                await self._resume(self.resume_id)
            while True:
                try:
                    line = await self.prompt.prompt_async(PROMPT, handle_sigint=False)
                except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line
                    continue
                except EOFError:  # Ctrl-D
                    return None
                line = line.strip()
                if not line:
                    continue
                if line.startswith("/"):
                    try:
                        switch = await self._command(line)
                    except _Exit:
                        return None
                    except DshError as exc:
                        self.say(f"dsh: error: {exc}", "red")
                        continue
                    if switch is not None:
                        return switch
                    continue
                await self._turn(line)
        finally:
            if self.agent is not None:
                await self.agent.aclose()

    def _model(self) -> str:
        terms = self.start.terms if isinstance(self.start, Plan) else self.start
        route = terms.model
        if route is None:
            return "(none)"
        return route.spec if isinstance(route.spec, str) else f"{route.provider}:{route.model}"

    async def _turn(self, text: str) -> None:
        assert self.host is not None
        if self.agent is None:
            if isinstance(self.start, Plan):  # the session it was booted for was left (/new)
                self.say("a new session needs a new chat (this one was started for a stored "
                         "session's terms): run `dsh chat`", "red")
                return
            agents = self.host.ctx.service(AGENT)
            self.agent = agents.create(session_id=new_session_id(), cwd=self.cwd)
            record_terms(self.agent.session, self.start)
            self.say(f"session {self.agent.id}")
        agent = self.agent
        self.interrupts.target(agent.cancel)
        try:
            await agent.run_turn(text)
        finally:
            self.interrupts.target(None)
            self.interrupts.reset()  # the cancelled turn has stopped: the next Ctrl-C is new
            self.transcript.finish()
        await self.host.ctx.service(SESSIONS).flush(agent.session)

    async def _command(self, line: str) -> _Switch | None:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/exit", "/quit"):
            raise _Exit()
        if name == "/help":
            self.say(HELP, None)
        elif name == "/new":
            await self._close()
            self.say("a new session starts with your next prompt")
        elif name == "/sessions":
            await self._sessions()
        elif name == "/resume":
            if not rest:
                self.say("usage: /resume ID (see /sessions)", "red")
                return None
            return await self._resume(rest)
        elif name == "/usage":
            self._usage()
        elif name == "/compact":
            await self._compact()
        else:
            self.say(f"unknown command {name}; /help lists them", "red")
        return None

    async def _close(self) -> None:
        if self.agent is not None:
            agent, self.agent = self.agent, None
            await agent.aclose()

    async def _resume(self, session_id: str) -> _Switch | None:
        assert self.host is not None
        if self.agent is not None and self.agent.id == session_id:
            self.say(f"session {session_id} is the current one")
            return None
        if session_id != self.resume_id:
            # Each session runs under its own recorded terms: boot a composition for them.
            current = self.agent.id if self.agent is not None else self.resume_id
            await self._close()
            return _Switch(session_id, current)
        await self._close()
        self.agent = await self.host.ctx.service(AGENT).resume(session_id)
        print_closers(self.transcript, repair_rows(self.agent))
        if isinstance(self.start, Plan):
            adopt(self.agent, self.start)
        self.say(f"session {session_id} · turn {self.agent.last_turn} so far")
        self._recap()
        return None

    def _recap(self) -> None:
        """The resumed session's last :data:`RECAP_TURNS` turns, as ``dsh sessions show``
        prints them (tool output clipped), so the person sees where the conversation stands."""
        assert self.agent is not None
        last = self.agent.last_turn
        if not last:
            return
        first = max(1, last - RECAP_TURNS + 1)
        if first > 1:
            self.say(f"recap: turns {first}-{last} (dsh sessions show {self.agent.id} has all)")
        # What was said and done; the system prompt and runtime-context snapshots are
        # left out (`dsh sessions show` prints them).
        events = [
            event for event in self.agent.session.events
            if event.type != "system/message"
            and not (event.type == "user/message" and not isinstance(event.data.source, UserSource))
        ]
        for turn in range(first, last + 1):
            for style, text in transcript_lines(events, turn=turn):
                console().print(text, style=style or None, markup=False)

    async def _sessions(self) -> None:
        assert self.host is not None
        store = persistence(self.host)
        listings = await store.list(unreadable=[])
        if not listings:
            self.say("no stored sessions", None)
            return
        # This project's sessions (started in this workspace) first, each group newest first.
        listings.sort(key=lambda s: s.header.created_at, reverse=True)
        listings.sort(key=lambda s: s.header.cwd != self.cwd)
        current = self.agent.id if self.agent is not None else None
        remembered = ListCache.load()
        meter = self.host.ctx.get(TOKEN_METER) if self.host is not None else None
        # the composition's prices, so the list cache keeps what `dsh sessions list` would
        prices = meter.prices if isinstance(meter, TokenMeter) else PriceTable()
        shown = listings[:SESSIONS_SHOWN]
        here = sum(1 for listing in shown if listing.header.cwd == self.cwd)
        for index, listing in enumerate(shown):
            if index == 0:
                self.say(f"this workspace ({self.cwd}):" if here else "no session of this "
                         f"workspace ({self.cwd}); others:")
            elif index == here:
                self.say("other workspaces:")
            header = listing.header
            try:
                title = (await listing_summary(store, listing, remembered, prices)).get("title")
            except Exception as exc:  # one unreadable log must not hide the others
                title = f"(unreadable: {exc})"
            mark = "*" if header.id == current else " "
            cwd = "" if header.cwd == self.cwd else f"  {header.cwd}"
            self.say(f"{mark} {header.id}  {when(header.created_at)}  {title or '-'}{cwd}", None)
        remembered.save()
        if len(listings) > SESSIONS_SHOWN:
            more = len(listings) - SESSIONS_SHOWN
            self.say(f"  ... {more} more (dsh sessions list shows all)")

    def _usage(self) -> None:
        assert self.host is not None
        if self.agent is None:
            self.say("no session yet: usage starts with the first prompt")
            return
        meter = self.host.ctx.get(TOKEN_METER)
        if not isinstance(meter, TokenMeter):
            meter = TokenMeter()  # no token-meter row: the same count, catalogue prices only
        session = self.agent.session
        for line in usage_lines(meter.usage(session), meter.pressure(session)):
            self.say(line, None)

    async def _compact(self) -> None:
        assert self.host is not None
        service = self.host.ctx.get(COMPACTION)
        if not isinstance(service, CompactionEngine):
            self.say(NO_COMPACTION, "yellow")
            return
        if self.agent is None:
            self.say("no session yet: nothing to compact")
            return
        token = CancelToken()
        self.interrupts.target(lambda cause: token.abort(cause))
        try:
            result = await service.compact_now(self.agent, token)
        except ManualCompactionError as error:
            self.say(MANUAL_COMPACTION_TEXTS.get(error.code, str(error)), "yellow")
            return
        finally:
            self.interrupts.target(None)
            self.interrupts.reset()
        self.say(compacted_text(result), None)


class _Exit(Exception):
    """``/exit``: leave the chat."""
