"""Plain-text rendering of messages and events for people (no model-facing strings here).

Everything shown here can come from the model, a tool's output or a stored log, so it passes
through :func:`terminal_safe` before it reaches a terminal: an escape sequence in a file the
agent ``cat``s must not clear the screen, move the cursor or draw a fake approval prompt.

Plain newlines are a second way to forge: a model text whose second line reads
``  ⚙ bash [call-1] {...}`` or ``  ⎿ result [call-1]`` would look like the harness's own lines.
So every line of text the harness did not write (model text and reasoning, tool output, a
user's or a plugin's message) that does not start with the harness's label for it carries the
:data:`GUTTER` (:func:`continued`, :func:`guttered`, :func:`gutter_stream`); no harness line
starts with it, so nothing such text holds can pass for one.
"""

from __future__ import annotations

import datetime as _dt
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from .._session.events import ReplaceOp, SessionEvent, event_to_builtins
from .._session.messages import (
    AssistantMessage,
    PluginSource,
    ReasoningBlock,
    SystemMessage,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultMessage,
    UserMessage,
    block_type,
    source_kind,
)

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from .._session.tokens import ContextPressure, UsageTotals

MAX_TOOL_OUTPUT_LINES = 20

#: Marks a line of text someone other than the harness wrote (see the module docstring).
GUTTER: Final = "│ "

#: Unicode categories shown escaped: controls (C0, DEL, C1 — ESC, CSI, OSC, ``\r`` ...), format
#: characters (bidi overrides and isolates U+202A-202E / U+2066-2069, zero-width ...),
#: surrogates, private use, unassigned, and the line/paragraph separators.
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def terminal_safe(text: str, *, multiline: bool = True) -> str:
    """``text`` made inert on a terminal: every unsafe character shown as ``\\xNN``/``\\uNNNN``.

    ``\\t`` is kept (it cannot move the cursor back); ``multiline`` keeps ``\\n`` too (prose,
    tool output), while a one-line field (a call id, a tool name, arguments) escapes it.
    Escaping is per character, so it is safe on streamed chunks that split a sequence.
    """
    out: list[str] = []
    for ch in text:
        if ch == "\t" or (multiline and ch == "\n"):
            out.append(ch)
        elif unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def continued(text: str, indent: str = "  ") -> str:
    """``text`` (already :func:`terminal_safe`) whose first line follows a harness label:
    every later line gets ``indent`` and the :data:`GUTTER`."""
    first, *rest = text.split("\n")
    return "".join([first, *(f"\n{indent}{GUTTER}{line}" for line in rest)])


def guttered(text: str, indent: str = "    ") -> list[str]:
    """Every line of ``text`` (already :func:`terminal_safe`), with ``indent`` and the gutter."""
    return [f"{indent}{GUTTER}{line}" for line in text.split("\n")]


def gutter_stream(text: str, *, at_line_start: bool) -> str:
    """A streamed chunk of model text (already :func:`terminal_safe`), with the gutter at the
    start of each line it begins: at its own start when the terminal is at a line start, and
    after each newline that more text follows."""
    lines = text.split("\n")
    head = f"{GUTTER}{lines[0]}" if at_line_start and lines[0] else lines[0]
    return "\n".join([head, *(f"{GUTTER}{line}" if line else "" for line in lines[1:])])


