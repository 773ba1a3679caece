"""Replay-aware token measurement: the ``tokenMeter`` service a ``token-meter`` row provides.

DSH ``dsh-token-meter``. One service, one isolated fold per session, advanced from the durable
log only (the vocabulary lives in the core so compaction plugins can share it):

- :meth:`TokenMeter.measure` prices the next request: the newest provider usage when the
  latest successful call's canonical request envelope still matches, plus a signed heuristic
  delta for everything the surface gained or lost since (a compaction makes it negative);
  otherwise the whole envelope and surface priced by the fixed heuristic. It also returns the
  priced surface nodes, in model order, that compaction plans against.
- :meth:`TokenMeter.usage` sums the logged provider usage per turn and for the session
  (disjoint uncached-input, output, cache-read and cache-write buckets; reasoning is a part of
  output and is not added again). Failed attempts that reported usage count too: they were
  billed.
- Every call that reported usage is priced in US dollars (:mod:`dsh_host._session.prices`):
  :meth:`TokenMeter.requests` lists each one (a reply, a failed attempt or a compaction
  summary) with its cost, and the totals carry the sum. A call whose model has no known price
  is counted as unpriced, so a total is only a known cost when no call was unpriced.
- :meth:`TokenMeter.pressure` is the context pressure of the current surface against the
  routed model's context window (the newest ``request/context`` record, which the loop writes
  from the adapter's model metadata).

The heuristic has no settings (DSH's): four characters per token plus structural overhead.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET

from dsh_host._jsonsafe import json_enc_hook
from dsh_host._session.events import (
    AssistantMessageData,
    ReplaceOp,
    RequestContextData,
    RequestHeaderData,
    SessionEvent,
)
from dsh_host._session.messages import (
    ContentBlock,
    EpochHeader,
    ImageBlock,
    Message,
    ReasoningBlock,
    TextBlock,
    TokenUsage,
    ToolCallBlock,
    ToolResultBlock,
)
from dsh_host._session.prices import PriceTable
from dsh_host._session.request_header import canonical_header, headers_equal
from dsh_host._session.session import LogView, Session, derive_event_message
from dsh_host._session.usage import RequestCost, UsageLedger, UsageTotals

__all__ = [
    "BLOCK_OVERHEAD",
    "CHARS_PER_TOKEN",
    "ROLE_OVERHEAD",
    "ContextPressure",
    "RequestCost",
    "TokenMeasurement",
    "TokenMeter",
    "TokenSurfaceNode",
    "UsageLedger",
    "UsageTotals",
    "WalkedLog",
    "estimate_content",
    "estimate_header",
    "estimate_message",
    "turn_usage",
    "usage_total",
]

#: Fixed text density of the estimate (DSH's).
CHARS_PER_TOKEN: Final = 4
#: Per-block structural overhead (JSON framing, type tags).
BLOCK_OVERHEAD: Final = 4
#: Role-field framing added to every priced message.
ROLE_OVERHEAD: Final = 4
#: An image, whatever its encoded size: providers price images by pixels (Anthropic about
#: 1,600 tokens for a full-size one), not by the base64 the log carries (a 1 MB PNG would
#: otherwise count 350k tokens and trigger compaction at once).
IMAGE_TOKENS: Final = 1_600
#: A document (PDF) per KiB of file: providers price pages (text plus a page image, some
#: 1,500-3,000 tokens each); a heuristic until the provider's measured usage arrives.
DOCUMENT_TOKENS_PER_KIB: Final = 20


def _chars(n: int) -> int:
    return math.ceil(n / CHARS_PER_TOKEN)


def _json_len(value: Any) -> int:
    return len(msgspec.json.encode(value, enc_hook=json_enc_hook))


def estimate_content(blocks: Sequence[ContentBlock]) -> int:
    """Heuristic tokens of content blocks, recursively, with per-block overhead."""
    tokens = 0
    for block in blocks:
        if isinstance(block, TextBlock | ReasoningBlock):
            tokens += _chars(len(block.text)) + BLOCK_OVERHEAD
        elif isinstance(block, ToolCallBlock):
            tokens += _chars(len(block.name)) + _chars(len(block.arguments)) + BLOCK_OVERHEAD
        elif isinstance(block, ToolResultBlock):
            tokens += estimate_content(block.content) + BLOCK_OVERHEAD
        elif isinstance(block, ImageBlock):
            tokens += IMAGE_TOKENS + BLOCK_OVERHEAD
        elif isinstance(block, Mapping) and block.get("type") == "file":
            tokens += _document_tokens(block.get("attachment")) + BLOCK_OVERHEAD
        else:  # an opaque block: its structural JSON price
            tokens += BLOCK_OVERHEAD + _chars(_json_len(block))
    return tokens


def _document_tokens(attachment: Any) -> int:
    size = attachment.get("bytes") if isinstance(attachment, Mapping) else None
    if not isinstance(size, int) or size < 0:
        return DOCUMENT_TOKENS_PER_KIB
    return max(1, math.ceil(size / 1024)) * DOCUMENT_TOKENS_PER_KIB


def estimate_message(message: Message) -> int:
    """Heuristic tokens of one model-visible message (content plus role framing)."""
    return estimate_content(message.content) + ROLE_OVERHEAD


def estimate_header(header: EpochHeader | None) -> int:
    """Heuristic tokens of the non-surface envelope: system prompt (if any) and tool schemas."""
    if header is None:
        return 0
    tokens = 0
    if header.system is not UNSET and header.system:
        tokens += _chars(len(header.system)) + ROLE_OVERHEAD
    if header.tools is not UNSET and header.tools:
        tokens += _chars(_json_len(header.tools)) + BLOCK_OVERHEAD
    return tokens


def usage_total(usage: TokenUsage) -> int:
    """Input (uncached + cache read + cache write) plus output: one call's whole size."""
    return (
        usage.input_tokens
        + (usage.cache_read_tokens or 0)
        + (usage.cache_write_tokens or 0)
        + usage.output_tokens
    )


