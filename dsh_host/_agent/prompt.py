"""A minimal system-prompt service: ordered sections, runtime contexts, variables.

What the model reads besides the history has two parts with different cache
behaviour (``dsh-system-prompt`` in DSH):

* **Sections** render the system prompt: concatenated in ascending ``order``
  (``-100`` harness identity, ``0`` deployment persona, ``100-199`` tool
  guidance), ``{{variable}}`` references interpolated strictly, empty sections
  dropped, joined by blank lines. It changes rarely, so it stays a stable
  cache prefix. In the v3 log it is a ``system/message`` surface node (the
  request header no longer carries it).
* **Runtime contexts** are facts that may change during a session (the
  approval policy, ...). They are *not* put in the system prompt: the loop
  appends them as a sourced ``user/message`` snapshot after the retained
  history, and only when the snapshot differs from the last one, so a policy
  switch costs one message instead of a cache miss on the whole prefix.

Registrations come from two places: direct calls on this service
(``ctx.agent.system_prompt.context(...)``, pass ``owner=ctx`` to tie them to
your plugin) and the ``system-prompt/assemble`` waterfall, which a plugin can
listen to whether or not the agent row is mounted yet (declare the event with
the same mode and ``ctx.on`` it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from msgspec import UNSET

from dsh_host._cancel import CancelToken
from dsh_host._session.events import (
    ReplaceOp,
    SessionEvent,
    SystemMessageData,
)
from dsh_host._session.messages import (
    PluginSource,
    SystemMessage,
    TextBlock,
    UserMessage,
    new_message_id,
)
from dsh_host._tools.keys import TOOLS

from .errors import PromptError
from .keys import SYSTEM_PROMPT_ASSEMBLE
from .types import (
    AssembleContext,
    AssembledContext,
    AssembledSection,
    PromptAssembly,
    TextProvider,
)

if TYPE_CHECKING:
    from dsh_host._context import Context
    from dsh_host._session.session import Session

    from .loop import Agent

__all__ = [
    "CONTEXT_CLEARED",
    "CONTEXT_HEADER",
    "HARNESS_IDENTITY",
    "PROMPT_SOURCE",
    "PromptRenderer",
    "RuntimeContextProjection",
    "SystemMessageProjection",
    "SystemPrompt",
    "join_context_sections",
    "render_context_sections",
    "render_prompt",
]

#: The source plugin name of prompt-owned messages (snapshots, system messages), as DSH writes it.
PROMPT_SOURCE: Final = "@deepseek-ai/dsh-system-prompt"
HARNESS_IDENTITY: Final = "You are an AI agent powered by DeepSeek Harness."
CONTEXT_HEADER: Final = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
)
CONTEXT_CLEARED: Final = (
    "Current runtime context: none. Earlier runtime-context snapshots no longer apply."
)
PERSONA_SECTION: Final = "deployment:persona"

_VARIABLE_NAME: Final = re.compile(r"^[a-z][a-z0-9_]*$")
_GROUP_AT: Final = re.compile(r"\{\{([^{}]*)\}\}")


@dataclass(slots=True)
class _Entry:
    name: str
    order: float
    text: TextProvider
    seq: int


VariableProvider = Callable[[AssembleContext], "str | None"]


class SystemPrompt:
    """The prompt registry (``ctx.agent.system_prompt``)."""

    def __init__(
        self,
        ctx: Context,
        *,
        identity: bool = True,
        persona: str = "",
        include_runtime_context: bool = True,
    ) -> None:
        self._ctx = ctx
        self._sections: dict[str, _Entry] = {}
        self._contexts: dict[str, _Entry] = {}
        self._variables: dict[str, VariableProvider] = {}
        self._seq = 0
        self._include_runtime_context = include_runtime_context
        if identity:
            self.section("harness:identity", -100, HARNESS_IDENTITY)
        if persona:
            self.section(PERSONA_SECTION, 0, persona)

    # ------------------------------------------------------------------ registration
    def section(
        self, name: str, order: float, text: TextProvider, *, owner: Context | None = None
    ) -> Callable[[], None]:
        """Contribute a system-prompt section (unique ``name``); returns its disposer."""
        return self._add(self._sections, "prompt section", name, order, text, owner)

    def context(
        self, name: str, order: float, text: TextProvider, *, owner: Context | None = None
    ) -> Callable[[], None]:
        """Contribute a runtime context (rendered into the per-step snapshot)."""
        return self._add(self._contexts, "prompt context", name, order, text, owner)

    def variable(
        self, name: str, provider: VariableProvider, *, owner: Context | None = None
    ) -> Callable[[], None]:
        """Contribute ``{{name}}``; ``provider(context)`` returning None means "no value"."""
        if not _VARIABLE_NAME.match(name):
            raise PromptError(
                f'prompt variable name "{name}" cannot be referenced; names match '
                f"{_VARIABLE_NAME.pattern}"
            )
        if name in self._variables:
            raise PromptError(f'prompt variable "{name}" is already registered')
        self._variables[name] = provider

        def remove() -> None:
            if self._variables.get(name) is provider:
                del self._variables[name]

        if owner is not None:
            owner.effect(remove, f"prompt variable {name}")
        return remove

    def _add(
        self,
        table: dict[str, _Entry],
        what: str,
        name: str,
        order: float,
        text: TextProvider,
        owner: Context | None,
    ) -> Callable[[], None]:
        if not isinstance(name, str) or not name:
            raise PromptError(f"a {what} needs a non-empty name")
        if name in table:
            raise PromptError(f'{what} "{name}" is already registered')
        if (
            isinstance(order, bool)
            or not isinstance(order, int | float)
            or not math.isfinite(order)
        ):
            raise PromptError(f'{what} "{name}" order must be a finite number, got {order!r}')
        if not (isinstance(text, str) or callable(text)):
            raise PromptError(f'{what} "{name}" text must be a string or a callable')
        self._seq += 1
        entry = _Entry(name, float(order), text, self._seq)
        table[name] = entry

        def remove() -> None:
            if table.get(name) is entry:
                del table[name]

        if owner is not None:
            owner.effect(remove, f"{what} {name}")
        return remove

    # ------------------------------------------------------------------ assembly
    async def assemble(
        self, agent: Agent | None = None, signal: CancelToken | None = None
    ) -> PromptAssembly:
        """Resolve every section, context, variable and the tool schemas for one step.

        Runs the ``system-prompt/assemble`` waterfall: a listener gets the
        :class:`AssembleContext`, may ``await next()`` for the registry's
        assembly and change it. Runtime contexts are dropped afterwards when the
        row disables them (``includeRuntimeContext: false``).
        """
        context = AssembleContext(agent=agent, signal=signal)

        async def default() -> PromptAssembly:
            return self._collect(context)

        assembly = await self._ctx.waterfall(SYSTEM_PROMPT_ASSEMBLE, context, default)
        if not isinstance(assembly, PromptAssembly):
            raise PromptError(
                f"a system-prompt/assemble listener returned {assembly!r}; return the "
                "PromptAssembly (usually the value of `await next()`)"
            )
        if not self._include_runtime_context:
            assembly.contexts.clear()
        return assembly

    def _collect(self, context: AssembleContext) -> PromptAssembly:
        sections = [
            AssembledSection(entry.name, _resolve(entry, context, "section"))
            for entry in sorted(self._sections.values(), key=lambda e: (e.order, e.seq))
        ]
        contexts: list[AssembledContext] = []
        if self._include_runtime_context:
            contexts = [
                AssembledContext(entry.name, _resolve(entry, context, "context"))
                for entry in sorted(self._contexts.values(), key=lambda e: (e.order, e.seq))
            ]
        variables: dict[str, str | None] = {}
        for name, provider in self._variables.items():
            value = provider(context)
            if value is not None and not isinstance(value, str):
                raise PromptError(f'prompt variable "{name}" provider returned {value!r}')
            variables[name] = value
        tools = self._ctx.get(TOOLS)
        schemas = list(tools.schemas()) if tools is not None else []
        return PromptAssembly(
            sections=sections, contexts=contexts, tools=schemas, variables=variables
        )


def _resolve(entry: _Entry, context: AssembleContext, kind: str) -> str:
    text = entry.text(context) if callable(entry.text) else entry.text
    if not isinstance(text, str):
        raise PromptError(f'prompt {kind} "{entry.name}" provider returned {text!r}, not a string')
    return text


def _interpolate(name: str, text: str, variables: dict[str, str | None], kind: str) -> str:
    """Strict ``{{variable}}`` interpolation (DSH's rules and messages)."""
    out: list[str] = []
    last = 0
    open_at = text.find("{{")
    while open_at >= 0:
        group = _GROUP_AT.match(text, open_at)
        if group is None:
            if text.find("}}", open_at + 2) >= 0:
                raise PromptError(
                    f'malformed prompt variable reference at "{text[open_at : open_at + 16]}…" in '
                    f'{kind} "{name}" (references are complete simple {{{{name}}}} groups)'
                )
            out.append(text[last : open_at + 2])
            last = open_at + 2
            open_at = text.find("{{", last)
            continue
        variable = group.group(1)
        if not _VARIABLE_NAME.match(variable):
            raise PromptError(
                f'malformed prompt variable reference "{{{{{variable}}}}}" in {kind} "{name}" '
                f"(variable names match {_VARIABLE_NAME.pattern})"
            )
        if variable not in variables:
            known = ", ".join(variables) or "(none)"
            raise PromptError(
                f'unknown prompt variable "{{{{{variable}}}}}" in {kind} "{name}"; registered '
                f"variables: {known}"
            )
        value = variables[variable]
        if value is None:
            raise PromptError(
                f'prompt variable "{{{{{variable}}}}}" has no value for this assembly '
                f'({kind} "{name}")'
            )
        out.append(text[last:open_at])
        out.append(value)
        last = group.end()
        open_at = text.find("{{", last)
    out.append(text[last:])
    return "".join(out)


def render_prompt(assembly: PromptAssembly) -> str:
    """The system prompt: interpolated sections, empty ones dropped, blank-line joined."""
    texts = [
        _interpolate(section.name, section.text, assembly.variables, "section")
        for section in assembly.sections
    ]
    return "\n\n".join(text for text in texts if text)


class PromptRenderer:
    """:func:`render_prompt` for one agent, step after step: the text rendered last is reused
    while the sections (names and texts) and the variables are equal to the last ones
    (docs/decisions.md D49). Plugins hand out the same strings while their files are
    unchanged, so the comparison is mostly by identity; interpolating every section again
    at every step was the same text at ~10 µs a step."""

    __slots__ = ("_key", "_text")

    def __init__(self) -> None:
        self._key: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str | None], ...]] | None
        self._key = None
        self._text = ""

    def __call__(self, assembly: PromptAssembly) -> str:
        key = (
            tuple((section.name, section.text) for section in assembly.sections),
            tuple(assembly.variables.items()),
        )
        if key != self._key:
            # Rendered first, remembered after: a refused reference raises every time.
            self._text = render_prompt(assembly)
            self._key = key
        return self._text