class MarkdownAnswer:
    """Model text rendered as markdown (headings, lists, code blocks, emphasis) for a terminal,
    every rendered line behind the :data:`GUTTER`.

    The text is made :func:`terminal_safe` *before* rich parses it, so what reaches the
    terminal is rich's own styling around inert characters; links are shown as ``text (url)``
    rather than as terminal hyperlinks, whose target a reader cannot see. Each line of the
    rendering starts with the gutter, so a heading, a rule or a code block cannot pass for a
    harness line however the model shapes it. A pipe never gets this: it gets the raw text.
    """

    def __init__(self, text: str) -> None:
        self.text = terminal_safe(text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.markdown import Markdown
        from rich.segment import Segment
        from rich.style import Style

        width = max(options.max_width - len(GUTTER), 20)
        document = Markdown(self.text, hyperlinks=False)
        lines = console.render_lines(document, options.update_width(width), pad=False)
        while lines and not "".join(segment.text for segment in lines[-1]).strip():
            lines.pop()  # rich ends blocks with a blank line; the transcript's next line follows
        gutter = Segment(GUTTER, Style(dim=True))
        for line in lines:
            yield gutter
            yield from line
            yield Segment.line()


def when(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def blocks_text(blocks: Any) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, TextBlock | ReasoningBlock):
            parts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            parts.append(blocks_text(block.content))
        elif not isinstance(block, ToolCallBlock):
            parts.append(f"[{block_type(block)}]")  # a block kind this build does not model
    return "".join(parts)


def message_lines(message: Any) -> list[tuple[str, str]]:
    """(style, text) pairs for one message, in reading order."""
    out: list[tuple[str, str]] = []
    if isinstance(message, ToolResultMessage):
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                style = "red" if block.is_error is True else "dim"
                label = "error" if block.is_error is True else "result"
                out.append((style, f"  ⎿ {label} [{short_id(block.tool_call_id)}]\n"
                            + _indent(terminal_safe(blocks_text(block.content)))))
        return out
    if isinstance(message, AssistantMessage):
        for block in message.content:
            if isinstance(block, ReasoningBlock):
                thinking = continued(terminal_safe(block.text.strip()))
                out.append(("dim italic", f"  (thinking) {thinking}"))
            elif isinstance(block, TextBlock):
                out.append(("", f"assistant: {continued(terminal_safe(block.text))}"))
            elif isinstance(block, ToolCallBlock):
                out.append(("cyan", _one_line(
                    f"  ⚙ {block.name} [{short_id(block.id)}] {block.arguments}")))
        return out
    if isinstance(message, UserMessage):
        kind = source_kind(message.source)
        plugin = message.source.plugin if isinstance(message.source, PluginSource) else ""
        prefix = "you" if kind == "user" else f"({kind} {plugin})".replace(" )", ")")
        style = "bold" if kind == "user" else "dim"
        out.append((style, continued(terminal_safe(f"{prefix}: {blocks_text(message.content)}"))))
        return out
    if isinstance(message, SystemMessage):
        out.append(("dim", f"system: {continued(terminal_safe(blocks_text(message.content)))}"))
        return out
    out.append(("dim", _one_line(repr(message))))
    return out


#: Call ids longer than this are shown by their last :data:`SHORT_ID_CHARS` characters.
SHORT_ID_LIMIT: Final = 12
SHORT_ID_CHARS: Final = 8


def short_id(call_id: object) -> str:
    """A call id as the transcript shows it: ``…`` and its last 8 characters when it is long.

    A minted id is ``call_`` and 24 hex digits, the same 29 characters on every line, which
    buried the line's content; its last 8 hex digits tell a session's calls apart (a provider
    id the harness kept is unique in its session and usually short, so shown whole). The full
    id stays where it is needed: ``--json``, ``dsh sessions show --view events``, the
    approval commands.
    """
    text = _one_line(str(call_id))
    return text if len(text) <= SHORT_ID_LIMIT else "…" + text[-SHORT_ID_CHARS:]


def _one_line(text: str) -> str:
    return terminal_safe(text, multiline=False)


def _indent(text: str) -> str:
    """Tool output under its ``⎿`` line: guttered, clipped by a harness line."""
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()  # a final newline ends the last line, it starts no new one
    if not lines:
        return "    (empty)"
    shown = guttered("\n".join(lines[:MAX_TOOL_OUTPUT_LINES]))
    if len(lines) > MAX_TOOL_OUTPUT_LINES:
        shown.append(f"    ... ({len(lines) - MAX_TOOL_OUTPUT_LINES} more lines)")
    return "\n".join(shown)


def retry_summary(data: dict[str, Any]) -> str:
    """``retry 2/5 in 1000ms after RATE_LIMIT: slow down``, or ``retry 2 started``."""
    if "delayMs" not in data:
        return f"retry {data.get('retry')} started"
    budget = data.get("maxRetries", "∞")
    failure = data.get("failure") or {}
    delay = data.get("delayMs")
    shown = f"{delay:.0f}" if isinstance(delay, int | float) else str(delay)
    return (
        f"retry {data.get('retry')}/{budget} in {shown}ms after {failure.get('code')}: "
        f"{failure.get('message')}"
    )


def event_summary(event: SessionEvent) -> str:
    data = event_to_builtins(event).get("data")
    summary = ""
    if isinstance(data, dict):
        if event.type in ("turn/end",):
            summary = f"turn {data.get('turn')} {data.get('reason', {}).get('kind')}"
        elif event.type in ("turn/start", "step/start", "step/end"):
            scalars = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
            summary = " ".join(f"{k}={v}" for k, v in scalars.items())
        elif event.type == "tool/call":
            summary = f"{data.get('name')} [{data.get('callId')}] {data.get('arguments', '')}"
        elif event.type == "tool/result":
            message = data.get("message", {})
            source = message.get("source", {}) if isinstance(message, dict) else {}
            error = data.get("error")
            summary = f"[{source.get('callId')}]" + (f" error {error.get('code')}" if error else "")
        elif event.type in ("llm/retry", "llm/retry-started"):
            summary = retry_summary(data)
        elif event.type == "subagent/catalog":
            summary = catalog_summary(data)
        elif event.type.startswith("approval/"):
            summary = " ".join(f"{k}={v}" for k, v in data.items())
    if len(summary) > 120:
        summary = summary[:117] + "..."
    return _one_line(f"{event.seq:>6}  {event.type:<22} {summary}")


def catalog_summary(data: Any) -> str:
    """One line for a ``subagent/catalog`` fact (DSH: a parent's record of a child session)."""
    if not isinstance(data, Mapping):
        return "subagent catalog entry"
    label = data.get("label")
    named = f" {label!r}" if isinstance(label, str) else ""
    return f"subagent {data.get('childId')}{named} (mode {data.get('mode')})"


def compaction_mark(event: SessionEvent) -> str | None:
    """The transcript line marking where a compaction changed what the model sees, or None.

    The transcript itself keeps every original event; this line only says the model's view
    was rewritten from here on (``dsh sessions show --view model`` shows that view).
    """
    data = event.data
    if not isinstance(data, Mapping):
        return None
    if event.type == "compaction/summary":
        count = len(data.get("shadowedSeqs") or ())
        tokens = data.get("shadowedTokenCount")
        noun = "item" if count == 1 else "items"
        return _one_line(
            f"── compacted: {count} earlier {noun} (~{tokens} tokens) summarized for the model "
            f"by {data.get('provider')}/{data.get('model')}; all of it is kept above ──"
        )
    if event.type == "compaction/prune":
        seqs = ", ".join(str(seq) for seq in data.get("shadowedSeqs") or ())
        return _one_line(
            f"── pruned for the model: tool result (seq {seqs}, ~{data.get('shadowedTokenCount')} "
            "tokens) shortened to head and tail; the full result is kept above ──"
        )
    if event.type == "compaction/end" and data.get("error"):
        return _one_line(f"── compaction failed, the model's view is unchanged: {data['error']} ──")
    return None


def dollars(amount: Decimal) -> str:
    """``$0.01692``: up to six decimals, trailing zeros dropped (``$0`` for nothing)."""
    text = f"{amount:.6f}".rstrip("0").rstrip(".")
    return f"${text}"


def usage_lines(usage: UsageTotals, pressure: ContextPressure) -> list[str]:
    """``usage: ...`` and ``context: ...`` lines from a token meter's totals and pressure."""
    out = []
    if usage.requests:
        cache = ""
        if usage.cache_read_tokens or usage.cache_write_tokens:
            cache = (
                f" (+{usage.cache_read_tokens} cache read, {usage.cache_write_tokens} cache write)"
            )
        out.append(
            f"usage: {usage.input_tokens} input{cache}, {usage.output_tokens} output tokens "
            f"over {usage.requests} request(s)"
        )
        cost = usage.cost_usd
        if cost is not None:
            out.append(f"cost: {dollars(cost)}")
        else:
            models = ", ".join(usage.unpriced_models)
            priced = ""
            if usage.unpriced_requests < usage.requests:
                priced = f"; {dollars(usage.priced_cost_usd)} for the priced ones"
            out.append(
                f"cost: unknown: no price for {models} ({usage.unpriced_requests} request(s))"
                f"{priced}; add it to the token-meter row's prices:"
            )
    estimate = " (local estimate)" if pressure.estimated else ""
    if pressure.context_window:
        out.append(
            f"context: ~{pressure.projected_tokens}{estimate} of {pressure.context_window} tokens "
            f"({pressure.ratio:.0%}) for {pressure.provider}/{pressure.model}"
        )
    elif pressure.projected_tokens:
        out.append(
            f"context: ~{pressure.projected_tokens} tokens{estimate} (no context window declared)"
        )
    return out
# -- the transcript: one renderer for the live run and `dsh sessions show` ----------------

Line = tuple[str, str]  # (style, text)


def clock(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).strftime("%H:%M:%S")


#: ``read_file``'s answer to the model (DSH's envelope around numbered lines and a footer).
_READ_ENVELOPE: Final = re.compile(
    r"\A<path>(?P<path>[^\n]*)</path>\n<type>file</type>\n<content>\n(?P<body>.*)\n</content>\Z",
    re.S,
)


def readable_result(text: str) -> str:
    """A tool result as a person reads it: ``read_file``'s envelope (the tags the model is
    sent) becomes the path on a line of its own, then the numbered lines and the footer; any
    other result is shown as it is."""
    found = _READ_ENVELOPE.match(text)
    if found is None:
        return text
    return f"{found['path']}\n{found['body']}"


def tool_result_lines(data: Any, *, full: bool = False) -> list[Line]:
    """A ``tool/result`` event's data: ``⎿ result [id]`` or ``⎿ error CODE [id]``, then the
    output, clipped to :data:`MAX_TOOL_OUTPUT_LINES` lines unless ``full``."""
    block = data.message.content[0]
    error = getattr(data, "error", None)
    code = getattr(error, "code", None) if error is not None else None
    failed = code is not None or block.is_error is True  # a refusal is an error result too
    label = f"error {code}" if code is not None else "error" if failed else "result"
    # Escaped before splitting: a "\r" or a form feed is shown, not taken as a line break.
    lines = terminal_safe(readable_result(blocks_text(block.content))).splitlines()
    shown = lines if full else lines[:MAX_TOOL_OUTPUT_LINES]
    out: list[Line] = [("red" if failed else "dim",
                        f"  ⎿ {label} [{short_id(block.tool_call_id)}]")]
    if not lines:
        out.append(("dim", "    (empty)"))
    if shown:
        out.extend(("dim", line) for line in guttered("\n".join(shown)))
    if len(shown) < len(lines):
        out.append(("dim", f"    ... ({len(lines) - len(shown)} more lines)"))
    return out


def approval_lines(kind: str, data: dict[str, Any]) -> list[Line]:
    """``approval/asked`` and ``approval/decided`` (wire-form data) as the audit trail reads."""
    if kind == "approval/asked":
        reason = f": {data['reason']}" if data.get("reason") else ""
        call = short_id(data.get("callId"))
        asked = f"? approval asked for {data.get('toolName')} [{call}]{reason}"
        return [("yellow", _one_line(asked))]
    by = f" by {data['decidedBy']}" if data.get("decidedBy") else ""
    why = f" ({data['reason']})" if data.get("reason") else ""
    return [("yellow", _one_line(f"? approval {data.get('outcome')}{by}{why}"))]


def turn_end_line(data: dict[str, Any], *, started: int | None = None, at: int | None = None
                  ) -> Line:
    reason = data.get("reason", {})
    detail = reason.get("message") or (reason.get("error") or {}).get("message") or ""
    when_ = ""
    if at is not None:
        took = f", {(at - started) / 1000:.1f} s" if started is not None else ""
        when_ = f" · {clock(at)}{took}"
    style = "green" if reason.get("kind") == "completed" else "red"
    return style, _one_line(
        f"turn {data.get('turn')} ended: {reason.get('kind')}"
        f"{' — ' + str(detail) if detail else ''}{when_}"
    )


def transcript_lines(
    events: Any,
    *,
    full: bool = False,
    turn: int | None = None,
) -> list[Line]:
    """:func:`iter_transcript_lines` as a list."""
    return list(iter_transcript_lines(events, full=full, turn=turn))


def iter_transcript_lines(
    events: Iterable[Any],
    *,
    full: bool = False,
    turn: int | None = None,
) -> Iterator[Line]:
    """Everything that happened, for people: turns with their times and end reasons, what was
    said (runtime-context snapshots labelled by their source, never ``you:``), each call with
    its approval trail and result, failed attempts, retries, and each answer's token usage.
    ``turn``: only that turn; ``full``: tool output unclipped. Every original event is shown;
    a surface ``replace`` (compaction's model-only replacement) is not, and a mark says where
    compaction changed the model's view instead. One line at a time: a reader of a long log
    prints it as it walks it (D33)."""
    current: int | None = None
    started: int | None = None
    for event in events:
        kind = event.type
        if kind == "turn/start":
            current, started = event.data.turn, event.time
        if turn is not None and current != turn:
            continue
        if (mark := compaction_mark(event)) is not None:
            yield ("yellow", mark)
            continue
        if isinstance(event.surface_op, ReplaceOp):
            continue
        if kind == "turn/start":
            yield ("bold", f"── turn {current} · {when(event.time)}")
        elif kind in ("user/message", "system/message"):
            message = event.data if kind == "user/message" else event.data.message
            yield from message_lines(message)
        elif kind == "developer/message":  # DSH format v4: tool changes, as the model sees them
            from .._session.session import developer_as_system  # here: a listing needs none

            projected = developer_as_system(event.data.message)
            if projected is not None:
                text = terminal_safe(blocks_text(projected.content))
                yield ("dim", f"developer: {continued(text)}")
        elif kind == "subagent/catalog":
            yield ("dim", _one_line(f"  {catalog_summary(event_to_builtins(event)['data'])}"))
        elif kind == "assistant/message":
            yield from message_lines(event.data.message)
            usage = to_usage(event.data)
            if usage:
                yield ("dim", f"  · {usage}")
        elif kind == "assistant/attempt":
            yield ("red", f"  ✗ a model attempt of step {event.data.step} failed "
                          "(nothing it said entered the conversation)")
        elif kind == "tool/result":
            yield from tool_result_lines(event.data, full=full)
        elif kind in ("approval/asked", "approval/decided"):
            yield from approval_lines(kind, event_to_builtins(event)["data"])
        elif kind == "llm/retry":
            retry = retry_summary(event_to_builtins(event)["data"])
            yield ("yellow", _one_line(f"  ↻ {retry}"))
        elif kind == "turn/end":
            yield turn_end_line(event_to_builtins(event)["data"], started=started, at=event.time)


def to_usage(data: Any) -> str:
    """``usage: 40 in, 972 out`` of an ``assistant/message``'s data ("" when none reported)."""
    usage = getattr(data, "usage", None)
    if usage is None or not hasattr(usage, "input_tokens"):
        return ""
    total_in = (usage.input_tokens or 0) + (getattr(usage, "cache_read_tokens", 0) or 0)
    return f"usage: {total_in} in, {usage.output_tokens or 0} out"
