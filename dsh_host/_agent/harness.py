"""The harness replay (``dsh replay ID --same-model``): re-derive each recorded request (D32).

No model is called and nothing is written. For every step of a stored session that made a model
request, the log up to that step's ``step/start`` is copied into a detached session, and an
:class:`~.loop.Agent` of this host (the *current* composition: its system-prompt sections and
runtime contexts, its tools, its ``agent/request`` listeners and adapter) opens the request on it
through the code a live step runs (``Agent._open_request``): the system prompt is rendered and
projected, the step's recorded input is entered with the runtime-context snapshot the
composition renders now, and the request header is built with the config the step ran under.
The request built this way is compared, part by part, with the request the log says was sent
(the log up to the step's first ``assistant/message`` or ``assistant/attempt``):

* ``system prompt``: the text of the ``system/message`` in force;
* ``runtime context``: the last runtime-context snapshot among the messages;
* ``tool schemas``: each tool's schema JSON in the header (missing, new, changed);
* ``request config``: the header's call config and adapter-default markers;
* ``messages``: the message list the model reads (ids left out: they are the harness's and not
  sent), as a sha256 digest; named only when the parts above do not explain the difference.

Input a pre-step listener added to a step (a reminder) is taken from the log as recorded, not
derived again. :func:`harness_replay` is what the CLI, ``dsh_host.replay`` and
``dsh_host.testing.recorded_sessions`` run.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from dsh_host._cancel import CancelToken
from dsh_host._persistence.keys import SESSION_PERSISTENCE
from dsh_host._session.events import AssistantMessageData, SessionEvent, StepStart, to_builtins
from dsh_host._session.messages import (
    EpochHeader,
    LlmCallConfig,
    Message,
    ModelSource,
    PluginSource,
    SystemMessage,
    TextBlock,
    UserMessage,
)
from dsh_host._session.request_header import canonical_header, fold_request_header
from dsh_host._session.session import Session, derive_messages_from_events

from .keys import AGENT
from .prompt import PROMPT_SOURCE

if TYPE_CHECKING:
    from dsh_host._context import Context

__all__ = ["Difference", "HarnessReport", "harness_replay"]

#: the most diff lines a difference carries (the rest is counted)
DIFF_LINES = 24
#: the longest diff line kept whole (a tool description is one long JSON line)
DIFF_WIDTH = 200
#: the parts of a request, in the order a difference is reported
PARTS = ("request config", "system prompt", "tool schemas", "runtime context", "messages")


@dataclass(frozen=True, slots=True)
class Difference:
    """One part of one step's request that the current build derives differently."""

    turn: int
    step: int
    part: str  #: one of :data:`PARTS`
    detail: str
    diff: str = ""  #: a short unified diff, recorded (-) against derived (+)

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "step": self.step, "part": self.part,
                "detail": self.detail, "diff": self.diff}  # fmt: skip


@dataclass(slots=True)
class HarnessReport:
    """What the harness replay found: the steps it checked and every difference."""

    session: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def diverged(self) -> bool:
        return bool(self.differences)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session, "mode": "same-model", "identical": self.identical,
            "steps": self.steps, "differences": [d.to_json() for d in self.differences],
        }  # fmt: skip

    def render(self) -> str:
        """The human report (``dsh replay --same-model`` prints it)."""
        lines = [f"harness replay of {self.session}: {len(self.steps)} request(s) re-derived"]
        for d in self.differences:
            lines.append(f"turn {d.turn} step {d.step}: {d.part} differs: {d.detail}")
            lines.extend(f"  {text}" for text in d.diff.splitlines())
        if self.identical:
            lines.append("identical: every request is derived byte for byte as recorded")
        else:
            parts = sorted({d.part for d in self.differences}, key=PARTS.index)
            lines.append(f"{len(self.differences)} difference(s) in: {', '.join(parts)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _short_diff(recorded: str, derived: str, what: str) -> str:
    lines = list(difflib.unified_diff(
        recorded.splitlines(), derived.splitlines(),
        fromfile=f"recorded {what}", tofile=f"derived {what}", lineterm="", n=1,
    ))  # fmt: skip
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more diff lines)"]
    return "\n".join(
        line if len(line) <= DIFF_WIDTH else line[: DIFF_WIDTH - 1] + "…" for line in lines
    )