def _prompt_tokens(usage: TokenUsage) -> int:
    return usage.input_tokens + (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)


@dataclass(frozen=True, slots=True)
class TokenSurfaceNode:
    """One priced node of the current surface."""

    seq: int  #: the surface event
    tokens: int  #: heuristic tokens of the message it projects (0 when it projects none)


@dataclass(frozen=True, slots=True)
class TokenMeasurement:
    """Request pressure and the priced surface at one consumed-log revision (DSH's shape)."""

    log_revision: int  #: events consumed (the next unread seq)
    baseline_kind: Literal["none", "estimated", "usage"]  #: what the total is anchored on
    baseline_tokens: int  #: the anchor's tokens
    surface_delta_tokens: int  #: signed repricing of the surface since the anchor
    total_tokens: int  #: the next request's estimated size (never negative)
    surface_tokens: int  #: heuristic total of the current surface (sum of ``nodes``)
    #: the current surface, in model order: an immutable snapshot (a :class:`LogView`; measuring
    #: runs before every step, so it must not copy a surface as long as the context window)
    nodes: Sequence[TokenSurfaceNode]


@dataclass(frozen=True, slots=True)
class ContextPressure:
    """How full the next request is, against the routed model's context window."""

    #: the newest provider-reported prompt size (uncached + cache read + write), if any
    pressure_tokens: int | None
    #: what the next request's prompt is estimated to cost (``measure().total_tokens``)
    projected_tokens: int
    #: True when ``projected_tokens`` has no provider anchor (pure local estimate)
    estimated: bool
    #: the routed model's capacity (newest ``request/context``), None when none was declared
    context_window: int | None
    provider: str | None
    model: str | None

    @property
    def ratio(self) -> float | None:
        """``projected_tokens / context_window``, or None without a window."""
        if not self.context_window:
            return None
        return self.projected_tokens / self.context_window


