"""``Agent``: the front door that composes a plugin host from a few arguments.

::

    async with Agent(model="scripted:script.yml", tools=[add],
                     instructions="You are terse.") as agent:
        result = await agent.run("What is 2+3?")

``Agent(...)`` builds the same rows a YAML composition would (see
:meth:`Agent.rows`), boots them with :func:`~dsh_host._loader.open_host` on
``async with``, registers the tools on the ``tools`` service, and drives one
core agent (:class:`dsh_host._agent.Agent`) on one session. Everything the
plugin host offers stays reachable through :attr:`Agent.host`.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import anyio
import msgspec
from msgspec import UNSET

from dsh_host._agent import (
    AgentError,
    ChunkReceived,
    PreStepContext,
    Reject,
    TurnStoppingContext,
    cancel_cause,
)
from dsh_host._agent import Retry as RetryAction
from dsh_host._agent.keys import (
    AGENT,
    AGENT_CHUNK,
    AGENT_PRE_STEP,
    AGENT_REQUEST_ERROR,
    AGENT_TURN_STOPPING,
)
from dsh_host._cancel import CancelToken
from dsh_host._composition_edits import Term, merged, runs_confined, services_of, takes_term
from dsh_host._compositions import load_config
from dsh_host._llm.attachments import attachment_blocks
from dsh_host._loader import LocatedRow, PluginHost, Row, canonical_name, open_host
from dsh_host._persistence.fork import append_fork_effects, fork_effects
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._sandbox import SANDBOX, SANDBOX_MODES, SandboxMode
from dsh_host._session.approvals import DeferredCall
from dsh_host._session.events import (
    ApprovalAsked as ApprovalAskedData,
)
from dsh_host._session.events import (
    ApprovalDecided as ApprovalDecidedData,
)
from dsh_host._session.events import (
    AssistantMessageData,
    CompletedReason,
    ErrorReason,
    SessionEvent,
    ToolCallData,
    ToolResultData,
    TurnEndReason,
    TurnStart,
    UserCancel,
)
from dsh_host._session.events import TurnEnd as TurnEndData
from dsh_host._session.events.data import CompositionTerms, RunTerms
from dsh_host._session.keys import SESSION_EVENT, SESSIONS, TOKEN_METER
from dsh_host._session.messages import (
    ContentBlock,
    PluginSource,
    ReasoningDeltaChunk,
    TextBlock,
    TextDeltaChunk,
    ToolResultBlock,
    UserMessage,
    new_message_id,
)
from dsh_host._session.terms import record_terms, recorded_terms
from dsh_host._session.tokens import UsageTotals, turn_usage
from dsh_host._shipped_plugins import FRONT_DOOR_ROWS, declared_root_keys, declared_store_urls
from dsh_host._tools import (
    ApprovalRequest,
    ToolArgsError,
    ToolDefinition,
    ToolExecution,
    ToolRegistrationError,
    ToolResultEvent,
)
from dsh_host._tools.keys import APPROVAL_REQUEST, TOOLS, TOOLS_RESULT
from dsh_host._tools.types import text_output
from dsh_host.errors import ConfigError

from . import events as ev
from .errors import OutputValidationError, TurnFailedError
from .guardrails import Guardrail, Guardrails, GuardrailTripwireTriggered
from .models import parse_model
from .runner import TermsRefused, composition_digest, differences, portable_spec, terms_of
from .tools import FunctionTool, thaw, type_schema

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from dsh_host._agent import Agent as CoreAgent
    from dsh_host._agent import RequestErrorContext
    from dsh_host._session.session import Session
    from dsh_host._session.store import SessionStore

__all__ = ["FINAL_RESULT", "Agent", "Answerer", "EventStream", "RunResult"]

#: The name of the tool through which the model gives a structured answer (``output_type=``).
FINAL_RESULT: Final = "final_result"
FRONT_DOOR_SOURCE: Final = "dsh-front-door"

#: ``approval=`` callable: given the request, answer True (allow once), False (reject) or an
#: approval outcome string; sync or async.
Answerer: TypeAlias = Callable[[ApprovalRequest], "Awaitable[bool | str] | bool | str"]


class _CliDefault:
    def __repr__(self) -> str:
        return "<the CLI's default store>"


#: ``store=`` default: the session store the ``dsh`` CLI uses here (``./dsh.yml`` or the
#: shipped default composition's persistence row), so library and CLI share sessions.
CLI_DEFAULT: Final = _CliDefault()


@dataclass(frozen=True, slots=True)
class RunResult:
    """How one turn ended and what it produced."""

    #: the final answer: the last assistant text, or the validated ``output_type`` value
    output: Any
    session_id: str
    turn: int
    turn_end: TurnEndReason
    #: the turn's usage and cost, as the token meter reads them from the log: every billed
    #: call (failed attempts and compaction summaries included); ``usage.cost_usd`` is None
    #: when some call's model has no known price. None when no call reported any usage.
    usage: UsageTotals | None

    @property
    def completed(self) -> bool:
        return isinstance(self.turn_end, CompletedReason)


@dataclass(slots=True)
class _OutputRun:
    """Structured output of one turn: the type, what the model produced, its failures."""

    type: Any
    retries: int
    value: Any = UNSET
    failures: int = 0
    last_error: str = ""

    @property
    def exhausted(self) -> bool:
        return self.failures > self.retries


@dataclass(frozen=True, slots=True)
class _Finished:
    result: RunResult | None
    error: BaseException | None




class Agent:
    """An agent on one session of a plugin host composed from these arguments.

    ``model``: ``demo``, ``scripted:PATH`` or ``openai-compatible:MODEL`` (as
    ``dsh run --model``). ``tools``: ``@tool`` functions or
    :class:`~dsh_host._tools.ToolDefinition` objects. ``instructions``: the
    deployment persona of the system prompt (``{{model}}`` and ``{{cwd}}``
    are interpolated; given, they replace the harness's identity line).
    ``output_type``: a msgspec Struct, a dataclass or a TypedDict; the
    model answers through a ``final_result`` tool whose arguments are
    validated, and an invalid answer is sent back with the validation error
    up to ``output_retries`` times. ``store``: a directory (JSONL logs), a
    ``postgresql://`` DSN, None (memory only) or, by default, the CLI's
    store. ``workspace``: the session's working directory
    (default: the current one). ``sandbox``: None (no built-in tools) or a
    mode of the built-in ``bash`` / file tools, confined by ``sandbox-local``.
    ``approval``: ``"ask"`` (calls that need approval fail closed unless an
    answerer is composed), ``"never"`` (refuse them), ``"defer"`` (an unanswered ask waits: the
    turn ends ``awaiting-approval``; :meth:`decide` then :meth:`continue_turn`), or an answerer
    callable. ``rows``: extra rows (mounted before the ``agent`` row);
    ``config``: per-row config overrides by row id. ``composition``: the YAML
    composition to start from (default: the one ``dsh`` uses here: ``$DSH_CONFIG``,
    a trusted ``./dsh.yml``, the user's ``config.yml`` or the shipped default), so
    policies composed there (retries, timeouts ...) apply to the library too; its
    model, built-in tools, skills and hooks (kept only with ``sandbox``) and, when ``store``
    is given, persistence rows are replaced by these arguments.
    """

    def __init__(
        self,
        model: str,
        *,
        tools: Sequence[FunctionTool | ToolDefinition] = (),
        instructions: str | None = None,
        output_type: Any = None,
        output_retries: int = 3,
        store: str | os.PathLike[str] | _CliDefault | None = CLI_DEFAULT,
        workspace: str | os.PathLike[str] | None = None,
        sandbox: SandboxMode | None = None,
        approval: Literal["ask", "never", "defer"] | Answerer = "ask",
        rows: Sequence[Row] = (),
        config: Mapping[str, Mapping[str, Any]] | None = None,
        composition: str | os.PathLike[str] | None = None,
        guardrails: Sequence[Guardrail] = (),
        budget: Mapping[str, Mapping[str, float | int]] | None = None,
        prices: Mapping[str, Mapping[str, float | int]] | None = None,
    ) -> None:
        self._model = parse_model(model, "Agent(model=...)")
        self._guardrails = Guardrails(tuple(guardrails))
        # Plain data, checked by the rows they configure (the agent row's `budget:`, the
        # token-meter row's `prices:`), so a mistake is reported once, the same way as in YAML.
        self._budget = dict(budget) if budget is not None else None
        self._prices = dict(prices) if prices is not None else None
        self._model_spec = model
        self._definitions: list[ToolDefinition] = []
        self._ask: list[str] = []
        for item in tools:
            if isinstance(item, FunctionTool):
                definition = item.definition
                if item.approval == "ask":
                    self._ask.append(definition.name)
            elif isinstance(item, ToolDefinition):
                definition = item
            else:
                raise ToolRegistrationError(
                    f"Agent(tools=...) takes @tool functions or ToolDefinition objects, not "
                    f"{item!r}"
                )
            if any(known.name == definition.name for known in self._definitions):
                raise ToolRegistrationError(
                    f'Agent(tools=...) names tool "{definition.name}" twice'
                )
            self._definitions.append(definition)
        if instructions is not None and not isinstance(instructions, str):
            raise ConfigError("Agent(instructions=...) must be a string")
        self._instructions = instructions
        if type(output_retries) is not int or output_retries < 0:
            raise ConfigError("Agent(output_retries=...) must be a non-negative integer")
        self._output_retries = output_retries
        self._output_type = output_type
        self._output_schemas: dict[Any, dict[str, Any]] = {}
        if output_type is not None:
            self._output_schema(output_type)
        if sandbox is not None and sandbox not in SANDBOX_MODES:
            raise ConfigError(
                f"Agent(sandbox={sandbox!r}): use one of {', '.join(SANDBOX_MODES)} or None"
            )
        self._sandbox = sandbox
        if approval not in ("ask", "never", "defer") and not callable(approval):
            raise ConfigError(
                'Agent(approval=...) is "ask", "never", "defer" or an answerer callable(request)'
            )
        self._approval = approval
        self._workspace = os.path.abspath(os.fspath(workspace) if workspace else os.getcwd())
        self._store = store
        # The CLI's choice and trust rules (D16): a named file, else $DSH_CONFIG, a trusted
        # ./dsh.yml, the user's config.yml, the shipped default.
        self._composition = load_config(os.fspath(composition) if composition is not None else None)
        self._composition_named = composition is not None
        self._extra_rows = list(rows)
        self._overrides = {key: dict(value) for key, value in (config or {}).items()}
        self._rows = self._compose()
        self._stack: AsyncExitStack | None = None
        self._host: PluginHost | None = None
        self._group: TaskGroup | None = None
        self._core: CoreAgent | None = None
        self._last_session: str | None = None
        self._closed_session: Session | None = None
        self._forked: Session | None = None
        self._sink: MemoryObjectSendStream[Any] | None = None
        self._values: dict[str, Any] = {}
        self._output: _OutputRun | None = None
        self._output_installed: Any = None
        self._unregister_output: Callable[[], None] | None = None
        self._streams_done: anyio.Event | None = None

    # ------------------------------------------------------------------ composition
    def rows(self) -> list[Row]:
        """The composition this agent boots (the rows a YAML file would list)."""
        return list(self._rows)

    def _compose(self) -> list[Row]:
        """The base composition (the CLI's by default) with this agent's arguments applied.

        Like ``dsh run``: the model row goes first, the store replaces the persistence
        row, the approval policy and the agent's route are patched in. Rows the front
        door does not configure (retry, timeout and other policies) stay as composed.
        """
        base = [located.row for located in self._composition.rows]
        rows: list[Row] = [self._model.row]
        replace_store = not isinstance(self._store, _CliDefault)
        for row in base:
            name = canonical_name(row.name)
            if row.disabled or row.id == "model":
                continue
            if replace_store and SESSION_PERSISTENCE.name in _services(row):
                continue  # the store and what flushes it: replaced below
            if self._sandbox is None and runs_confined(row):
                # No built-in tools unless a sandbox mode is asked for; nor skills (their
                # scripts run through bash) or command hooks (they run confined: without a
                # sandbox every gate would deny).
                continue
            if name == "agent":
                continue  # added last, with this agent's route
            rows.append(row)
        store = self._store
        if not isinstance(store, _CliDefault) and store is not None:
            at = _index_after(rows, "sessions")
            rows[at:at] = [_store_row(store), _default_row("checkpoints")]
        for needed, row_id in (("sessions", "sessions"), ("llm", "llm"), ("tools", "tools")):
            if not _has(rows, needed):
                rows.append(Row(id=row_id, name=needed))
        approval = self._approval
        terms: dict[Term, Any] = {
            "approval_policy": approval if approval in ("ask", "never") else "ask"
        }
        if approval == "defer":  # an unanswered ask waits for decide() (D19)
            terms["unanswered"] = "defer"
        if not any(takes_term(r, "approval_policy") for r in rows):
            rows.append(_default_row("approval"))
        if self._sandbox is not None:
            if not any(_provides(r, SANDBOX.name) for r in rows):
                rows.append(_default_row("sandbox"))
                terms["network"] = "deny"
            if not any(takes_term(r, "workspace") for r in rows):
                rows.append(_default_row("tools"))
            terms["workspace"], terms["sandbox"] = self._workspace, self._sandbox
        rows = [_with_terms(r, terms) for r in rows]
        if self._ask:
            rules = [{"tool": name, "decision": "ask"} for name in self._ask]
            rows.append(merged(_default_row("ask-rules"), {"rules": rules}))
        rows.extend(self._extra_rows)
        agent_row = next(
            (r for r in base if not r.disabled and canonical_name(r.name) == "agent"),
            Row(id="agent", name="agent"),
        )
        agent_config: dict[str, Any] = {
            "provider": self._model.provider,
            "model": self._model.model,
        }
        if self._instructions:
            # The caller's instructions say who the agent is: the harness's own identity line
            # ("You are an AI agent powered by DeepSeek Harness.") would be written above them
            # and contradict them, so it is left out. Without instructions it stays.
            agent_config["persona"] = self._instructions
            agent_config["include_harness_identity"] = False
        if self._budget is not None:
            agent_config["budget"] = self._budget
        if self._prices is not None:
            if not any(_provides(r, TOKEN_METER.name) for r in rows):
                rows.append(_default_row("prices"))
            rows = [
                merged(r, {"prices": self._prices}) if _provides(r, TOKEN_METER.name) else r
                for r in rows
            ]
        rows.append(merged(agent_row, agent_config))
        ids = {row.id for row in rows if row.id is not None}
        for key in self._overrides:
            if key not in ids:
                raise ConfigError(
                    f"Agent(config={{{key!r}: ...}}): no row has id {key!r}; the rows are "
                    + ", ".join(sorted(ids))
                )
        return [
            merged(row, self._overrides[row.id]) if row.id in self._overrides else row
            for row in rows
        ]

    def _output_schema(self, output_type: Any) -> dict[str, Any]:
        schema = self._output_schemas.get(output_type)
        if schema is None:
            name = getattr(output_type, "__qualname__", repr(output_type))
            schema = type_schema(f"output_type {name}", output_type)
            self._output_schemas[output_type] = schema
        return schema

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Agent:
        if self._stack is not None:
            raise AgentError("this Agent is already open; use one `async with` at a time")
        stack = AsyncExitStack()
        try:
            host = await stack.enter_async_context(open_host(self._rows))
            self._group = await stack.enter_async_context(anyio.create_task_group())
            self._host = host
            self._install(host)
        except BaseException:
            self._host = self._group = None
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session (a running turn ends ``aborted``, the log is flushed) and the host."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if self._core is not None:
                await self._release(self._core)
        finally:
            self._host = self._group = None
            await stack.aclose()

    def _install(self, host: PluginHost) -> None:
        ctx = host.ctx
        for definition in self._definitions:
            ctx.service(TOOLS).register(definition)
        ctx.on(SESSION_EVENT, self._on_event)
        ctx.on(AGENT_CHUNK, self._on_chunk)  # an observer: a failing one cannot cut the turn
        ctx.on(AGENT_REQUEST_ERROR, self._on_request_error, prepend=True)
        ctx.on(TOOLS_RESULT, self._on_tool_result)
        ctx.on(AGENT_PRE_STEP, self._on_pre_step)
        ctx.on(AGENT_TURN_STOPPING, self._on_turn_stopping)
        self._guardrails.install(ctx, lambda agent: agent is not None and agent is self._core)
        approval = self._approval
        if callable(approval):
            answerer = approval

            async def answer(request: ApprovalRequest, next_: Callable[[], Awaitable[str]]) -> str:
                outcome = answerer(request)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
                if outcome is True:
                    return "allowed-once"
                if outcome is False:
                    return "rejected"
                return outcome

            ctx.on(APPROVAL_REQUEST, answer)
        if self._output_type is not None:
            self._install_output(self._output_type)

    # ------------------------------------------------------------------ accessors
    @property
    def host(self) -> PluginHost:
        """The running plugin host (inside ``async with`` only)."""
        if self._host is None:
            raise AgentError("the Agent is not open; use `async with Agent(...) as agent:`")
        return self._host

    def _terms(self, reason: str = "created", changed: Sequence[str] = ()) -> RunTerms:
        """The run terms of this agent's host (recorded on the sessions it creates); its
        composition is identified as ``dsh`` identifies it (the file and its rows' digest), so a
        session moves between the library and the CLI."""
        composition = CompositionTerms(
            name=str(self._composition.path.resolve()),
            digest=composition_digest(self._composition.rows),
        )
        own = self._model.row.id is not None
        return terms_of(
            [LocatedRow(row, "Agent(...)") for row in self._rows], composition=composition,
            spec=portable_spec(self._model_spec) if own else None, by="Agent",
            reason=reason, changed=changed,
        )

    @property
    def core(self) -> CoreAgent:
        """The core agent driving the session (created on first use)."""
        if self._core is None:
            self._core = self.host.ctx.service(AGENT).create(cwd=self._workspace)
            record_terms(self._core.session, self._terms())
        return self._core

    @property
    def session(self) -> Session:
        """The session's in-memory log (still readable after the agent closed)."""
        if self._core is None and self._closed_session is not None:
            return self._closed_session
        return self.core.session

    @property
    def session_id(self) -> str:
        """The id of the session this agent runs on."""
        return self.core.id

    async def resume(self, session_id: str) -> Agent:
        """Continue a stored session (repaired first if a crash interrupted it).

        The session continues only under its recorded run terms: an agent composed with
        another workspace, sandbox or approval policy raises :class:`TermsRefused` naming each
        difference, before anything is written. ``model`` is always given explicitly, so another
        model is an override, logged as one (``run/terms``, ``changed: [model]``); another
        composition is refused unless it was named (``composition=``), then logged too. A
        session that predates the terms is continued under this agent's, which are recorded
        (``assumed``).
        """
        await self._settle()
        record = await self._check_terms(session_id)
        if self._core is not None:
            await self._release(self._core)
        self._core = await self.host.ctx.service(AGENT).resume(session_id)
        if record is not None:
            record_terms(self._core.session, record)
        return self

    async def _check_terms(self, session_id: str) -> RunTerms | None:
        """The terms record to append on resuming ``session_id``, or a refusal."""
        store = self.host.ctx.get(SESSION_PERSISTENCE)
        if store is None:
            return None  # the core agent's resume says why it cannot
        recorded = recorded_terms((await store.inspect(session_id)).events)
        if recorded is None:
            return self._terms("assumed")
        current = self._terms()
        # ``model`` is a required argument, so always an explicit choice: a different one is
        # an override, logged; every other term must be the recorded one.
        problems = [p for p in differences(recorded, current) if not p.startswith("model ")]
        changed = [] if len(problems) == len(differences(recorded, current)) else ["model"]
        other_composition = recorded.composition.digest != current.composition.digest
        if other_composition:
            changed.append("composition")
        if other_composition and not self._composition_named:
            problems.append(
                f"composition {recorded.composition.name} ({recorded.composition.digest[:12]}; "
                f"here: {current.composition.name}, {current.composition.digest[:12]}; name it "
                "with composition= to continue under it)"
            )
        if problems:
            raise TermsRefused(
                f'session "{session_id}" runs under other terms than this Agent: '
                + "; ".join(problems)
                + ". Construct the Agent with the recorded values to continue it "
                "(nothing was written)"
            )
        return self._terms("override", changed) if changed else None

    async def fork(self, boundary: int | None = None) -> str:
        """Continue on a copy of this session's log up to ``boundary`` (default: all of it).

        The parent session is flushed and left as it is (``resume(parent_id)`` goes
        back to it); the child's header names its parent. Returns the child's id.
        A boundary inside an open step is refused (``SessionForkError``). The child gets the
        ``fork/effects`` ledger ``dsh sessions fork`` writes (D27): a call of a turn left out
        that took effect is not run again by an identical call in the child.
        """
        await self._settle()
        store: SessionStore = self.host.ctx.service(SESSIONS)
        parent = self.core
        events = parent.session.events
        child = store.fork(parent.session, boundary)
        cut = boundary if boundary is not None else len(events) - 1
        append_fork_effects(child, parent.id, cut, fork_effects(parent.id, events, cut))
        try:
            await self._release(parent)
        except BaseException:
            store.detach(child)
            raise
        self._core = self.host.ctx.service(AGENT).create(session=child)
        self._forked = child
        return child.id

    async def _release(self, core: CoreAgent) -> None:
        """Close ``core``; a forked session (not owned by its core agent) is flushed here."""
        self._core = None
        self._closed_session = core.session
        await core.aclose()
        forked, self._forked = self._forked, None
        if forked is not None and forked is core.session:
            store = self.host.ctx.service(SESSIONS)
            if store.is_live(forked):
                with anyio.CancelScope(shield=True):
                    try:
                        await store.flush(forked)
                    finally:
                        store.detach(forked)

    # ------------------------------------------------------------------ running
    async def run(
        self,
        prompt: str,
        *,
        output_type: Any = None,
        attachments: Sequence[str | os.PathLike[str]] = (),
    ) -> RunResult:
        """Run one turn to its end; the log is flushed before this returns.

        With an ``output_type`` (here or on the agent), ``result.output`` is
        the validated value, or :class:`OutputValidationError` is raised.
        ``attachments`` are image (PNG, JPEG, GIF, WebP) and PDF files sent with the
        prompt; a missing, unsupported or too large file, or a model that takes no images
        (D31), raises :class:`~dsh_host._llm.attachments.AttachmentError` before anything is
        logged.
        """
        turn_prompt: str | list[ContentBlock] = prompt
        if attachments:
            turn_prompt = [TextBlock(text=prompt), *attachment_blocks(attachments)]
        await self._settle()
        core = self.core
        with self._output_for(output_type) as state:
            reason = await core.run_turn(turn_prompt)
        return await self._finish(core, reason, state)

    # ------------------------------------------------------------------ approvals that wait
    def pending_approvals(self) -> list[DeferredCall]:
        """The calls of this session waiting for a decision (``approval="defer"`` rows, D19)."""
        return self.core.pending_approvals()

    async def decide(
        self, call_id: str, decision: Literal["allow", "deny"], *, reason: str | None = None
    ) -> DeferredCall:
        """Record a decision for a pending call (bound to its logged arguments, one-shot)."""
        await self._settle()
        return await self.core.decide(call_id, decision, reason=reason, decided_by="library")

    async def continue_turn(self, *, output_type: Any = None) -> RunResult:
        """Apply the recorded decisions (the allowed calls run once) and continue the session."""
        await self._settle()
        core = self.core
        with self._output_for(output_type) as state:
            reason = await core.continue_turn()
        return await self._finish(core, reason, state)

    def run_sync(self, prompt: str, *, output_type: Any = None, backend: str = "trio") -> RunResult:
        """:meth:`run` for scripts: opens the agent, runs one turn, closes it.

        A later ``run_sync`` on the same object continues the same session when
        the store keeps sessions (resumed), else starts a new one.
        """
        if self._stack is not None:
            raise AgentError(
                "run_sync() opens and closes the agent itself; inside `async with`, use "
                "`await agent.run(...)`"
            )

        async def main() -> RunResult:
            async with self:
                persistence = self.host.ctx.get(SESSION_PERSISTENCE)
                if self._last_session is not None and persistence is not None:
                    await self.resume(self._last_session)
                result = await self.run(prompt, output_type=output_type)
                self._last_session = result.session_id
                return result

        return anyio.run(main, backend=backend)

    def stream(self, prompt: str, *, output_type: Any = None) -> EventStream:
        """Run one turn and iterate its typed events in log order (see :mod:`.events`).

        Output never steers the turn: leaving the loop early -- a ``break``, or an
        exception in the loop's body (a closed pipe, a failing terminal) -- stops
        the events, not the turn, which runs to its end (the next run waits for it;
        ``async with agent.stream(...) as events`` or ``await events.aclose()``
        waits too). To stop the turn, say so: ``events.cancel()`` (it ends
        ``aborted``). A slow loop never slows the turn: the events wait in an
        unbounded buffer. After the loop, ``events.result`` is the
        :class:`RunResult`.
        """
        return EventStream(self, prompt, output_type)

    async def _settle(self) -> None:
        """Wait until no earlier turn (e.g. of an abandoned stream) is still running."""
        done = self._streams_done
        if done is not None:
            with anyio.CancelScope(shield=True):
                await done.wait()
        if self._core is not None:
            await self._core.wait_idle()

    async def _start_stream(
        self, prompt: str, output_type: Any, token: CancelToken
    ) -> tuple[MemoryObjectReceiveStream[Any], anyio.Event]:
        await self._settle()
        core = self.core
        group = self._group
        assert group is not None
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        done = anyio.Event()
        self._streams_done = done
        self._sink = send

        async def drive() -> None:
            item: _Finished | None = None
            try:
                with self._output_for(output_type) as state:
                    reason = await core.run_turn(prompt, signal=token)
                item = _Finished(await self._finish(core, reason, state), None)
            except Exception as exc:
                item = _Finished(None, exc)
            finally:
                if self._sink is send:
                    self._sink = None
                if item is not None:
                    send.send_nowait(item)
                send.close()  # a host cancellation ends the iteration instead of hanging it
                done.set()

        group.start_soon(drive)
        return receive, done

    async def _finish(
        self, core: CoreAgent, reason: TurnEndReason, state: _OutputRun | None
    ) -> RunResult:
        await self.host.ctx.service(SESSIONS).flush(core.session)
        turn = core.last_turn
        text = _turn_answer(core.session, turn)
        meter = self.host.ctx.get(TOKEN_METER)
        usage = turn_usage(meter, core.session, turn)
        tripped = self._guardrails.take(core, turn)
        if tripped is not None:  # the log (flushed above) holds the verdict; the caller hears it
            guardrail, output = tripped
            result = RunResult(text, core.id, turn, reason, usage)
            raise GuardrailTripwireTriggered(guardrail.kind, guardrail.name, output, result)
        if isinstance(reason, ErrorReason):
            failure = reason.error
            raise TurnFailedError(
                f'turn {turn} of session "{core.id}" failed ({failure.code}): {failure.message}; '
                "the log holds the turn's end (error.result has it)",
                failure.code,
                RunResult(text, core.id, turn, reason, usage),
            )
        if state is None:
            return RunResult(text, core.id, turn, reason, usage)
        if state.value is UNSET:
            result = RunResult(None, core.id, turn, reason, usage)
            why = state.last_error or "the model answered without calling it"
            raise OutputValidationError(
                f"no valid {_type_label(state.type)} from the model after {state.failures} "
                f"rejected attempt(s) (output_retries={state.retries}) through the "
                f"{FINAL_RESULT} tool; last problem: {why}",
                result,
            )
        return RunResult(state.value, core.id, turn, reason, usage)

    # ------------------------------------------------------------------ structured output
    @contextmanager
    def _output_for(self, output_type: Any) -> Iterator[_OutputRun | None]:
        chosen = output_type if output_type is not None else self._output_type
        if chosen is None:
            if self._unregister_output is not None:
                self._unregister_output()
                self._unregister_output = None
                self._output_installed = None
            yield None
            return
        self._install_output(chosen)
        state = _OutputRun(chosen, self._output_retries)
        self._output = state
        try:
            yield state
        finally:
            self._output = None

    def _install_output(self, output_type: Any) -> None:
        if self._output_installed is output_type and self._unregister_output is not None:
            return
        if self._unregister_output is not None:
            self._unregister_output()
        schema = self._output_schema(output_type)
        doc = (inspect.getdoc(output_type) or "").strip()
        description = (
            "Give your final answer by calling this tool once, with the answer as its "
            "arguments; a plain text reply is not accepted as the answer."
            + (f" The answer: {doc}" if doc else "")
        )
        self._unregister_output = self.host.ctx.service(TOOLS).register(
            ToolDefinition(
                name=FINAL_RESULT,
                description=description,
                parameters=schema,
                execute=self._final_result,
                output=text_output(),
            )
        )
        self._output_installed = output_type

    async def _final_result(self, arguments: Any, execution: ToolExecution) -> str:
        state = self._output
        if state is None:
            raise ToolArgsError([f"{FINAL_RESULT} is not expected in this turn"])
        try:
            value = msgspec.convert(thaw(arguments), state.type, strict=False)
        except msgspec.ValidationError as exc:
            raise ToolArgsError([str(exc)]) from None
        state.value = value
        execution.conclude_turn()
        return "Final result accepted."

    def _on_tool_result(self, event: ToolResultEvent) -> None:
        # Emitted just before the scheduler appends `tool/result`: keep the value for the stream.
        if self._sink is not None and event.exec.parent is None and not event.result.is_error:
            self._values[event.exec.call_id] = event.result.value
        state = self._output
        if state is None or event.exec.name != FINAL_RESULT or not event.result.is_error:
            return
        state.failures += 1
        state.last_error = " ".join(
            block.text for block in event.result.content if isinstance(block, TextBlock)
        )

    async def _on_pre_step(
        self, context: PreStepContext, next_: Callable[[], Awaitable[Any]]
    ) -> Any:
        state = self._output
        if state is not None and state.exhausted and context.agent is self._core:
            return Reject()  # the model keeps failing the output type: stop paying for it
        return await next_()

    async def _on_turn_stopping(self, context: TurnStoppingContext) -> None:
        state = self._output
        if state is None or state.value is not UNSET or context.agent is not self._core:
            return
        state.failures += 1
        state.last_error = "the model answered with text instead of calling the tool"
        if state.exhausted:
            return
        context.agent.steer(
            UserMessage(
                id=new_message_id(),
                content=(
                    TextBlock(
                        text=f"Give your final answer by calling the {FINAL_RESULT} tool; a "
                        "plain text reply is not accepted as the answer."
                    ),
                ),
                source=PluginSource(plugin=FRONT_DOOR_SOURCE),
            )
        )

    # ------------------------------------------------------------------ the event stream
    def _ours(self, session: Any) -> bool:
        core = self._core
        return core is not None and session is core.session

    def _on_event(self, session: Any, event: SessionEvent) -> None:
        if not self._ours(session):
            return
        sink = self._sink
        if sink is None:
            return
        out = _typed_event(event, self._values)
        if out is not None:
            sink.send_nowait(out)

    def _on_chunk(self, received: ChunkReceived) -> None:
        sink = self._sink
        if sink is None or received.agent is not self._core:
            return
        chunk, turn, step = received.chunk, received.turn, received.step
        if isinstance(chunk, TextDeltaChunk):
            sink.send_nowait(ev.TextDelta(chunk.text, turn, step))
        elif isinstance(chunk, ReasoningDeltaChunk):
            sink.send_nowait(ev.ReasoningDelta(chunk.text, turn, step))

    async def _on_request_error(
        self, context: RequestErrorContext, next_: Callable[[], Awaitable[Any]]
    ) -> Any:
        action = await next_()
        sink = self._sink
        if isinstance(action, RetryAction) and sink is not None and context.agent is self._core:
            sink.send_nowait(ev.Retry(context.turn, context.step, context.attempt, context.failure))
        return action


class EventStream:
    """The events of one streamed turn; an async iterator and an async context manager."""

    def __init__(self, agent: Agent, prompt: str, output_type: Any) -> None:
        self._agent = agent
        self._prompt = prompt
        self._output_type = output_type
        self._token = CancelToken()
        self._receive: MemoryObjectReceiveStream[Any] | None = None
        self._done: anyio.Event | None = None
        self._finished = False
        #: the run's result once the iteration ended normally
        self.result: RunResult | None = None

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ev.Event:
        if self._finished:
            raise StopAsyncIteration
        if self._receive is None:
            self._receive, self._done = await self._agent._start_stream(
                self._prompt, self._output_type, self._token
            )
        try:
            item = await self._receive.receive()
        except anyio.EndOfStream:
            self._finished = True
            raise StopAsyncIteration from None
        if isinstance(item, _Finished):
            self._finished = True
            if item.error is not None:
                raise item.error
            self.result = item.result
            raise StopAsyncIteration
        event: ev.Event = item
        return event

    def cancel(self, cause: object = None) -> None:
        """Cancel the streamed turn (it ends ``aborted``, ``cause`` recorded; a user cancel by
        default); the iteration then runs to the turn's end."""
        self._token.abort(cancel_cause(cause) if cause is not None else UserCancel())

    async def aclose(self) -> None:
        """Stop the events and wait until the turn ended (it is not cancelled: see
        :meth:`cancel`)."""
        done = self._done
        if done is not None:
            with anyio.CancelScope(shield=True):
                await done.wait()
        self._finished = True

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()



# --------------------------------------------------------------------------- helpers


def _store_row(store: str | os.PathLike[str]) -> Row:
    """The persistence row of ``store=``: a URL whose scheme a store declares (``StoreUrl``:
    ``postgresql://`` is PostgreSQL's DSN), else a JSONL root."""
    text = os.fspath(store)
    scheme, sep, _rest = text.partition("://")
    declared = declared_store_urls().get(scheme) if sep else None
    default = FRONT_DOOR_ROWS["file-store"]
    if declared is not None:
        plugin, key = declared
        return Row(id=default.id, name=plugin, config={key: text})
    return Row(id=default.id, name=default.plugin,
               config={declared_root_keys()[default.plugin]: text})


def _default_row(role: str) -> Row:
    """The row that fills ``role`` when the composition has none (``FRONT_DOOR_ROWS``)."""
    default = FRONT_DOOR_ROWS[role]
    return Row(id=default.id, name=default.plugin)


def _services(row: Row) -> tuple[str, ...]:
    """What ``row`` provides and injects, in one tuple (a disabled row: nothing)."""
    if row.disabled:
        return ()
    provides, inject = services_of(row)
    return (*provides, *inject)


def _provides(row: Row, service: str) -> bool:
    return not row.disabled and service in services_of(row)[0]


def _with_terms(row: Row, terms: Mapping[Term, Any]) -> Row:
    """``row`` with each term it takes set from ``terms``."""
    values = {key: value for term, value in terms.items()
              if (key := takes_term(row, term)) is not None}
    return merged(row, values) if values else row


def _has(rows: Sequence[Row], plugin: str) -> bool:
    return any(canonical_name(row.name) == plugin for row in rows)


def _index_after(rows: Sequence[Row], plugin: str) -> int:
    for index, row in enumerate(rows):
        if canonical_name(row.name) == plugin:
            return index + 1
    return len(rows)


def _typed_event(event: SessionEvent, values: dict[str, Any]) -> ev.Event | None:
    data = event.data
    if isinstance(data, ToolCallData):
        return ev.ToolCallStarted(
            event.seq, data.turn, data.step, data.call_id, data.name, data.arguments
        )
    if isinstance(data, ToolResultData):
        texts: list[str] = []
        for block in data.message.content:
            if isinstance(block, ToolResultBlock):
                texts.extend(
                    part.text for part in block.content if isinstance(part, TextBlock)
                )
        error = data.error
        call_id = data.message.source.call_id
        value = values.pop(call_id, None)
        return ev.ToolCallFinished(
            event.seq,
            data.turn,
            data.step,
            call_id,
            error is not UNSET or _is_error(data),
            "\n".join(texts),
            error.code if error is not UNSET else None,
            thaw(value),
        )
    if isinstance(data, ApprovalAskedData):
        return ev.ApprovalAsked(
            event.seq,
            data.id,
            data.tool_name,
            data.call_id if data.call_id is not UNSET else None,
            data.reason if data.reason is not UNSET else None,
        )
    if isinstance(data, ApprovalDecidedData):
        return ev.ApprovalDecided(event.seq, data.id, data.outcome)
    if isinstance(data, TurnEndData):
        return ev.TurnEnd(event.seq, data.turn, data.reason)
    return None


def _is_error(data: ToolResultData) -> bool:
    return any(
        isinstance(block, ToolResultBlock) and block.is_error is True
        for block in data.message.content
    )


def _turn_answer(session: Session, turn: int) -> str:
    """The last assistant text of ``turn``."""
    for event in reversed(session.events):
        data = event.data
        if isinstance(data, TurnStart) and data.turn == turn:
            break
        if isinstance(data, AssistantMessageData) and data.turn == turn:
            return "".join(
                block.text for block in data.message.content if isinstance(block, TextBlock)
            )
    return ""


def _type_label(output_type: Any) -> str:
    name = getattr(output_type, "__qualname__", None)
    return name if isinstance(name, str) else repr(output_type)