def _text(message: Message) -> str:
    return "".join(b.text for b in message.content if isinstance(b, TextBlock))


def _system(messages: Sequence[Message]) -> str | None:
    """The system prompt on the surface (the head of a log this loop wrote; anywhere in one a
    foreign writer left without a system message before its first prompt)."""
    texts = [_text(m) for m in messages if isinstance(m, SystemMessage)]
    return "\n\n".join(texts) if texts else None


def _is_snapshot(message: object) -> bool:
    return isinstance(message, UserMessage) and (
        isinstance(message.source, PluginSource) and message.source.plugin == PROMPT_SOURCE
    )


def _snapshot(messages: Sequence[Message]) -> str | None:
    texts = [_text(m) for m in messages if _is_snapshot(m)]
    return texts[-1] if texts else None


def _wire(message: Message) -> dict[str, Any]:
    """A message as the model reads it: its id is the harness's, never sent."""
    data: dict[str, Any] = to_builtins(message)
    data.pop("id", None)
    return data


def _digest(messages: Sequence[Message]) -> str:
    encoded = msgspec.json.encode([_wire(m) for m in messages])
    return "sha256:" + hashlib.sha256(encoded).hexdigest()


def _schemas(header: EpochHeader | None) -> dict[str, str]:
    if header is None:
        return {}
    tools = canonical_header(header).tools
    if isinstance(tools, tuple):
        return {t.name: msgspec.json.format(msgspec.json.encode(t, enc_hook=dict)).decode()
                for t in tools}  # fmt: skip
    return {}


def _config(header: EpochHeader | None) -> str:
    if header is None:
        return "(none)"
    canonical = canonical_header(header)
    defaults = canonical.adapter_defaults
    shown = {"config": to_builtins(canonical.config),
             "adapterDefaults": None if defaults is UNSET else to_builtins(defaults)}  # fmt: skip
    return msgspec.json.format(msgspec.json.encode(shown)).decode()


def _message_json(messages: Sequence[Message], index: int) -> str:
    return msgspec.json.encode(_wire(messages[index])).decode() if index < len(messages) else ""


def _compare(
    turn: int,
    step: int,
    recorded: tuple[EpochHeader | None, list[Message]],
    derived: tuple[EpochHeader | None, list[Message]],
) -> list[Difference]:
    """The differences of one step's request, part by part (:data:`PARTS`)."""
    out: list[Difference] = []

    def differs(part: str, detail: str, before: str = "", after: str = "", what: str = "") -> None:
        diff = _short_diff(before, after, what or part) if before or after else ""
        out.append(Difference(turn, step, part, detail, diff))

    (r_header, r_messages), (d_header, d_messages) = recorded, derived
    if _config(r_header) != _config(d_header):
        differs("request config", "the call config differs", _config(r_header), _config(d_header))
    r_system, d_system = _system(r_messages), _system(d_messages)
    if r_system != d_system:
        if r_system is None:
            detail = "no system prompt was recorded"
        elif d_system is None:
            detail = "no system prompt is derived now"
        else:
            detail = "the rendered system prompt differs"
        differs("system prompt", detail, r_system or "", d_system or "")
    r_tools, d_tools = _schemas(r_header), _schemas(d_header)
    for name in sorted(r_tools.keys() | d_tools.keys()):
        before, after = r_tools.get(name), d_tools.get(name)
        if before == after:
            continue
        if after is None:
            differs("tool schemas", f"tool {name} is not offered any more")
        elif before is None:
            differs("tool schemas", f"tool {name} is new")
        else:
            differs("tool schemas", f"tool {name}: its schema differs", before, after,
                    f"{name} schema")  # fmt: skip
    if r_tools.keys() == d_tools.keys() and list(r_tools) != list(d_tools):
        differs("tool schemas", f"the tools are offered in another order: {', '.join(d_tools)} "
                f"(recorded: {', '.join(r_tools)})")  # fmt: skip
    r_snapshot, d_snapshot = _snapshot(r_messages), _snapshot(d_messages)
    if r_snapshot != d_snapshot:
        differs("runtime context", "the runtime-context snapshot differs", r_snapshot or "",
                d_snapshot or "")  # fmt: skip
    r_digest, d_digest = _digest(r_messages), _digest(d_messages)
    if r_digest != d_digest:
        history_r = [_wire(m) for m in r_messages if not _is_prompt_owned(m)]
        history_d = [_wire(m) for m in d_messages if not _is_prompt_owned(m)]
        if history_r != history_d or not out:  # else the parts above explain it
            pairs = zip(r_messages, d_messages, strict=False)
            index = next(
                (i for i, (a, b) in enumerate(pairs) if _wire(a) != _wire(b)),
                min(len(r_messages), len(d_messages)),
            )
            differs(
                "messages",
                f"{len(r_messages)} recorded, {len(d_messages)} derived, first differing at "
                f"message {index + 1} ({r_digest[:19]} != {d_digest[:19]})",
                _message_json(r_messages, index), _message_json(d_messages, index),
                f"message {index + 1}",
            )  # fmt: skip
    return out