def render_context_sections(assembly: PromptAssembly) -> list[dict[str, str]]:
    """The non-empty runtime contexts, interpolated, as ``{name, text}`` records."""
    rendered = [
        {
            "name": context.name,
            "text": _interpolate(context.name, context.text, assembly.variables, "context"),
        }
        for context in assembly.contexts
    ]
    return [section for section in rendered if section["text"]]


def join_context_sections(sections: list[dict[str, str]]) -> str:
    """The snapshot text, or ``""`` when no context is active."""
    body = "\n\n".join(section["text"] for section in sections)
    return f"{CONTEXT_HEADER}\n\n{body}" if body else ""


def _owned(message: Any) -> bool:
    source = getattr(message, "source", None)
    return isinstance(source, PluginSource) and source.plugin == PROMPT_SOURCE


def _single_text(content: tuple[Any, ...]) -> str | None:
    if len(content) == 1 and isinstance(content[0], TextBlock):
        return content[0].text
    return None


class RuntimeContextProjection:
    """Tracks the last retained runtime-context snapshot of a session, incrementally.

    ``retained`` is ``_NEVER`` while no snapshot ever existed, None while one
    existed but is no longer on the surface (a replacement shadowed it), else
    ``(seq, text)``.
    """

    _NEVER: Final = object()

    def __init__(self, session: Session) -> None:
        self._session = session
        self._scanned = 0
        self._retained: Any = self._NEVER

    def _catch_up(self) -> None:
        events = self._session.events
        for event in events.iter_from(self._scanned):  # page by page (docs/decisions.md D46)
            self._observe(event)
        self._scanned = len(events)

    def _observe(self, event: SessionEvent) -> None:
        if event.type == "user/message" and _owned(event.data):
            self._retained = (event.seq, _single_text(event.data.content))
            return
        op = event.surface_op
        retained = self._retained
        if (
            isinstance(op, ReplaceOp)
            and isinstance(retained, tuple)
            and event.source_event_seqs is not UNSET
            and retained[0] in event.source_event_seqs
        ):
            self._retained = None

    def project(self, current: str, sections: list[dict[str, str]]) -> UserMessage | None:
        """A snapshot message to append, or None when the retained one is still right."""
        self._catch_up()
        if self._retained is self._NEVER and not current:
            return None
        snapshot = current or CONTEXT_CLEARED
        if isinstance(self._retained, tuple) and self._retained[1] == snapshot:
            return None
        source = (
            PluginSource(plugin=PROMPT_SOURCE, form="snapshot", sections=tuple(sections))
            if sections
            else PluginSource(plugin=PROMPT_SOURCE)
        )
        return UserMessage(id=new_message_id(), content=(TextBlock(text=snapshot),), source=source)


