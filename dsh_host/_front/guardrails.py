"""Guardrails in the front door: ``@input_guardrail``, ``@output_guardrail``, ``@tool_guardrail``.

The OpenAI Agents SDK's names and shape: a guardrail is a function returning a
:class:`GuardrailFunctionOutput` (``tripwire_triggered``, ``output_info``), or simply a bool
(True trips), sync or async. ``Agent(guardrails=[...])`` takes any mix of the three kinds. Each
maps onto one chain every path crosses, so no second copy of a check exists:

- an **input** guardrail runs on the prompt at ``agent/pre-step`` (step 1): a tripwire rejects
  the step, so the model is never asked and the turn ends ``blocked``;
- a **tool** guardrail runs on each call at ``tools/pre-execute``, which the tools runtime
  crosses before the ``tools/execute`` chain (where the checkpoint policy makes the call durable
  and the body runs): a tripped call is denied with the guardrail's reason, its body never runs.
  Before the guardrails deliberate, a ``guardrail/asked`` gate is appended and the log flushed,
  so a crash inside a slow guardrail resumes as ``TOOL_NOT_STARTED`` (D23);
- an **output** guardrail runs on the turn's final text at ``agent/turn-stopping``: the text
  has been produced and logged (the log never pretends otherwise), the tripwire is recorded.

Every verdict, tripped or not, is appended to the session as a ``guardrail/verdict`` event
(``ignorable``: DSH reads past it). When a turn tripped a guardrail, ``Agent.run`` raises
:class:`GuardrailTripwireTriggered` after the log is flushed; the SDK's own behaviour, so a
caller cannot mistake a blocked answer for a result. dsh keeps its turn-end kinds (``blocked``
for a tripped input) rather than add one DSH's log format does not have.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from dsh_host._agent.keys import AGENT_PRE_STEP, AGENT_TURN_STOPPING
from dsh_host._agent.types import PreStepContext, PreStepDecision, Reject, TurnStoppingContext
from dsh_host._context import Context
from dsh_host._session.events.data import AssistantMessageData
from dsh_host._session.keys import SESSIONS
from dsh_host._session.messages import TextBlock
from dsh_host._session.repair import GUARDRAIL_GATE_EVENT, GUARDRAIL_VERDICT_EVENT
from dsh_host._tools.keys import TOOLS_PRE_EXECUTE
from dsh_host._tools.types import Deny, PreToolDecision, ToolExecution
from dsh_host.errors import ConfigError, DshError

__all__ = [
    "GUARDRAIL_EVENT",
    "Guardrail",
    "GuardrailFunctionOutput",
    "GuardrailTripwireTriggered",
    "ToolCallData",
    "input_guardrail",
    "output_guardrail",
    "tool_guardrail",
]

#: The log event of one verdict (not a DSH type: written ``ignorable``).
GUARDRAIL_EVENT = GUARDRAIL_VERDICT_EVENT

Kind: TypeAlias = Literal["input", "output", "tool"]


@dataclass(frozen=True, slots=True)
class GuardrailFunctionOutput:
    """What a guardrail returns (the SDK's name): trip or not, and anything to keep."""

    tripwire_triggered: bool
    output_info: Any = None
    #: what the model (tool guardrail) or the caller reads when it trips
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallData:
    """What a tool guardrail sees: the call as the model asked for it."""

    name: str
    arguments: Any
    call_id: str


GuardrailFunction: TypeAlias = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Guardrail:
    """A decorated guardrail function and its kind."""

    kind: Kind
    name: str
    function: GuardrailFunction

    async def check(self, subject: Any) -> GuardrailFunctionOutput:
        """The verdict; a guardrail that raises or answers something else trips (fail closed:
        a check that could not say "pass" does not let the input, call or answer through)."""
        try:
            answer = self.function(subject)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}"
        else:
            if isinstance(answer, GuardrailFunctionOutput):
                return answer
            if isinstance(answer, bool):
                return GuardrailFunctionOutput(tripwire_triggered=answer)
            problem = (
                f"returned {answer!r}; return a GuardrailFunctionOutput or a bool (True trips "
                "the wire)"
            )
        reason = f"{self.kind} guardrail {self.name!r} {problem}"
        return GuardrailFunctionOutput(tripwire_triggered=True, reason=reason)


class GuardrailTripwireTriggered(DshError):
    """A guardrail tripped during the turn; ``verdict`` says which, ``result`` how it ended."""

    code = "GUARDRAIL_TRIPWIRE"

    def __init__(self, kind: Kind, name: str, output: GuardrailFunctionOutput, result: Any) -> None:
        why = f": {output.reason}" if output.reason else ""
        super().__init__(f"{kind} guardrail {name!r} tripped{why}")
        self.kind = kind
        self.name = name
        self.output = output
        self.result = result


def _decorator(kind: Kind) -> Callable[..., Any]:
    def decorate(
        function: GuardrailFunction | None = None, *, name: str | None = None
    ) -> Guardrail | Callable[[GuardrailFunction], Guardrail]:
        def wrap(fn: GuardrailFunction) -> Guardrail:
            if not callable(fn):
                raise ConfigError(f"@{kind}_guardrail decorates a function, not {fn!r}")
            label = name or str(getattr(fn, "__name__", kind))
            return Guardrail(kind, label, fn)

        return wrap(function) if function is not None else wrap

    return decorate


