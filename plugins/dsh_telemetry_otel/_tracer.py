"""Spans from session events: one place that turns a log into a trace, live or after the fact.

:class:`SessionTracer` is fed a session's events in log order (``feed``) and opens and ends
OpenTelemetry spans at the events' own times:

- ``invoke_agent`` for a turn (``turn/start`` .. ``turn/end``), the root of its trace;
- ``chat`` for each model request (``step/start`` .. the step's ``assistant/message``, or a
  failed ``assistant/attempt``), with the route (from the last ``request/header``), usage and
  finish reason; ``llm/retry`` events
  become span events of the request they retry;
- ``execute_tool`` for each call (``tool/call`` .. ``tool/result``), with its outcome, the
  approval trail and, for a result the crash repair wrote, ``error.type``
  ``TOOL_OUTCOME_UNKNOWN`` or ``TOOL_NOT_STARTED``;
- ``compaction`` for each compaction (``compaction/start`` .. ``compaction/end``), with the
  summary request's route, usage and cost and the tokens it shadowed: a child of its turn's
  span when automatic, the root of a trace of its own when manual (``/compact``: no turn).

With a meter (the OpenTelemetry metrics API), each ended ``chat``, ``execute_tool`` and
``compaction`` span also records ``gen_ai.client.operation.duration`` (s), each priced answer
``gen_ai.client.token.usage`` (by ``gen_ai.token.type``) and ``dsh.cost.usd``: the GenAI
client metrics, from the same events, so a crash-repaired turn counts what the log says.

A turn the process never closed (no ``turn/end`` yet) stays open until its closers arrive:
``dsh resume`` appends them, and they are exported then, so the trace shows what the log says
happened. Nothing is derived from memory that the log does not hold, which is why the same
class serves the live plugin and ``dsh sessions export-otel``.

Span and trace ids are derived from the session id and the sequence number of the event that
opened the span (:class:`LogIds`), so exporting a session twice (live, then again after the
fact) gives the same ids and a backend can deduplicate.

A sub-agent's session (its log opens with a ``dsh-subagents/delegation`` event naming the
parent session, the delegating call, the call's ``tool/call`` seq and the top-level session and
turn the delegation tree started from) has its ``invoke_agent`` span parented to that call's
``execute_tool`` span, in the top-level turn's trace: both ids are computed from the log as the
ancestors' tracers computed them, so the link holds live, after the fact and for a child
exported alone (D30).

Attribute names follow the OpenTelemetry GenAI semantic conventions as published with
``opentelemetry-semantic-conventions`` 0.66b (GenAI spans, conventions 1.37+:
``gen_ai.provider.name``, ``gen_ai.operation.name``, ``gen_ai.usage.*``). Message content and
tool arguments are recorded only when ``capture_content`` is set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import msgspec
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)

from dsh_host.sdk import DELEGATION_EVENT, DelegationLink, PriceTable, TokenUsage, delegation_link

__all__ = ["FINISH_REASONS", "LogIds", "SessionTracer"]

#: dsh's finish kinds as GenAI finish reasons.
FINISH_REASONS: Final[Mapping[str, str]] = {
    "stop": "stop",
    "tool-calls": "tool_calls",
    "max-tokens": "length",
    "aborted": "cancelled",
    "error": "error",
}
#: Turn ends that are not a success (the span's status is ERROR with the kind as error.type).
_FAILED_TURNS: Final = frozenset({"error", "interrupted", "aborted", "blocked", "max-tokens"})


def _ns(ms: Any) -> int:
    return int(ms) * 1_000_000


class LogIds(IdGenerator):
    """Trace and span ids derived from the log instead of drawn at random.

    Before starting a span the tracer names what opens it (:meth:`next`); the SDK then asks for
    the ids and gets ``sha256(session id, what)`` cut to size. A span started without a name
    (another library's) gets random ids as usual.
    """

    def __init__(self) -> None:
        self._trace: int | None = None
        self._span: int | None = None

    @staticmethod
    def _digest(*parts: str) -> bytes:
        return hashlib.sha256("\0".join(parts).encode()).digest()

    @classmethod
    def trace_id(cls, session_id: str, turn: int | str) -> int:
        """The trace of turn ``turn`` of ``session_id``."""
        return int.from_bytes(cls._digest(session_id, str(turn))[:16], "big") or 1

    @classmethod
    def span_id(cls, session_id: str, opened_by: str) -> int:
        """The span ``opened_by`` (``seq:N``, the event that opened it) of ``session_id``."""
        return int.from_bytes(cls._digest(session_id, opened_by)[:8], "big") or 1

    def next(self, session_id: str, turn: int | str, opened_by: str) -> None:
        self._trace = self.trace_id(session_id, turn)
        self._span = self.span_id(session_id, opened_by)

    def generate_trace_id(self) -> int:
        value, self._trace = self._trace, None
        return value if value is not None else RandomIdGenerator().generate_trace_id()

    def generate_span_id(self) -> int:
        value, self._span = self._span, None
        return value if value is not None else RandomIdGenerator().generate_span_id()


@dataclass
class _Turn:
    number: int
    span: Span
    chat: Span | None = None
    chat_step: int | None = None
    tools: dict[str, Span] = field(default_factory=dict)


@dataclass
class _Compaction:
    span: Span
    start_ms: int
    #: the turn it belongs to (None: a manual compaction, its own trace)
    turn: int | None


class _Instruments:
    """The GenAI client metrics (semantic conventions' names and units) and dsh's cost."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration",
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Measures number of input and output tokens used",
        )
        self.cost = meter.create_counter(
            "dsh.cost.usd", unit="USD", description="Model spend priced from the session log",
        )


#: ``(parent session id, call id) ->`` the parent's ``execute_tool`` span of that call, or None.
CallLocator = Callable[[str, str], "SpanContext | None"]


class SessionTracer:
    """The spans of one session, built as its events arrive (see the module docstring)."""

    def __init__(
        self,
        tracer: Tracer,
        ids: LogIds,
        session_id: str,
        *,
        agent_name: str = "dsh",
        capture_content: bool = False,
        prices: PriceTable | None = None,
        meter: metrics.Meter | None = None,
        locate_call: CallLocator | None = None,
    ) -> None:
        self._tracer = tracer
        self._metrics = None if meter is None else _Instruments(meter)
        #: start time (ms) of each open span, for its duration metric
        self._started: dict[int, int] = {}
        self._compaction: _Compaction | None = None
        #: prices each answer's usage as ``dsh.cost.usd`` (the GenAI conventions define no cost
        #: attribute); an unpriced model gets none, never a 0
        self._prices = prices
        self._ids = ids
        self._session_id = session_id
        self._agent_name = agent_name
        self._capture = capture_content
        self._turn: _Turn | None = None
        #: a sub-agent session's link to its delegating call (its ``dsh-subagents/delegation``
        #: event): its turns are children of that call's ``execute_tool`` span (D30)
        self._link: DelegationLink | None = None
        #: finds the delegating call's span among the parent's for a link that does not say
        #: where it is (a child written before D30, exported with its parent)
        self._locate_call = locate_call
        #: call id -> its execute_tool span's context, kept only when asked (``remember_calls``:
        #: an export whose children may need them), never live
        self.call_spans: dict[str, SpanContext] | None = None
        #: the route of the last ``request/header`` (later steps reuse it until it changes)
        self._provider: str | None = None
        self._model: str | None = None
        #: spans ended so far, by operation (what a caller reports: "3 invoke_agent ...")
        self.counts: dict[str, int] = {
            "invoke_agent": 0, "chat": 0, "execute_tool": 0, "compaction": 0,
        }

    @property
    def in_turn(self) -> bool:
        """A turn's span is open (its ``turn/start`` was fed, its ``turn/end`` not yet)."""
        return self._turn is not None

    # -- feeding ----------------------------------------------------------------------
    def feed(self, event: Mapping[str, Any]) -> None:
        """One event in wire form (``{"type", "seq", "time", "data"}``), in log order."""
        kind = event.get("type")
        data = event.get("data")
        if not isinstance(data, Mapping):
            return
        handler = self._HANDLERS.get(str(kind))
        if handler is not None:
            handler(self, event, data)

    def close(self, time_ms: int | None = None) -> None:
        """End what is still open (a turn still running when the exporter stops): the spans
        are marked ``dsh.open`` so a reader knows the log had not closed them yet."""
        end = None if time_ms is None else _ns(time_ms)
        compaction, self._compaction = self._compaction, None
        if compaction is not None:
            compaction.span.set_attribute("dsh.open", True)
            compaction.span.end(end_time=end)
        turn = self._turn
        if turn is None:
            return
        for span in [*turn.tools.values(), *([turn.chat] if turn.chat else []), turn.span]:
            span.set_attribute("dsh.open", True)
            span.end(end_time=end)
        self._turn = None

    # -- spans ------------------------------------------------------------------------
    def _start(
        self,
        name: str,
        event: Mapping[str, Any],
        turn: int | str,
        parent_span: Span | None = None,
        /,
        **attributes: Any,
    ) -> Span:
        self._ids.next(self._session_id, turn, f"seq:{event.get('seq')}")
        if parent_span is None and self._turn is not None:
            parent_span = self._turn.span
        parent = None if parent_span is None else trace.set_span_in_context(parent_span)
        span: Span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL if name.startswith("invoke_agent") else SpanKind.CLIENT,
            start_time=_ns(event.get("time", 0)),
            attributes={
                "gen_ai.conversation.id": self._session_id,
                "dsh.seq": int(event.get("seq", -1)),
                **{k: v for k, v in attributes.items() if v is not None},
            },
        )
        self._started[id(span)] = int(event.get("time", 0))
        return span

    def _end(self, operation: str, span: Span, event: Mapping[str, Any]) -> None:
        span.set_attribute("dsh.end_seq", int(event.get("seq", -1)))
        end_ms = int(event.get("time", 0))
        span.end(end_time=_ns(end_ms))
        self.counts[operation] += 1
        started = self._started.pop(id(span), None)
        if self._metrics is not None and started is not None and operation != "invoke_agent":
            attributes: dict[str, str] = {"gen_ai.operation.name": operation}
            if operation != "execute_tool":
                attributes.update(self._route())
            error = getattr(span, "attributes", {}).get("error.type")
            if error is not None:
                attributes["error.type"] = str(error)
            self._metrics.duration.record(max(0, end_ms - started) / 1000, attributes)

    def _route(self, source: object = None) -> dict[str, str]:
        provider, model = self._provider, self._model
        if isinstance(source, Mapping):
            provider = str(source.get("provider") or provider or "") or None
            model = str(source.get("model") or model or "") or None
        route = {}
        if provider:
            route["gen_ai.provider.name"] = provider
        if model:
            route["gen_ai.request.model"] = model
        return route

    def _record_usage(
        self, operation: str, source: object, usage: Mapping[str, Any], cost: Decimal | None
    ) -> None:
        if self._metrics is None:
            return
        attributes = {"gen_ai.operation.name": operation, **self._route(source)}
        cached = int(usage.get("cacheReadTokens", 0)) + int(usage.get("cacheWriteTokens", 0))
        inputs = int(usage.get("inputTokens", 0)) + cached
        self._metrics.tokens.record(inputs, {**attributes, "gen_ai.token.type": "input"})
        self._metrics.tokens.record(
            int(usage.get("outputTokens", 0)), {**attributes, "gen_ai.token.type": "output"}
        )
        if cost is not None:
            self._metrics.cost.add(float(cost), attributes)

    def link_to(self, link: DelegationLink | None) -> None:
        """This session is a sub-agent's (``link`` read from its log, D30): its turns become
        children of the delegating call's span. What the delegation event does when fed."""
        self._link = link

    def _delegation(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        self.link_to(delegation_link(event))

    def _delegating_span(self) -> Span | None:
        """The parent's ``execute_tool`` span of the delegating call, as a remote parent: its
        ids are computed the way the parent's own tracer computed them (the parent's session
        id, turn and ``tool/call`` seq), so no tracer needs the other's memory."""
        link = self._link
        if link is None:
            return None
        context: SpanContext | None = None
        seq, root, root_turn = link.parent_call_seq, link.root_session, link.root_turn
        if seq is not None and root is not None and root_turn is not None:
            context = SpanContext(
                trace_id=LogIds.trace_id(root, root_turn),  # the top-level turn's trace
                span_id=LogIds.span_id(link.parent_session, f"seq:{seq}"),
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        elif self._locate_call is not None:
            context = self._locate_call(link.parent_session, link.call_id)
        return None if context is None else NonRecordingSpan(context)

    def _turn_start(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        if self._turn is not None:  # a turn/start without the previous turn/end: close it
            self.close(int(event.get("time", 0)))
        number = int(data.get("turn", 0))
        self._turn = None
        link = self._link
        agent = link.agent if link is not None and link.agent else self._agent_name
        span = self._start(
            f"invoke_agent {agent}",
            event,
            number,
            self._delegating_span(),
            **{
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "dsh.turn": number,
                "dsh.parent.session_id": None if link is None else link.parent_session,
                "dsh.parent.call_id": None if link is None else link.call_id,
            },
        )
        self._turn = _Turn(number, span)

    def _turn_end(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        if turn is None:
            return
        reason = data.get("reason")
        kind = str(reason.get("kind")) if isinstance(reason, Mapping) else "unknown"
        # spans the turn left open (a crash): the closers end them here, as the log does
        compaction = self._compaction
        if compaction is not None and compaction.turn == turn.number:
            self._compaction = None
            compaction.span.set_status(
                Status(StatusCode.ERROR, f"the turn ended {kind} before it did")
            )
            compaction.span.set_attribute("error.type", kind)
            self._end("compaction", compaction.span, event)
        for span in [*turn.tools.values(), *([turn.chat] if turn.chat else [])]:
            span.set_status(Status(StatusCode.ERROR, f"the turn ended {kind} before it did"))
            span.set_attribute("error.type", kind)
            self._end("execute_tool" if span is not turn.chat else "chat", span, event)
        turn.span.set_attribute("dsh.turn.end", kind)
        if kind in _FAILED_TURNS:
            turn.span.set_attribute("error.type", kind)
            message = reason.get("message") if isinstance(reason, Mapping) else None
            turn.span.set_status(Status(StatusCode.ERROR, str(message or kind)))
        self._end("invoke_agent", turn.span, event)
        self._turn = None

    def _step(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """A step makes one model request: its span opens here, named by the route in force
        (``request/header`` is logged only when the header changes, so it may not follow)."""
        turn = self._turn
        if turn is None:
            return
        if turn.chat is not None:  # a step begun before the last answered: end the old one
            self._end("chat", turn.chat, event)
        turn.chat = self._start(
            f"chat {self._model}" if self._model else "chat",
            event,
            turn.number,
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self._provider,
                "gen_ai.request.model": self._model,
                "dsh.step": int(data.get("step", 0)),
            },
        )

    def _request(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        header = data.get("header")
        config = header.get("config") if isinstance(header, Mapping) else None
        config = config if isinstance(config, Mapping) else {}
        self._provider = str(config["provider"]) if config.get("provider") else None
        self._model = str(config["model"]) if config.get("model") else None
        turn = self._turn
        if turn is None or turn.chat is None:
            return
        span = turn.chat
        if self._model:
            span.update_name(f"chat {self._model}")
            span.set_attribute("gen_ai.request.model", self._model)
        if self._provider:
            span.set_attribute("gen_ai.provider.name", self._provider)
        if config.get("maxTokens") is not None:
            span.set_attribute("gen_ai.request.max_tokens", int(config["maxTokens"]))
        if self._capture and isinstance(header, Mapping) and header.get("tools") is not None:
            span.set_attribute("gen_ai.tool.definitions", json.dumps(header["tools"]))

    def _cost(self, source: object, usage: Mapping[str, Any]) -> Decimal | None:
        if self._prices is None:
            return None
        provider, model = self._provider, self._model
        if isinstance(source, Mapping):
            provider = str(source.get("provider") or provider or "") or None
            model = str(source.get("model") or model or "") or None
        try:
            typed = msgspec.convert(usage, TokenUsage)
        except msgspec.ValidationError:
            return None
        return self._prices.cost(provider, model, typed)

    def _answer(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        if turn is None or turn.chat is None:
            return
        span, turn.chat = turn.chat, None
        message = data.get("message")
        source = message.get("source") if isinstance(message, Mapping) else None
        if isinstance(source, Mapping) and source.get("model"):
            span.set_attribute("gen_ai.response.model", str(source["model"]))
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            cached = int(usage.get("cacheReadTokens", 0))
            span.set_attribute(
                "gen_ai.usage.input_tokens", int(usage.get("inputTokens", 0)) + cached
            )
            span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("outputTokens", 0)))
            if cached:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
            if usage.get("cacheWriteTokens"):
                span.set_attribute(
                    "gen_ai.usage.cache_creation.input_tokens", int(usage["cacheWriteTokens"])
                )
            if usage.get("reasoningTokens"):
                span.set_attribute(
                    "gen_ai.usage.reasoning.output_tokens", int(usage["reasoningTokens"])
                )
            cost = self._cost(source, usage)
            if cost is not None:
                span.set_attribute("dsh.cost.usd", float(cost))
            self._record_usage("chat", source, usage, cost)
        finish = _finish_kind(data.get("stream"))
        if finish is not None:
            span.set_attribute(
                "gen_ai.response.finish_reasons", [FINISH_REASONS.get(finish, finish)]
            )
        if data.get("interrupted") is True:
            span.set_attribute("error.type", "cancelled")
            span.set_status(Status(StatusCode.ERROR, "the step was cancelled mid-stream"))
        if self._capture and isinstance(message, Mapping):
            span.set_attribute("gen_ai.output.messages", json.dumps([message]))
        self._end("chat", span, event)

    def _attempt(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """A failed model attempt: the request ends in error (a retry opens the next one)."""
        turn = self._turn
        if turn is None or turn.chat is None:
            return
        span, turn.chat = turn.chat, None
        failure = _finish_failure(data.get("stream"))
        code = str(failure.get("code")) if failure else "error"
        span.set_attribute("error.type", code)
        span.set_status(Status(StatusCode.ERROR, str(failure.get("message")) if failure else code))
        self._end("chat", span, event)

    def _retry(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        if turn is None:
            return
        failure = data.get("failure")
        attributes: dict[str, str | int | float] = {
            "dsh.retry": int(data.get("retry", 0)),
            "dsh.retry.delay_ms": float(data.get("delayMs", 0)),
        }
        if isinstance(failure, Mapping) and failure.get("code"):
            attributes["error.type"] = str(failure["code"])
        turn.span.add_event("gen_ai.retry", attributes, timestamp=_ns(event.get("time", 0)))

    def _call(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        if turn is None:
            return
        name = str(data.get("name", ""))
        call_id = str(data.get("callId", ""))
        span = self._start(
            f"execute_tool {name}",
            event,
            turn.number,
            **{
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            },
        )
        if self._capture:
            span.set_attribute("gen_ai.tool.call.arguments", str(data.get("arguments", "")))
        turn.tools[call_id] = span
        if self.call_spans is not None:
            self.call_spans[call_id] = span.get_span_context()

    def _approval(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        span = None if turn is None else turn.tools.get(str(data.get("callId", "")))
        if span is None:
            return
        if event.get("type") == "approval/asked":
            span.set_attribute("dsh.approval.asked", True)
        else:
            span.set_attribute("dsh.approval.outcome", str(data.get("outcome", "")))
            if data.get("decidedBy"):
                span.set_attribute("dsh.approval.decided_by", str(data["decidedBy"]))

    def _result(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        message = data.get("message")
        source = message.get("source") if isinstance(message, Mapping) else None
        call_id = str(source.get("callId", "")) if isinstance(source, Mapping) else ""
        span = None if turn is None else turn.tools.pop(call_id, None)
        if span is None:
            return
        error = data.get("error")
        blocks = message.get("content") if isinstance(message, Mapping) else None
        failed = any(isinstance(b, Mapping) and b.get("isError") for b in (blocks or ()))
        if isinstance(error, Mapping) or failed:
            code = str(error.get("code")) if isinstance(error, Mapping) else "tool_error"
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, code))
        if self._capture and blocks:
            span.set_attribute("gen_ai.tool.call.result", json.dumps(blocks))
        self._end("execute_tool", span, event)

    def _compaction_start(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        turn = self._turn
        number = data.get("turn")
        automatic = isinstance(number, int) and turn is not None and turn.number == number
        if self._compaction is not None:  # a start without the previous end: close it open
            self._compaction.span.set_attribute("dsh.open", True)
            self._end("compaction", self._compaction.span, event)
            self._compaction = None
        compaction_id = str(data.get("compactionId", ""))
        outer = self._turn
        if not automatic:
            self._turn = None  # a manual compaction is the root of its own trace
        try:
            span = self._start(
                "compaction",
                event,
                number if automatic and isinstance(number, int) else f"compaction:{compaction_id}",
                **{
                    "gen_ai.operation.name": "compaction",
                    "dsh.compaction.id": compaction_id,
                    "dsh.compaction.trigger": "automatic" if automatic else "manual",
                    "dsh.turn": number if automatic else None,
                },
            )
        finally:
            self._turn = outer
        self._compaction = _Compaction(
            span, int(event.get("time", 0)), number if automatic else None
        )

    def _compaction_summary(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        compaction = self._compaction
        if compaction is None:
            return
        span = compaction.span
        source = {"provider": data.get("provider"), "model": data.get("model")}
        for key, attribute in (("provider", "gen_ai.provider.name"),
                               ("model", "gen_ai.request.model")):
            if data.get(key):
                span.set_attribute(attribute, str(data[key]))
        if isinstance(data.get("shadowedTokenCount"), int):
            span.set_attribute("dsh.compaction.shadowed_tokens", int(data["shadowedTokenCount"]))
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            cached = int(usage.get("cacheReadTokens", 0))
            span.set_attribute(
                "gen_ai.usage.input_tokens", int(usage.get("inputTokens", 0)) + cached
            )
            span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("outputTokens", 0)))
            cost = self._cost(source, usage)
            if cost is not None:
                span.set_attribute("dsh.cost.usd", float(cost))
            self._record_usage("compaction", source, usage, cost)

    def _compaction_end(self, event: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        compaction, self._compaction = self._compaction, None
        if compaction is None:
            return
        error = data.get("error")
        if error:
            compaction.span.set_attribute("error.type", "compaction_failed")
            compaction.span.set_status(Status(StatusCode.ERROR, str(error)))
        self._end("compaction", compaction.span, event)

    _HANDLERS: Final = {
        DELEGATION_EVENT: _delegation,
        "compaction/start": _compaction_start,
        "compaction/summary": _compaction_summary,
        "compaction/end": _compaction_end,
        "turn/start": _turn_start,
        "turn/end": _turn_end,
        "step/start": _step,
        "llm/retry-started": _step,  # a retried request is a request of its own
        "request/header": _request,
        "assistant/message": _answer,
        "assistant/attempt": _attempt,
        "llm/retry": _retry,
        "tool/call": _call,
        "approval/asked": _approval,
        "approval/decided": _approval,
        "tool/result": _result,
    }


def _chunks(stream: Any) -> list[Mapping[str, Any]]:
    if not isinstance(stream, (list, tuple)):
        return []
    return [
        record["chunk"]
        for record in stream
        if isinstance(record, Mapping) and isinstance(record.get("chunk"), Mapping)
    ]


def _finish_kind(stream: Any) -> str | None:
    for chunk in reversed(_chunks(stream)):
        if chunk.get("type") == "finish":
            reason = chunk.get("reason")
            return str(reason.get("kind")) if isinstance(reason, Mapping) else None
    return None


def _finish_failure(stream: Any) -> Mapping[str, Any] | None:
    for chunk in reversed(_chunks(stream)):
        if chunk.get("type") == "finish":
            reason = chunk.get("reason")
            failure = reason.get("failure") if isinstance(reason, Mapping) else None
            return failure if isinstance(failure, Mapping) else None
    return None