def _is_prompt_owned(message: Message) -> bool:
    """The system prompt and the runtime-context snapshots (compared as parts of their own)."""
    return isinstance(message, SystemMessage) or _is_snapshot(message)


def _requests(events: Sequence[SessionEvent]) -> list[tuple[int, int, int, int]]:
    """(turn, step, index of step/start, index of the step's first model answer) per request."""
    found: list[tuple[int, int, int, int]] = []
    open_step: tuple[int, int, int] | None = None
    for index, event in enumerate(events):
        data = event.data
        if isinstance(data, StepStart):
            open_step = (data.turn, data.step, index)
        elif event.type == "step/end":
            open_step = None
        elif open_step is not None and event.type in ("assistant/message", "assistant/attempt"):
            found.append((*open_step, index))
            open_step = None  # a retry's request is the same one again
    return found


def _answered_by(event: SessionEvent) -> EpochHeader | None:
    """A log without a ``request/header`` (an old or foreign writer): the model that answered
    is the one the step asked (the recorded config part then says the log holds none)."""
    data = event.data
    if isinstance(data, AssistantMessageData) and isinstance(data.message.source, ModelSource):
        source = data.message.source
        return EpochHeader(config=LlmCallConfig(provider=source.provider, model=source.model))
    return None


async def harness_replay(ctx: Context, session_id: str) -> HarnessReport:
    """Re-derive every model request of the stored ``session_id`` with this host and compare.

    Nothing is written and no model is called (the adapter only resolves the model's metadata,
    as before a live request). Raises what the store raises for an unknown session.
    """
    persistence = ctx.service(SESSION_PERSISTENCE)
    service = ctx.service(AGENT)
    load = await persistence.inspect(session_id)
    events = list(load.events)
    report = HarnessReport(session_id)
    for turn, step, start, answer in _requests(events):
        before = events[:answer]
        recorded_header = fold_request_header(before)
        recorded_messages = derive_messages_from_events(before)
        copy = Session.restore(load.header, events[: start + 1], mark_seed_end=False)
        agent = service.detached(copy)
        entered = [
            e.data for e in events[start + 1 : answer]
            if e.type == "user/message" and isinstance(e.data, UserMessage)
            and not _is_snapshot(e.data)
        ]  # fmt: skip
        seed = recorded_header if recorded_header is not None else _answered_by(events[answer])
        request = await agent.derive_request(turn, step, entered, seed, CancelToken())
        derived_messages = list(request.messages)
        derived_header = copy.request_header()
        differences = _compare(
            turn, step, (recorded_header, recorded_messages), (derived_header, derived_messages)
        )
        report.differences.extend(differences)
        report.steps.append({
            "turn": turn, "step": step, "identical": not differences,
            "recordedDigest": _digest(recorded_messages),
            "derivedDigest": _digest(derived_messages),
        })  # fmt: skip
    return report
