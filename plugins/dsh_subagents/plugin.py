"""The ``subagents`` plugin: delegation to child agents that run in child sessions (D24).

One model-facing tool, ``subagent`` ``{agent, description?, prompt}``. Its body runs the named
child agent in a **child session** of the same store and returns the child's final answer:

1. the delegating call is a top-level tool body, so the checkpoint policy has flushed the
   parent's ``tool/call`` before the body runs (the child session does not exist yet);
2. the child session is created (and flushed) with DSH's lineage header (``parentSession``,
   ``origin: subagent``, ``delegationDepth``) under the id ``<parent>--<call id>``; its log
   opens with an ``ignorable`` ``dsh-subagents/delegation`` event (parent, call id, agent, the
   parent's turn and ``tool/call`` seq: D30) and
   DSH's ``subagent/descriptor``; the parent's log gets DSH's ``subagent/catalog`` fact,
   flushed before the child's first request;
3. the child agent runs one turn (its own checkpoints flush its own log), is flushed, detached;
4. its last assistant text is the tool result (an error result when the turn did not complete).

On resume the plugin refines the parent's repair (``ctx.agent.repair_refiner``): for a
delegating call left without a result it repairs the child first, then answers the call from
the child's recorded state (see :func:`delegation_closer`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import msgspec

from dsh_host.sdk import (
    AGENT,
    DELEGATION_EVENT,
    PERSONA_SECTION,
    SESSION_PERSISTENCE,
    SESSIONS,
    SUBAGENTS,
    SYSTEM_PROMPT_ASSEMBLE,
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    TOOLS,
    AssembleContext,
    AssembledSection,
    AssistantMessageData,
    Context,
    DelegationLink,
    Plugin,
    PromptAssembly,
    SessionEvent,
    SessionNotFoundError,
    TextBlock,
    ToolCallBlock,
    ToolCallData,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolResultData,
    TurnEnd,
    TurnStart,
    capped_mode,
    decode_event,
    interrupted_tool_result_id,
    interrupted_turn_closers,
    text_output,
)

from .config import ChildAgentConfig, SubagentsConfig, check_sandbox_narrowing

__all__ = [
    "DELEGATION_EVENT",
    "TOOL_NAME",
    "Subagents",
    "child_session_id",
    "child_state",
    "delegation_closer",
]

#: The model-facing delegation tool (DSH's ``tool-subagent`` is named ``subagent`` too).
TOOL_NAME: Final = "subagent"
#: DSH's descriptor version and the provider name written in it.
DESCRIPTOR_VERSION: Final = 2
PROVIDER_NAME: Final = "dsh-subagents"
_SUMMARY_TEXT_CHARS: Final = 400


def child_session_id(parent_id: str, call_id: str) -> str:
    """The child session of ``call_id`` in ``parent_id`` (D24): derivable, no index needed."""
    return f"{parent_id}--{call_id}"


def _depth(session: Any) -> int:
    depth = getattr(getattr(session, "header", None), "delegation_depth", 0)
    return depth if isinstance(depth, int) else 0


# -- reading a child's log --------------------------------------------------------------------


class ChildState:
    """What a child's log says about its one delegated turn."""

    __slots__ = ("answer", "ended", "reason", "started", "summary")

    def __init__(
        self, *, started: bool, ended: bool, reason: str, answer: str, summary: str
    ) -> None:
        self.started = started  #: a turn was durably opened (its first request may have run)
        self.ended = ended  #: the turn ended on its own (a turn/end written by the live loop)
        self.reason = reason  #: the turn/end reason kind ("" when it did not end)
        self.answer = answer  #: the last assistant text of the turn
        self.summary = summary  #: one paragraph: what the child did

    @property
    def completed(self) -> bool:
        return self.ended and self.reason == "completed"


def _reason_kind(reason: Any) -> str:
    """A turn/end reason's ``kind``, whether it is a typed reason or its plain JSON."""
    plain = reason if isinstance(reason, Mapping) else msgspec.to_builtins(reason)
    kind = plain.get("kind") if isinstance(plain, Mapping) else None
    return kind if isinstance(kind, str) else ""