class SystemMessageProjection:
    """Keeps the session's ``system/message`` surface node equal to the rendered prompt.

    The first non-empty prompt is appended (it is the head of a new
    session's history); a changed prompt *replaces* the current node, so it
    stays at the head and the history after it is untouched.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self._scanned = 0
        self._current: tuple[int, str] | None = None

    def _catch_up(self) -> None:
        events = self._session.events
        for event in events.iter_from(self._scanned):  # page by page (docs/decisions.md D46)
            data = event.data
            if event.type == "system/message" and isinstance(data, SystemMessageData):
                text = "".join(
                    block.text for block in data.message.content if isinstance(block, TextBlock)
                )
                self._current = (event.seq, text)
            elif (
                isinstance(event.surface_op, ReplaceOp)
                and self._current is not None
                and event.source_event_seqs is not UNSET
                and self._current[0] in event.source_event_seqs
            ):
                self._current = None
        self._scanned = len(events)

    def project(
        self, rendered: str, turn: int, step: int
    ) -> tuple[SystemMessageData, Literal["append"] | ReplaceOp, tuple[int, ...] | None] | None:
        """The ``system/message`` to append (data, surface op, cited seqs), or None."""
        self._catch_up()
        current = self._current
        if current is None and not rendered:
            return None
        if current is not None and current[1] == rendered:
            return None
        message = SystemMessage(
            id=new_message_id(),
            content=(TextBlock(text=rendered),) if rendered else (),
            source=PluginSource(plugin=PROMPT_SOURCE),
        )
        data = SystemMessageData(turn=turn, step=step, message=message)
        if current is None:
            return data, "append", None
        return data, ReplaceOp(start=current[0], end=current[0]), (current[0],)
