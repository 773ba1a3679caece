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
the child's recorded state (see :func:`.logs.delegation_closer`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any, Final

import anyio
import msgspec

from dsh_host.sdk import (
    AGENT,
    AGENT_REQUEST,
    AGENT_TURN_END,
    DELEGATION_EVENT,
    LLM,
    PERSONA_SECTION,
    SESSION_PERSISTENCE,
    SESSIONS,
    SUBAGENTS,
    SYSTEM_PROMPT_ASSEMBLE,
    TOKEN_METER,
    TOOLS,
    AssembleContext,
    AssembledSection,
    BudgetExceededReason,
    Context,
    DelegationLink,
    LlmCallConfig,
    Plugin,
    PromptAssembly,
    RequestProposal,
    SessionEvent,
    SessionNotFoundError,
    TokenMeter,
    ToolCallWaits,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolResultData,
    TurnEnded,
    UsageTotals,
    capped_mode,
    check_object_schema,
    over_budget,
    text_output,
)

from .config import (
    SANDBOX_ORDER,
    ChildAgentConfig,
    SubagentsConfig,
    SubagentsConfigError,
    check_sandbox_narrowing,
)
from .logs import (
    HANDOFF_EVENT,
    HANDOFF_TOOL,
    TOOL_NAME,
    ChildState,
    DelegationTree,
    answer_text,
    child_cap,
    child_session_id,
    child_state,
    current_turn,
    delegation_closer,
    delegations_in,
    depth_of,
    event_fields,
    handoff_closer,
    handoff_target,
    handoff_text,
    output_tool,
    steps_in,
    unfinished_text,
    waited_on,
)

__all__ = ["DELEGATION_EVENT", "Subagents"]