def child_state(events: Sequence[SessionEvent]) -> ChildState:
    """Read the child's last turn from its log (as stored, before any repair closers)."""
    started = False
    ended = False
    reason = ""
    answer = ""
    calls: Counter[str] = Counter()
    answered = 0
    for event in events:
        data = event.data
        if isinstance(data, TurnStart):
            started, ended, reason, answer = True, False, "", ""
            calls.clear()
            answered = 0
        elif isinstance(data, TurnEnd):
            ended = True
            reason = _reason_kind(data.reason)
        elif isinstance(data, AssistantMessageData):
            text = "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
            if text:
                answer = text
        elif isinstance(data, ToolCallData):
            calls[data.name] += 1
        elif isinstance(data, ToolResultData):
            answered += 1
    done = ", ".join(f"{name} x{count}" for name, count in sorted(calls.items())) or "none"
    last = answer if len(answer) <= _SUMMARY_TEXT_CHARS else answer[:_SUMMARY_TEXT_CHARS] + "…"
    summary = (
        f"It started {sum(calls.values())} tool call(s) ({done}), {answered} with a recorded "
        f"result; its last text was: {last!r}."
        if started
        else "It never started a turn."
    )
    return ChildState(started=started, ended=ended, reason=reason, answer=answer, summary=summary)


def _unfinished_text(agent: str, child_id: str, state: ChildState) -> str:
    return (
        f'sub-agent "{agent}" (child session {child_id}) ended its turn "{state.reason}" '
        f"without completing. {state.summary}"
    )


# -- repair -----------------------------------------------------------------------------------


def delegation_closer(
    closer: SessionEvent, *, agent: str, child_id: str, state: ChildState | None
) -> SessionEvent:
    """The result a delegating call gets on resume, from its child's state (D24).

    ``state`` None: the child session was never stored, so nothing of the delegation ran
    (``TOOL_NOT_STARTED``); a child that never opened a turn is the same (no child model
    request precedes that flush). A completed child's answer is the call's result; a child
    that ended otherwise gives the error text its live call would have given; an interrupted
    child gives ``TOOL_OUTCOME_UNKNOWN`` with the child id and a summary of what it did.
    """
    data = closer.data
    assert isinstance(data, ToolResultData)
    call_id = data.message.source.call_id
    is_error = True
    error: dict[str, str] | None
    if state is None or not state.started:
        text = f'{TOOL_NOT_STARTED_TEXT}\n(sub-agent "{agent}": the child session {child_id} ' + (
            "was never stored.)" if state is None else "never started a turn.)"
        )
        error = {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED}
    elif state.completed:
        text, is_error, error = state.answer, False, None
    elif state.ended:
        text = f"Error: {_unfinished_text(agent, child_id, state)}"
        error = {"name": "SubagentUnfinishedError", "code": "SUBAGENT_UNFINISHED"}
    else:
        text = (
            f'{TOOL_OUTCOME_UNKNOWN_TEXT}\nThe sub-agent "{agent}" was interrupted: its log is '
            f"child session {child_id} (`dsh sessions show {child_id}`). {state.summary}"
        )
        error = {"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN}
    record: dict[str, Any] = {
        "type": "tool/result",
        "seq": closer.seq,
        "time": closer.time,
        "data": {
            "turn": data.turn,
            "step": data.step,
            "message": {
                "id": interrupted_tool_result_id(call_id, closer.seq),
                "role": "user",
                "source": {"kind": "tool", "callId": call_id},
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": call_id,
                        "isError": is_error,
                        "content": [{"type": "text", "text": text}],
                    }
                ],
            },
        },
        "surfaceOp": "append",
    }
    if error is not None:
        record["data"]["error"] = error
    cited = closer.source_event_seqs
    if isinstance(cited, tuple | list):
        record["sourceEventSeqs"] = list(cited)
    return decode_event(record, where="subagent repair closer", exact=True)


def _delegations(events: Sequence[SessionEvent]) -> dict[str, str]:
    """call id -> agent name of every ``subagent`` call the model made in ``events``."""
    found: dict[str, str] = {}
    for event in events:
        data = event.data
        if isinstance(data, AssistantMessageData):
            for block in data.message.content:
                if isinstance(block, ToolCallBlock) and block.name == TOOL_NAME:
                    args = block.arguments
                    agent = args.get("agent") if hasattr(args, "get") else None
                    found[block.id] = agent if isinstance(agent, str) else "?"
    return found


# -- the plugin -------------------------------------------------------------------------------


