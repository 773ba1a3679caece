"""The ``agent`` service: create agents on new sessions, resume stored ones.

Embedding in three lines::

    agent = ctx.agent.create(provider="deepseek-official", model="deepseek-chat")
    reason = await agent.run_turn("list the files", signal=token)
    await agent.aclose()

Resume (D7: storage never repairs, the resumer does): the stored log is
opened **for write** through ``ctx.sessionPersistence`` (exclusive ownership:
another writer, in this process or another, is refused at once), the closers
an interrupted turn needs are computed with
:func:`~dsh_host._session.repair.interrupted_turn_closers`, appended through
that same write handle and **flushed**, so the repair is durable before the
next model request. Then the live session is rebuilt from the stored events
plus the closers and published; the persistence backend adopts the handle it
already opened. Turn numbers continue from the log. When a call repair would close
``TOOL_OUTCOME_UNKNOWN`` has a tool that declares ``reconcile``, the session is published with
its turn still open, the reconcilers run inside it (:mod:`dsh_host._agent.reconcile`, D26), and
the closers of what is left are appended and flushed together before the agent is returned.

A plugin that knows more about a call than the log alone says (a delegating call whose child
session holds its answer, D24 in docs/decisions.md) refines the closers with
:meth:`AgentService.repair_refiner`; the refined closers are checked here, the one place every
resume crosses, so a refiner can only replace a ``tool/result`` closer by another result for the
same call at the same seq, never add, drop or reorder one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from msgspec import UNSET

from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._persistence.persistence import SessionNotFoundError
from dsh_host._session.events import SessionEvent, ToolResultData
from dsh_host._session.keys import SESSIONS
from dsh_host._session.packed import packed_copy
from dsh_host._session.repair import interrupted_turn_closers
from dsh_host._session.session import Session
from dsh_host._tools import TOOLS_PRE_EXECUTE
from dsh_host._tools.keys import APPROVAL

from .budget import Budget
from .errors import ResumeError
from .ledger import LEDGER_CONTEXT, ledger_context, ledger_gate
from .loop import Agent, check_options
from .prompt import SystemPrompt
from .reconcile import reconcilable_calls, reconcile_calls
from .types import AgentOptions, AssembleContext

if TYPE_CHECKING:
    from dsh_host._context import Context

__all__ = ["AgentService", "RepairRefiner"]

#: ``refiner(session_id, events, closers) -> closers``: a resume's repair, refined (D24).
RepairRefiner: TypeAlias = Callable[
    [str, Sequence[SessionEvent], list[SessionEvent]], Awaitable[list[SessionEvent]]
]

RESUME_WITHOUT_PERSISTENCE = (
    "cannot resume: session persistence is not configured (load a dsh-session-persistence backend)"
)


class AgentService:
    """``ctx.agent``: the agents of this host and the system-prompt registry they share."""

    def __init__(self, ctx: Context, defaults: AgentOptions, system_prompt: SystemPrompt) -> None:
        self._ctx = ctx
        self._defaults = defaults
        self.system_prompt = system_prompt
        self._agents: dict[str, Agent] = {}
        self._refiners: list[RepairRefiner] = []
        system_prompt.variable("model", _model_variable)
        system_prompt.variable("cwd", _cwd_variable)
        # The approval service states its policy in the runtime context (order 115, DSH's
        # `approval:policy`); it is read at each assembly, so mounting or unmounting the
        # approval row later is reflected at the next step.
        system_prompt.context("approval:policy", 115, self._approval_policy)
        # A fork's effects ledger: told to the model, and no recorded effect runs twice (D27).
        system_prompt.context(LEDGER_CONTEXT, 116, ledger_context)
        ctx.on(TOOLS_PRE_EXECUTE, ledger_gate(ctx))

    def _approval_policy(self, context: AssembleContext) -> str:
        approval = self._ctx.get(APPROVAL)
        describe = getattr(approval, "policy_context", None)
        if approval is None or not callable(describe):
            return ""
        text = describe(context.agent)
        return text if isinstance(text, str) else ""

    # ------------------------------------------------------------------ repair
    def repair_refiner(
        self, refiner: RepairRefiner, *, owner: Context | None = None
    ) -> Callable[[], None]:
        """Let ``refiner`` refine the closers of every resume (D24); returns a disposer.

        The refiner may do its own durable work first (repair a child session it owns) and
        returns the closers to append: the same list, or one in which a ``tool/result``
        closer is replaced by another ``tool/result`` for the same call at the same seq.
        Anything else is refused by :meth:`resume` before a byte is written.
        """
        self._refiners.append(refiner)

        def remove() -> None:
            if refiner in self._refiners:
                self._refiners.remove(refiner)

        if owner is not None:
            owner.effect(remove, "agent repair refiner")
        return remove

    async def refine_closers(
        self, session_id: str, events: Sequence[SessionEvent], closers: list[SessionEvent]
    ) -> list[SessionEvent]:
        """``closers`` after every registered refiner, each result checked (D24)."""
        for refiner in list(self._refiners):
            refined = await refiner(session_id, events, list(closers))
            _check_refined(session_id, closers, refined)
            closers = list(refined)
        return closers

    async def repair_stored(self, session_id: str) -> Sequence[SessionEvent] | None:
        """Repair a stored session that no agent here continues (a sub-agent's child, D24):
        its interrupted turn's closers, refined, written and flushed; then announced like a
        resume's, so every ``session/event`` listener (a trace exporter) sees them
        (``SessionStore.announce``; the session is not made live). The events as stored
        before the repair; None when no such session is stored."""
        persistence = self._ctx.get(SESSION_PERSISTENCE)
        if persistence is None:
            return None
        try:
            handle = await persistence.open(session_id, "write")
        except SessionNotFoundError:
            return None
        try:
            load = await handle.read()
            closers = await self.refine_closers(
                session_id, load.events, interrupted_turn_closers(load.events)
            )
            if closers:
                handle.append(closers)
            await handle.flush()
        finally:
            await handle.close()
        store = self._ctx.get(SESSIONS)
        if closers and store is not None and store.get(session_id) is None:
            session = Session.restore(load.header, [*load.events, *closers])
            store.announce(session, session.events[len(load.events) :])
        return load.events

    # ------------------------------------------------------------------ creation
    def _options(self, overrides: dict[str, Any]) -> AgentOptions:
        chosen = {key: value for key, value in overrides.items() if value is not None}
        return check_options(dataclasses.replace(self._defaults, **chosen))

    def create(
        self,
        *,
        session: Session | None = None,
        session_id: str | None = None,
        cwd: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        max_parallel_tool_calls: int | None = None,
        max_steps_per_turn: int | None = None,
        budget: Budget | None = None,
    ) -> Agent:
        """A new agent, on ``session`` (live in ``ctx.sessions``) or on a new one.

        A new session gets ``session_id`` (default: minted by the store) and
        ``cwd`` (default: the process's working directory) in its header. The
        options default to the ``agent`` row's config. Invalid options raise
        before any session is created.
        """
        options = self._options(
            {
                "provider": provider,
                "model": model,
                "max_tokens": max_tokens,
                "reasoning_effort": reasoning_effort,
                "max_parallel_tool_calls": max_parallel_tool_calls,
                "max_steps_per_turn": max_steps_per_turn,
                "budget": budget,
            }
        )
        store = self._ctx.service(SESSIONS)
        owns = session is None
        if session is None:
            root = os.path.abspath(cwd if cwd is not None else os.getcwd())
            session = store.create(session_id, meta={"cwd": root})
        elif not store.is_live(session):
            raise ResumeError(
                f'session "{session.id}" is not live in this host\'s session store; create it '
                "with ctx.sessions.create() or resume it with ctx.agent.resume()"
            )
        return self._register(Agent(self._ctx, session, options, owns_session=owns))

    def detached(self, session: Session) -> Agent:
        """An agent on ``session`` that no store publishes and this service does not track,
        with the ``agent`` row's options: the harness replay (D32) opens requests on copies
        of a recorded log with it. Never run a turn on it."""
        return Agent(self._ctx, session, self._options({}), owns_session=False)

    async def resume(
        self,
        session_id: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        max_parallel_tool_calls: int | None = None,
        max_steps_per_turn: int | None = None,
        budget: Budget | None = None,
    ) -> Agent:
        """Reopen a stored session: repair an interrupted turn durably, then return its agent.

        Raises :class:`ResumeError` without a persistence backend or when the
        session is live in this process, and the backend's errors as they are
        (``SessionNotFoundError``, ``SessionAlreadyOwnedError`` when another
        writer holds it, corruption errors). Nothing is published on failure.
        """
        options = self._options(
            {
                "provider": provider,
                "model": model,
                "max_tokens": max_tokens,
                "reasoning_effort": reasoning_effort,
                "max_parallel_tool_calls": max_parallel_tool_calls,
                "max_steps_per_turn": max_steps_per_turn,
                "budget": budget,
            }
        )
        persistence = self._ctx.get(SESSION_PERSISTENCE)
        if persistence is None:
            raise ResumeError(RESUME_WITHOUT_PERSISTENCE)
        store = self._ctx.service(SESSIONS)
        if store.get(session_id) is not None:
            raise ResumeError(
                f'cannot resume session "{session_id}": it is live in this process; use the '
                "live session (or close its agent first)"
            )
        handle = await persistence.open(session_id, "write")
        try:
            load = await handle.read()
            # A refiner (D24) may answer a call from what it knows (a child session).
            closers = await self.refine_closers(
                session_id, load.events, interrupted_turn_closers(load.events)
            )
            pending = reconcilable_calls(self._ctx, load.events, closers)
            if pending:
                # The turn stays open while reconcilers look (D26): their verdicts and any
                # approval they need are recorded inside it, then the closers close the rest.
                session = Session.restore(
                    load.header, packed_copy(load.events), mark_seed_end=False
                )
                store.attach(session)
            else:
                if closers:
                    handle.append(closers)
                await handle.flush()  # the repair is durable before anything else happens
                log = packed_copy(load.events)  # docs/decisions.md D37
                for closer in closers:
                    log.append(closer)
                session = Session.restore(load.header, log)
                store.attach(session, appended=session.events[len(load.events) :])
        except BaseException:
            await handle.close()
            raise
        agent = Agent(self._ctx, session, options, owns_session=True)
        self._register(agent)
        if pending:
            try:
                agent.reconciled = tuple(await reconcile_calls(self._ctx, agent, pending))
                closers = await _close_turn(self, session)
                await store.flush(session)  # the verdicts and the repair, durable at once
            except BaseException:
                await agent.aclose()
                raise
        agent.repairs = tuple(closers)
        return agent

    def _register(self, agent: Agent) -> Agent:
        self._agents[agent.id] = agent
        return agent

    def forget(self, agent: Agent) -> None:
        """Stop tracking ``agent`` (its ``aclose`` calls this once it let go of its session).

        A closed agent is never returned again (``get``, ``list``), but it holds its session's
        whole log: kept, every session a long-lived host (``dsh serve``) ever ran would stay in
        memory for the host's life.
        """
        if self._agents.get(agent.id) is agent:
            del self._agents[agent.id]

    # ------------------------------------------------------------------ queries
    def get(self, agent_id: str) -> Agent | None:
        agent = self._agents.get(agent_id)
        return agent if agent is not None and not agent.closed else None

    def list(self) -> list[Agent]:
        return [agent for agent in self._agents.values() if not agent.closed]

    async def aclose(self) -> None:
        """Close every agent (running turns end ``aborted {disposed}``), newest first."""
        for agent in reversed(list(self._agents.values())):
            await agent.aclose()
        self._agents.clear()


def _result_call(event: SessionEvent) -> str | None:
    data = event.data
    return data.message.source.call_id if isinstance(data, ToolResultData) else None


def _check_refined(session_id: str, closers: Sequence[SessionEvent], refined: object) -> None:
    """Refuse a refinement that is not a position-preserving replacement of results."""
    where = f'repair of session "{session_id}"'
    if not isinstance(refined, list) or not all(isinstance(e, SessionEvent) for e in refined):
        raise ResumeError(f"{where}: a repair refiner must return a list of SessionEvent")
    if len(refined) != len(closers):
        raise ResumeError(
            f"{where}: a repair refiner returned {len(refined)} closers for {len(closers)}; "
            "it may replace a tool/result closer, never add or drop one"
        )
    for before, after in zip(closers, refined, strict=True):
        if after is before:
            continue
        if (
            before.type != "tool/result"
            or after.type != "tool/result"
            or after.seq != before.seq
            or _result_call(after) != _result_call(before)
        ):
            raise ResumeError(
                f"{where}: a repair refiner changed closer seq {before.seq} "
                f"({before.type}); only a tool/result closer may be replaced, by a "
                "tool/result for the same call at the same seq"
            )


async def _close_turn(service: AgentService, session: Session) -> list[SessionEvent]:
    """Append the closers the live ``session`` still needs (after reconciliation; refined as
    every resume's are, D24) and the seed marker a restore adds; returns the closers as
    appended."""
    appended: list[SessionEvent] = []
    events = session.events  # a snapshot; its older pages stay encoded (D37)
    closers = await service.refine_closers(session.id, events, interrupted_turn_closers(events))
    for closer in closers:
        cited = closer.source_event_seqs
        appended.append(session.append(
            closer.type, closer.data,
            surface_op="append" if closer.surface_op is not UNSET else None,
            source_event_seqs=cited if isinstance(cited, tuple) else None,
        ))  # fmt: skip
    session._mark_seed_end(inherited=False)
    return appended


def _model_variable(context: AssembleContext) -> str | None:
    agent = context.agent
    return agent.options.model if agent is not None else None


def _cwd_variable(context: AssembleContext) -> str | None:
    agent = context.agent
    if agent is None:
        return None
    cwd = agent.session.header.cwd
    return cwd if isinstance(cwd, str) else None