#: ``@input_guardrail``: ``fn(prompt: str) -> GuardrailFunctionOutput | bool``
input_guardrail = _decorator("input")
#: ``@output_guardrail``: ``fn(final_text: str) -> GuardrailFunctionOutput | bool``
output_guardrail = _decorator("output")
#: ``@tool_guardrail``: ``fn(call: ToolCallData) -> GuardrailFunctionOutput | bool``
tool_guardrail = _decorator("tool")


@dataclass(slots=True)
class Guardrails:
    """The guardrails of one front-door agent, installed on its host's chains."""

    items: Sequence[Guardrail]
    #: agent -> (turn, first tripped verdict) of the turn a guardrail tripped
    tripped: weakref.WeakKeyDictionary[Any, tuple[int, Guardrail, GuardrailFunctionOutput]] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def __post_init__(self) -> None:
        for item in self.items:
            if not isinstance(item, Guardrail):
                raise ConfigError(
                    "Agent(guardrails=...) takes functions decorated with @input_guardrail, "
                    f"@output_guardrail or @tool_guardrail, not {item!r}"
                )

    def of(self, kind: Kind) -> list[Guardrail]:
        return [g for g in self.items if g.kind == kind]

    async def _run(
        self, kind: Kind, agent: Any, turn: int, subject: Any, call_id: str | None = None
    ) -> tuple[Guardrail, GuardrailFunctionOutput] | None:
        """Run ``kind``'s guardrails in order, log each verdict; the first tripped one."""
        for guardrail in self.of(kind):
            output = await guardrail.check(subject)
            verdict: dict[str, Any] = {
                "turn": turn,
                "kind": kind,
                "name": guardrail.name,
                "tripwireTriggered": output.tripwire_triggered,
            }
            if output.reason is not None:
                verdict["reason"] = output.reason
            if call_id is not None:
                verdict["callId"] = call_id
            session = getattr(agent, "session", None)
            if session is not None:
                session.append(GUARDRAIL_EVENT, verdict, ignorable=True)
            if output.tripwire_triggered:
                if agent is not None and agent not in self.tripped:
                    self.tripped[agent] = (turn, guardrail, output)
                return guardrail, output
        return None

    async def _gate(self, ctx: Context, agent: Any, turn: int, call_id: str) -> None:
        """Make the call and its guardrail gate durable before a guardrail deliberates (D23
        in docs/decisions.md): a process killed inside a slow guardrail leaves a durable
        ``tool/call`` and a ``guardrail/asked`` no verdict passed, so resume closes the call
        ``TOOL_NOT_STARTED`` instead of knowing nothing of it."""
        session = getattr(agent, "session", None)
        if session is None:
            return
        names = [g.name for g in self.of("tool")]
        gate = {"turn": turn, "callId": call_id, "guardrails": names}
        session.append(GUARDRAIL_GATE_EVENT, gate, ignorable=True)
        sessions = ctx.get(SESSIONS)
        if sessions is not None:
            await sessions.flush(session)

    def take(self, agent: Any, turn: int) -> tuple[Guardrail, GuardrailFunctionOutput] | None:
        """The tripped verdict of ``agent``'s ``turn`` (forgotten once taken)."""
        entry = self.tripped.pop(agent, None)
        if entry is None or entry[0] != turn:
            return None
        return entry[1], entry[2]

    def install(self, ctx: Context, ours: Callable[[Any], bool]) -> None:
        """Register the listeners a kind needs; ``ours(agent)`` limits them to this agent."""
        if self.of("input"):

            async def pre_step(
                step: PreStepContext, next_: Callable[[], Awaitable[PreStepDecision]]
            ) -> PreStepDecision:
                if step.step == 1 and ours(step.agent):
                    prompt = "\n".join(
                        block.text
                        for message in step.messages
                        for block in message.content
                        if isinstance(block, TextBlock)
                    )
                    if await self._run("input", step.agent, step.turn, prompt) is not None:
                        return Reject()
                return await next_()

            ctx.on(AGENT_PRE_STEP, pre_step)
        if self.of("tool"):

            async def pre_execute(
                execution: ToolExecution, next_: Callable[[], Awaitable[PreToolDecision]]
            ) -> PreToolDecision:
                agent = execution.agent
                if ours(agent):
                    call = ToolCallData(execution.name, execution.arguments, execution.call_id)
                    turn = int(getattr(agent, "last_turn", 0) or 0)
                    await self._gate(ctx, agent, turn, execution.call_id)
                    hit = await self._run("tool", agent, turn, call, execution.call_id)
                    if hit is not None:
                        guardrail, output = hit
                        return Deny(
                            output.reason or f"blocked by tool guardrail {guardrail.name!r}"
                        )
                return await next_()

            ctx.on(TOOLS_PRE_EXECUTE, pre_execute, prepend=True)
        if self.of("output"):

            async def turn_stopping(stopping: TurnStoppingContext) -> None:
                if not ours(stopping.agent):
                    return
                text = _last_text(stopping.agent)
                await self._run("output", stopping.agent, stopping.turn, text)

            ctx.on(AGENT_TURN_STOPPING, turn_stopping)


def _last_text(agent: Any) -> str:
    """The text of the session's last assistant message (the answer the turn ends with)."""
    for event in reversed(agent.session.events):
        data = event.data
        if isinstance(data, AssistantMessageData):
            return "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
    return ""