class Subagents(Plugin):
    """Entry point ``subagents``: the ``subagent`` tool and its crash repair (D24)."""

    name = "subagents"
    #: ``ctx.subagents`` is this plugin; a repair-only boot (``dsh resume`` without a prompt)
    #: keeps the rows that provide it, so the child is repaired there too.
    provides = ("subagents",)
    #: a repair of the parent refines the delegating calls' closers from the children (D24)
    boots_for_repair = True
    inject = ("sessions", "tools", "agent")
    Config = SubagentsConfig

    def apply(self, ctx: Context, config: SubagentsConfig) -> None:
        parents = ctx.row_configs("builtin-tools", "dsh-builtin-tools")
        parent_mode = getattr(parents[0], "sandbox", None) if parents else config.parent_sandbox
        check_sandbox_narrowing(config, parent_mode)
        self._ctx = ctx
        self._config = config
        self._agents = {agent.name: agent for agent in config.agents}
        #: live child core agents (by agent id) -> their declaration
        self._children: dict[str, ChildAgentConfig] = {}
        tools = ctx.service(TOOLS)
        tools.register(self._tool(), owner=ctx)
        tools.guard(self._guard, owner=ctx)
        ctx.on(SYSTEM_PROMPT_ASSEMBLE, self._assemble)
        ctx.service(AGENT).repair_refiner(self._refine, owner=ctx)
        ctx.provide(SUBAGENTS, self)

    # -- model-facing tool ----------------------------------------------------------------
    def _tool(self) -> ToolDefinition:
        names = [agent.name for agent in self._config.agents]
        catalog = "\n".join(f"- {a.name}: {a.description}" for a in self._config.agents)
        return ToolDefinition(
            name=TOOL_NAME,
            description=(
                "Delegate a self-contained task to a sub-agent. It works in its own session "
                "with its own instructions and tools, sees only `prompt` (not this "
                "conversation), and its final answer is this call's result. Independent "
                "delegations may be called in parallel. Available agents:\n" + catalog
            ),
            parameters={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": names, "description": "which sub-agent"},
                    "description": {
                        "type": "string",
                        "description": "a short label for the task (3-8 words)",
                    },
                    "prompt": {
                        "type": "string",
                        "description": "the complete task: everything the sub-agent needs",
                    },
                },
                "required": ["agent", "prompt"],
                "additionalProperties": False,
            },
            execute=self._execute,
            output=text_output(),
            is_concurrency_safe=lambda _args: True,
        )

    async def _execute(self, args: Any, exec: ToolExecution) -> str:
        ctx = self._ctx
        declared = self._agents.get(args["agent"])
        if declared is None:  # the schema's enum refuses it first; kept for nested dispatch
            raise ToolError(f'unknown sub-agent "{args["agent"]}"')
        parent = exec.agent
        parent_session = getattr(parent, "session", None)
        if parent is None or parent_session is None:
            raise ToolError("the subagent tool needs a calling agent with a session")
        depth = _depth(parent_session) + 1
        if depth > self._config.max_depth:
            raise ToolError(f"subagent depth {depth} exceeds maxDepth {self._config.max_depth}")
        store = ctx.service(SESSIONS)
        label = args.get("description") or declared.name
        child_id = child_session_id(parent_session.id, exec.call_id)
        meta: dict[str, Any] = {
            "parentSession": parent_session.id,
            "origin": "subagent",
            "delegationDepth": depth,
        }
        cwd = getattr(parent_session.header, "cwd", None)
        if isinstance(cwd, str):
            meta["cwd"] = cwd
        # The delegating call's turn and tool/call seq (flushed before this body ran) and the
        # top-level turn the tree hangs from go in the child's log, so the child names the
        # parent's span ids on its own (D30).
        link = DelegationLink.under(
            parent_session.id, parent_session.events, exec.call_id, declared.name
        )
        child_session = store.create(child_id, meta=meta)
        child_session.append(DELEGATION_EVENT, link.data(), ignorable=True)
        child_session.append(
            "subagent/descriptor",
            {
                "version": DESCRIPTOR_VERSION,
                "mode": "one-shot",
                "provider": PROVIDER_NAME,
                "label": label,
            },
        )
        # The child exists on disk before the parent's catalog names it, and the catalog is
        # durable before the child's first request: a crash never leaves a fact without its
        # child, nor a running child its parent cannot list.
        await store.flush(child_session)
        parent_session.append(
            "subagent/catalog",
            {
                "version": 0,
                "childId": child_id,
                "childCreatedAt": child_session.header.created_at,
                "mode": "one-shot",
                "label": label,
            },
        )
        await store.flush(parent_session)
        options = getattr(parent, "options", None)
        provider = declared.provider or getattr(options, "provider", None)
        model = declared.model or getattr(options, "model", None)
        try:
            child = ctx.service(AGENT).create(
                session=child_session,
                provider=provider,
                model=model,
                max_steps_per_turn=declared.max_steps,
            )
            # Never wider than the parent (D24): the declared mode, under the parent's own cap.
            parent_cap = getattr(parent, "sandbox_cap", None)
            cap = declared.sandbox or parent_cap
            if declared.sandbox is not None and parent_cap is not None:
                cap = capped_mode(declared.sandbox, parent)
            child.sandbox_cap = cap
            self._children[child.id] = declared
            try:
                reason = await child.run_turn(args["prompt"], signal=exec.signal)
            finally:
                self._children.pop(child.id, None)
                with anyio.CancelScope(shield=True):
                    await child.aclose()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await store.flush(child_session)  # the child's end is durable before ours
                finally:
                    if store.is_live(child_session):
                        store.detach(child_session)
        state = child_state(child_session.events)
        if _reason_kind(reason) != "completed" or not state.completed:
            raise ToolError(_unfinished_text(declared.name, child_id, state))
        return state.answer

    # -- what a child sees and may call ---------------------------------------------------
    def _declared_for(self, agent: Any) -> ChildAgentConfig | None:
        agent_id = getattr(agent, "id", None)
        return self._children.get(agent_id) if isinstance(agent_id, str) else None

    def _visible(self, agent: Any, declared: ChildAgentConfig | None, tool: str) -> bool:
        if tool == TOOL_NAME:
            session = getattr(agent, "session", None)
            if _depth(session) >= self._config.max_depth:
                return False
        if declared is None:
            return True
        if declared.tools is None:
            return tool != TOOL_NAME
        return tool in declared.tools

    def _guard(self, exec: ToolExecution) -> str | None:
        declared = self._declared_for(exec.agent)
        if declared is None or self._visible(exec.agent, declared, exec.name):
            return None
        return f'tool "{exec.name}" is not available to sub-agent "{declared.name}"'

    async def _assemble(
        self, context: AssembleContext, next_: Callable[[], Awaitable[PromptAssembly]]
    ) -> PromptAssembly:
        assembly = await next_()
        agent = context.agent
        declared = self._declared_for(agent)
        assembly.tools = [t for t in assembly.tools if self._visible(agent, declared, t.name)]
        if declared is not None and declared.instructions:
            sections = [s for s in assembly.sections if s.name != PERSONA_SECTION]
            sections.append(AssembledSection(PERSONA_SECTION, declared.instructions))
            assembly.sections = sections
        return assembly

    # -- crash repair ---------------------------------------------------------------------
    async def _refine(
        self, session_id: str, events: Sequence[SessionEvent], closers: list[SessionEvent]
    ) -> list[SessionEvent]:
        delegations = _delegations(events)
        refined: list[SessionEvent] = []
        for closer in closers:
            data = closer.data
            if (
                closer.type == "tool/result"
                and isinstance(data, ToolResultData)
                and data.message.source.call_id in delegations
            ):
                call_id = data.message.source.call_id
                child_id = child_session_id(session_id, call_id)
                state = await self._repair_child(child_id)
                closer = delegation_closer(
                    closer, agent=delegations[call_id], child_id=child_id, state=state
                )
            refined.append(closer)
        return refined

    async def _repair_child(self, child_id: str) -> ChildState | None:
        """Repair the child's own log durably (its children first); its state, None if absent."""
        persistence = self._ctx.get(SESSION_PERSISTENCE)
        if persistence is None:
            return None
        try:
            handle = await persistence.open(child_id, "write")
        except SessionNotFoundError:
            return None
        try:
            load = await handle.read()
            state = child_state(load.events)
            service = self._ctx.service(AGENT)
            closers = await service.refine_closers(
                child_id, load.events, interrupted_turn_closers(load.events)
            )
            if closers:
                handle.append(closers)
            await handle.flush()
        finally:
            await handle.close()
        return state