@dataclass(slots=True)
class _Anchor:
    header: EpochHeader | None
    surface_tokens: int
    kind: Literal["estimated", "usage"]
    tokens: int


@dataclass(slots=True)
class _State:
    consumed: int = 0
    header: EpochHeader | None = None
    header_tokens: int = 0  #: ``estimate_header(header)``, priced once per header
    nodes: list[TokenSurfaceNode] = field(default_factory=list)  #: grows at its end; a replace
    #: builds a new list (measurements hold views of it)
    surface_tokens: int = 0
    anchor: _Anchor | None = None
    ledger: UsageLedger = field(default_factory=lambda: UsageLedger(PriceTable()))
    last_usage: TokenUsage | None = None
    context: RequestContextData | None = None


class WalkedLog:
    """A stored log a reader walks page by page (``dsh sessions show``), measured in place of
    a :class:`Session`: :meth:`TokenMeter.feed` folds each page into its state, and it holds
    no event itself, so measuring a 100k-event log costs the fold's state, not the log (D33)."""

    __slots__ = ("__weakref__",)

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        return ()


class TokenMeter:
    """The ``tokenMeter`` service: per-session replay folds over the durable log."""

    def __init__(self, prices: PriceTable | None = None) -> None:
        self._states: weakref.WeakKeyDictionary[Session | WalkedLog, _State] = (
            weakref.WeakKeyDictionary()
        )
        self._prices = prices if prices is not None else PriceTable()

    @property
    def prices(self) -> PriceTable:
        """The table every call is priced with."""
        return self._prices

    # -- public -----------------------------------------------------------------------
    def estimate_message(self, message: Message) -> int:
        """Heuristic tokens of one message (the fixed service estimator)."""
        return estimate_message(message)

    def measure(
        self, session: Session | WalkedLog, request_header: EpochHeader | None = None
    ) -> TokenMeasurement:
        """Pressure of the next request and the priced surface (DSH ``measure``).

        Provider usage is reused only while the latest successful call's canonical envelope
        equals ``request_header`` (default: the latest logged one) and is no smaller than
        that call's full heuristic price; otherwise everything is estimated.
        """
        state = self._sync(session)
        header = state.header if request_header is None else canonical_header(request_header)
        anchor = state.anchor
        kind: Literal["none", "estimated", "usage"]
        if anchor is not None and _optional_equal(anchor.header, header):
            kind, base = anchor.kind, anchor.tokens
            delta = state.surface_tokens - anchor.surface_tokens
        elif header is None and state.surface_tokens == 0:
            kind, base, delta = "none", 0, 0
        else:
            priced = state.header_tokens if header is state.header else estimate_header(header)
            kind, base, delta = "estimated", priced + state.surface_tokens, 0
        return TokenMeasurement(
            log_revision=state.consumed,
            baseline_kind=kind,
            baseline_tokens=base,
            surface_delta_tokens=delta,
            total_tokens=max(0, base + delta),
            surface_tokens=state.surface_tokens,
            nodes=LogView(state.nodes, len(state.nodes)),
        )

    def usage(self, session: Session | WalkedLog) -> UsageTotals:
        """Provider usage summed over the whole log."""
        return self._sync(session).ledger.usage

    def turn_usage(self, session: Session | WalkedLog) -> dict[int, UsageTotals]:
        """Provider usage per turn number (turns that reported none are absent)."""
        return dict(self._sync(session).ledger.by_turn)

    def requests(self, session: Session | WalkedLog) -> list[RequestCost]:
        """Every billed call in log order, each with its usage and cost."""
        return list(self._sync(session).ledger.requests)

    def pressure(self, session: Session | WalkedLog) -> ContextPressure:
        """Context pressure of the current surface against the routed model's window."""
        state = self._sync(session)
        measured = self.measure(session)
        context = state.context
        window = None
        if context is not None and context.context_window is not UNSET:
            window = context.context_window
        last = state.last_usage
        return ContextPressure(
            pressure_tokens=_prompt_tokens(last) if last is not None else None,
            projected_tokens=measured.total_tokens,
            estimated=measured.baseline_kind != "usage",
            context_window=window,
            provider=context.provider if context is not None else None,
            model=context.model if context is not None else None,
        )

    def feed(self, log: WalkedLog, events: Iterable[SessionEvent]) -> None:
        """Fold ``events``, the next ones of ``log`` in log order, into its state."""
        state = self._sync(log)
        for event in events:
            self._fold(state, event)
            state.consumed += 1

    # -- the fold -----------------------------------------------------------------------
    def _sync(self, session: Session | WalkedLog) -> _State:
        state = self._states.get(session)
        if state is None:
            state = _State(ledger=UsageLedger(self._prices))
            self._states[session] = state
        events = session.events
        if state.consumed < len(events):
            # Walked, not indexed: a page decoded and read in order (docs/decisions.md D46).
            new = events.iter_from(state.consumed) if isinstance(events, LogView) else (
                events[state.consumed :]
            )
            for event in new:
                self._fold(state, event)
                state.consumed += 1
        return state

    def _fold(self, state: _State, event: SessionEvent) -> None:
        if state.ledger.feed(event):
            return
        kind = event.type
        data = event.data
        if kind == "request/header" and isinstance(data, RequestHeaderData):
            state.header = canonical_header(data.header)
            state.header_tokens = estimate_header(state.header)
            return
        if kind == "request/context" and isinstance(data, RequestContextData):
            state.context = data
            return
        op = event.surface_op
        if op is UNSET:
            return
        message = derive_event_message(event)
        tokens = estimate_message(message) if message is not None else 0
        before = state.surface_tokens
        if isinstance(op, ReplaceOp):
            nodes = state.nodes
            index = {node.seq: i for i, node in enumerate(nodes)}
            start, end = index.get(op.start), index.get(op.end)
            if start is None or end is None or start > end:
                raise ValueError(
                    f"token meter: replace at seq {event.seq} has invalid current range "
                    f"{op.start}-{op.end}"
                )
            removed = sum(node.tokens for node in nodes[start : end + 1])
            # A new list: measurements taken before hold views of the old one, which only
            # ever grows at its end (so a view of it never changes).
            state.nodes = [*nodes[:start], TokenSurfaceNode(event.seq, tokens), *nodes[end + 1 :]]
            state.surface_tokens += tokens - removed
        else:
            state.nodes.append(TokenSurfaceNode(event.seq, tokens))
            state.surface_tokens += tokens
        if kind == "assistant/message" and isinstance(data, AssistantMessageData):
            # The request that produced this reply saw the surface as it was just before it;
            # the anchor is that request plus the reply (what the next request repeats).
            anchor_surface = before + tokens
            estimated = state.header_tokens + anchor_surface
            usage = data.usage if data.usage is not UNSET else None
            if usage is not None:  # counted by the ledger
                state.last_usage = usage
                provider_tokens = usage_total(usage)
                if provider_tokens >= estimated:
                    state.anchor = _Anchor(state.header, anchor_surface, "usage", provider_tokens)
                    return
            state.anchor = _Anchor(state.header, anchor_surface, "estimated", estimated)


def _optional_equal(left: EpochHeader | None, right: EpochHeader | None) -> bool:
    if left is None or right is None:
        return left is right
    return headers_equal(left, right)


def turn_usage(meter: object, session: Session, turn: int) -> UsageTotals | None:
    """One turn's usage and cost from ``meter`` (the host's ``tokenMeter``, or a fresh one with
    the catalogue's prices when none is composed); None when no call of the turn reported any.
    """
    chosen = meter if isinstance(meter, TokenMeter) else TokenMeter()
    return chosen.turn_usage(session).get(turn)