#: DSH's descriptor version and the provider name written in it.
DESCRIPTOR_VERSION: Final = 2
PROVIDER_NAME: Final = "dsh-subagents"
#: The prompt of the turn that continues an interrupted child on resume (``resume: continue``).
CONTINUE_PROMPT: Final = (
    "Your previous turn was interrupted before it finished (the process stopped). Its tool "
    "calls are closed above with what is known of them; a call of unknown outcome may or may "
    "not have taken effect, so check before repeating it. Continue the task and give your "
    "final answer."
)




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
        #: output tool name -> the typed agent it belongs to (D34)
        self._outputs: dict[str, str] = {}
        for index, agent in enumerate(config.agents):
            if agent.output_schema is not None:
                where = f"agents[{index}] ({agent.name}).output_schema"
                try:
                    check_object_schema(agent.output_schema, where)
                except ToolError as error:
                    raise SubagentsConfigError(
                        f"subagents: {error}; use the tools' JSON Schema subset "
                        "(docs: dsh_host._tools.schema)"
                    ) from None
                tools.register(self._output_tool(agent), owner=ctx)
                self._outputs[output_tool(agent.name)] = agent.name
        #: agents whose sandbox ceiling a handoff narrowed: the ceiling to restore at turn end
        self._caps_before: dict[str, Any] = {}
        #: agents a handoff gave another model route (their next turn goes back to their own)
        self._rerouted: set[str] = set()
        #: root session id -> its current turn's delegation tree; child session id -> root id
        self._trees: dict[str, DelegationTree] = {}
        self._root_of: dict[str, str] = {}
        self._meter: TokenMeter | None = None
        #: sandbox ceilings of children being continued on resume (a grandchild's parent's)
        self._resume_caps: dict[str, str] = {}
        if config.handoffs:
            tools.register(self._handoff_tool(), owner=ctx)
            ctx.on(AGENT_REQUEST, self._route)
        ctx.on(AGENT_TURN_END, self._turn_ended)
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
        depth = depth_of(parent_session) + 1
        if depth > self._config.max_depth:
            raise ToolError(f"subagent depth {depth} exceeds maxDepth {self._config.max_depth}")
        store = ctx.service(SESSIONS)
        label = args.get("description") or declared.name
        child_id = child_session_id(parent_session.id, exec.call_id)
        if waited_on(parent_session.events, exec.call_id, child_id):
            return await self._reattach(declared, parent, exec, child_id)
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
            child.sandbox_cap = child_cap(declared, parent)
            if self._config.budget is not None:
                root_id = self._join_tree(parent_session, child_session)
                child.budget_gate = lambda _turn: self._tree_gate(root_id)
            self._children[child.id] = declared
            try:
                await child.run_turn(args["prompt"], signal=exec.signal)
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
        # The child's log is the answer (its turn/end is the reason run_turn returned).
        output = self._output_of(declared.name)
        return answer_text(declared.name, child_id, child_state(child_session.events, output))

    async def _reattach(
        self, declared: ChildAgentConfig, parent: Any, exec: ToolExecution, child_id: str
    ) -> str:
        """The delegating call dispatched again after its child waited for approvals (D36).

        The child session exists (this call's earlier dispatch created it and its turn ended
        ``awaiting-approval``). While one of its asks is undecided the call waits again;
        once every one is decided the child is resumed under its declared role and continued
        (its decided calls run or are refused, then its model answers); a child somebody
        already continued is read as it ended. Its answer is this call's result.
        """
        ctx = self._ctx
        output = self._output_of(declared.name)
        persistence = ctx.get(SESSION_PERSISTENCE)
        if persistence is None:
            raise ToolError(f"cannot re-attach child session {child_id}: no session store")
        stored = await persistence.inspect(child_id)
        state = child_state(stored.events, output)
        if not state.ended:
            raise ToolError(
                f'sub-agent "{declared.name}" (child session {child_id}) has a turn open '
                f"(another process runs it, or it crashed: `dsh resume {child_id}`); this "
                "delegation cannot re-attach to it now"
            )
        if state.waiting:
            if state.undecided:
                raise ToolCallWaits(
                    unfinished_text(declared.name, child_id, state),
                    session_id=child_id,
                    call_ids=state.undecided,
                )
            options = getattr(parent, "options", None)
            child = await ctx.service(AGENT).resume(
                child_id,
                provider=declared.provider or getattr(options, "provider", None),
                model=declared.model or getattr(options, "model", None),
                max_steps_per_turn=declared.max_steps,
            )
            child.sandbox_cap = child_cap(declared, parent)
            self._children[child.id] = declared
            try:
                await child.continue_turn(signal=exec.signal)
                events = list(child.session.events)
            finally:
                self._children.pop(child.id, None)
                with anyio.CancelScope(shield=True):
                    await child.aclose()  # flushed and detached: the child's end comes first
            state = child_state(events, output)
        return answer_text(declared.name, child_id, state)

    # -- typed output (D34) ---------------------------------------------------------------
    def _output_tool(self, agent: ChildAgentConfig) -> ToolDefinition:
        async def accept(_args: Any, exec: ToolExecution) -> str:
            exec.conclude_turn()  # the answer is given: the child's turn ends here
            return "Output accepted."

        assert agent.output_schema is not None
        return ToolDefinition(
            name=output_tool(agent.name),
            description=(
                "Give your final answer by calling this tool once, with the answer as its "
                "arguments; a plain text reply is not accepted as the answer."
            ),
            parameters=agent.output_schema,
            execute=accept,
            output=text_output(),
        )

    def _output_of(self, name: str) -> str | None:
        declared = self._agents.get(name)
        has_output = declared is not None and declared.output_schema is not None
        return output_tool(name) if has_output else None

    # -- handoff (D34) --------------------------------------------------------------------
    def _handoff_tool(self) -> ToolDefinition:
        names = list(self._config.handoffs)
        catalog = "\n".join(
            f"- {a.name}: {a.description}" for a in self._config.agents if a.name in names
        )
        return ToolDefinition(
            name=HANDOFF_TOOL,
            description=(
                "Hand the rest of this turn to another agent: it takes over this conversation "
                "(it sees everything so far) with its own instructions and tools, and its answer "
                "ends the turn. Call it alone, as the last thing you do. Agents:\n" + catalog
            ),
            parameters={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": names, "description": "who takes over"},
                    "reason": {"type": "string", "description": "why, in one sentence"},
                },
                "required": ["agent"],
                "additionalProperties": False,
            },
            execute=self._handoff,
            output=text_output(),
        )

    async def _handoff(self, args: Any, exec: ToolExecution) -> str:
        target = self._agents.get(args["agent"])
        if target is None or target.name not in self._config.handoffs:
            raise ToolError(f'"{args["agent"]}" is not an agent this turn can be handed to')
        agent = exec.agent
        session = getattr(agent, "session", None)
        if agent is None or session is None:
            raise ToolError("the handoff tool needs a calling agent with a session")
        current = self._declared_for(agent)
        if current is not None and current.name == target.name:
            raise ToolError(f'this turn is already answered by "{target.name}"')
        session.append(
            HANDOFF_EVENT,
            {
                "turn": current_turn(session.events),
                "callId": exec.call_id,
                "from": current.name if current is not None else None,
                "to": target.name,
                "reason": args.get("reason") or "",
            },
            ignorable=True,
        )
        # The record is the handoff: durable before the result, so a resume reads it (D34).
        await self._ctx.service(SESSIONS).flush(session)
        if target.sandbox is not None:
            core: Any = agent  # the loop's agent: it carries the ceiling (D24)
            self._caps_before.setdefault(core.id, getattr(core, "sandbox_cap", None))
            core.sandbox_cap = capped_mode(target.sandbox, core)  # never wider than it was
        return handoff_text(target.name)

    async def _route(
        self, proposal: RequestProposal, next_: Callable[[], Awaitable[LlmCallConfig]]
    ) -> LlmCallConfig:
        """A handoff target's model route for the rest of the turn; the agent's own after."""
        config = await next_()
        agent = proposal.agent
        target = handoff_target(agent.session.events)
        declared = self._agents.get(target) if target is not None else None
        if declared is not None and declared.provider and declared.model:
            self._rerouted.add(agent.id)
            return msgspec.structs.replace(config, provider=declared.provider, model=declared.model)
        if declared is None and agent.id in self._rerouted:
            own = agent.options
            if own.provider and own.model:
                return msgspec.structs.replace(config, provider=own.provider, model=own.model)
        return config

    def _turn_ended(self, ended: TurnEnded) -> None:
        """A handoff lasts one turn (the agent's own ceiling back); so does a tree budget."""
        agent_id = ended.agent.id
        if agent_id in self._caps_before:
            ended.agent.sandbox_cap = self._caps_before.pop(agent_id)
        tree = self._trees.pop(ended.agent.session.id, None)
        if tree is not None:
            for child in tree.children:
                self._root_of.pop(child.id, None)

    # -- the tree budget (D34) ------------------------------------------------------------
    def _join_tree(self, parent_session: Any, child_session: Any) -> str:
        """Add a child to its root's current-turn tree; the root session's id."""
        parent_id: str = parent_session.id
        root_id = self._root_of.get(parent_id, parent_id)
        tree = self._trees.get(root_id)
        if tree is None:  # the first delegation of this root turn (the parent is the root)
            tree = self._trees[root_id] = DelegationTree(
                parent_session, current_turn(parent_session.events)
            )
        tree.children.append(child_session)
        self._root_of[child_session.id] = root_id
        return root_id

    def _tree_gate(self, root_id: str) -> BudgetExceededReason | None:
        """Before a child's model request: the root turn and all descendants, from their logs."""
        budget = self._config.budget
        tree = self._trees.get(root_id)
        if budget is None or tree is None:
            return None
        meter = self._ctx.get(TOKEN_METER)
        if not isinstance(meter, TokenMeter):  # no token-meter row: catalogue prices only
            if self._meter is None:
                self._meter = TokenMeter()
            meter = self._meter
        spent = meter.turn_usage(tree.root).get(tree.turn) or UsageTotals()
        steps = steps_in(tree.root.events, since_turn_start=True)
        for child in tree.children:
            spent = spent.plus(meter.usage(child))
            steps += steps_in(child.events)
        cost = budget.max_cost_usd
        return over_budget(
            "tree",
            spent,
            max_cost_usd=Decimal(str(cost)) if cost is not None else None,
            max_tokens=budget.max_tokens,
            steps=steps,
            max_steps=budget.max_steps,
        )

    # -- what a child sees and may call ---------------------------------------------------
    def _declared_for(self, agent: Any) -> ChildAgentConfig | None:
        """The declared agent answering ``agent``'s turn: a handoff target, else its child role."""
        session = getattr(agent, "session", None)
        if self._config.handoffs and session is not None:
            target = handoff_target(session.events)
            if target is not None and target in self._agents:
                return self._agents[target]
        agent_id = getattr(agent, "id", None)
        return self._children.get(agent_id) if isinstance(agent_id, str) else None

    def _visible(self, agent: Any, declared: ChildAgentConfig | None, tool: str) -> bool:
        owner = self._outputs.get(tool)
        if owner is not None:  # a typed child's output tool: that child's only
            return declared is not None and declared.name == owner
        if tool == TOOL_NAME:
            session = getattr(agent, "session", None)
            if depth_of(session) >= self._config.max_depth:
                return False
        if declared is None:
            return True
        if declared.tools is None:
            return tool not in (TOOL_NAME, HANDOFF_TOOL)
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
        delegations = delegations_in(events)
        handoffs = delegations_in(events, HANDOFF_TOOL)
        recorded = {
            event_fields(event).get("callId") for event in events if event.type == HANDOFF_EVENT
        }
        refined: list[SessionEvent] = []
        for closer in closers:
            data = closer.data
            if (
                closer.type == "tool/result"
                and isinstance(data, ToolResultData)
                and data.message.source.call_id in handoffs
            ):
                call_id = data.message.source.call_id
                closer = handoff_closer(
                    closer, target=handoffs[call_id], recorded=call_id in recorded
                )
            elif (
                closer.type == "tool/result"
                and isinstance(data, ToolResultData)
                and data.message.source.call_id in delegations
            ):
                call_id = data.message.source.call_id
                child_id = child_session_id(session_id, call_id)
                state = None
                if self._config.resume == "continue":
                    state = await self._continue_child(session_id, child_id, delegations[call_id])
                if state is None:
                    state = await self._repair_child(
                        child_id, self._output_of(delegations[call_id])
                    )
                closer = delegation_closer(
                    closer, agent=delegations[call_id], child_id=child_id, state=state
                )
            refined.append(closer)
        return refined

    async def _repair_child(self, child_id: str, output: str | None) -> ChildState | None:
        """Repair the child's own log durably (its children first, through the refiner); its
        state as stored before the repair, None if absent. The agent service's repair also
        announces the closers to ``session/event`` listeners (a trace exporter)."""
        events = await self._ctx.service(AGENT).repair_stored(child_id)
        return None if events is None else child_state(events, output)

    async def _continue_child(
        self, parent_id: str, child_id: str, name: str
    ) -> ChildState | None:
        """``resume: continue``: resume an interrupted child and run it one more turn.

        None when there is nothing to continue (no child, no open turn, an undeclared agent,
        no model service in this boot): the caller then reports the child as before (D24).
        The child is repaired by the agent service's resume (its own children first, each
        continued the same way), then runs :data:`CONTINUE_PROMPT` under its declared route,
        tools and ceiling; it is flushed and closed before the parent's result is written. A
        child that awaits approval with every ask decided (the parent died re-attaching to it,
        D36) applies its decisions instead (``continue_turn``).
        """
        declared = self._agents.get(name)
        persistence = self._ctx.get(SESSION_PERSISTENCE)
        if declared is None or persistence is None or self._ctx.get(LLM) is None:
            return None
        try:
            stored = await persistence.inspect(child_id)
        except SessionNotFoundError:
            return None
        before = child_state(stored.events, self._output_of(name))
        # An open turn is continued; so is a child whose asks were all decided but whose
        # decisions were never applied (the parent died re-attaching to it, D36).
        applicable = before.ended and bool(before.waiting) and not before.undecided
        if not applicable and (not before.started or before.ended):
            return None
        provider, model = declared.provider, declared.model
        if provider is None or model is None:  # the parent's route: the one the child used
            for event in reversed(stored.events):
                if event.type == "request/header":
                    config: Any = getattr(getattr(event.data, "header", None), "config", None)
                    provider = getattr(config, "provider", None)
                    model = getattr(config, "model", None)
                    break
        if not provider or not model:
            return None
        child = await self._ctx.service(AGENT).resume(
            child_id, provider=provider, model=model, max_steps_per_turn=declared.max_steps
        )
        cap = _narrower(declared.sandbox, self._resume_caps.get(parent_id))
        child.sandbox_cap = cap
        if cap is not None:
            self._resume_caps[child_id] = cap
        self._children[child.id] = declared
        try:
            if applicable:
                await child.continue_turn()
            else:
                await child.run_turn(CONTINUE_PROMPT)
            events = list(child.session.events)
        finally:
            self._children.pop(child.id, None)
            self._resume_caps.pop(child_id, None)
            with anyio.CancelScope(shield=True):
                await child.aclose()  # flushed and detached: the child's end is durable first
        return child_state(events, self._output_of(name))


def _narrower(mode: str | None, cap: str | None) -> Any:
    """The narrower of two sandbox modes (None: no mode)."""
    if mode is None or cap is None:
        return mode or cap
    return mode if SANDBOX_ORDER.index(mode) <= SANDBOX_ORDER.index(cap) else cap
