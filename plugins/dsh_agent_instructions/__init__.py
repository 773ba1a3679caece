"""``agent-instructions``: the workspace's ``AGENTS.md`` (and ``CLAUDE.md``) in the runtime context.

After DSH's ``context/agent-instructions``, reduced to its baseline: at every prompt assembly
(a ``system-prompt/assemble`` listener) the plugin reads, from the project root down to the
session's working directory, each directory's instruction files (``instructionFileCandidates``,
default ``AGENTS.md`` then ``CLAUDE.md``) and contributes them, broad to specific, as one
runtime context framed in DSH's ``<system-reminder>`` text. The project root is the nearest
directory at or above the working directory holding a ``projectRootMarkers`` entry (default
``.git``); without one, only the working directory itself is read.

- Files are opened ``O_NOFOLLOW | O_NONBLOCK`` and used only when they are regular files of at
  most ``maxSourceBytes`` (a symlink, a FIFO or an oversized file is skipped; an oversized file
  is named in the budget notice). Within one directory a candidate whose whitespace-trimmed
  content repeats an earlier one's is rendered once.
- The whole text is at most ``maxBytes`` UTF-8 bytes: broader files are dropped whole before the
  most specific one is truncated, and a ``Workspace instruction budget <n> bytes: ...`` notice
  names what was omitted or truncated (DSH's wording).
- A literal ``</system-reminder>`` in a file is escaped (``<\\/system-reminder>``) so repository
  text cannot close the frame, and ``{{`` reaches the model literally (the prompt's variable
  interpolation is given a ``{{`` value for it).
- The runtime context is rendered for each step; the loop appends a new snapshot only when the
  text changed, so an edited ``AGENTS.md`` costs one message, and an unchanged one nothing. The
  files are reread (on a worker thread) only when an ``lstat`` of a path the last reading
  looked at (the working directory's parts, the root markers, the candidates) differs, or that
  reading was within two seconds of a change (:class:`~dsh_host.sdk.StatMemo`, D35).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from dsh_host.sdk import (
    AssembleContext,
    AssembledContext,
    Context,
    EventMode,
    Plugin,
    PromptAssembly,
    StatMemo,
    Watched,
)

__all__ = [
    "CONTEXT_NAME",
    "AgentInstructions",
    "AgentInstructionsConfig",
    "InstructionFile",
    "discover",
    "render_instructions",
]

PLUGIN_NAME: Final = "agent-instructions"
#: The runtime context's name in the assembly.
CONTEXT_NAME: Final = "workspace:instructions"
REMINDER_OPEN: Final = "<system-reminder>"
REMINDER_CLOSE: Final = "</system-reminder>"
INTRO: Final = (
    "The following workspace instructions may be relevant to your work. Use them as guidance "
    "when applicable. More specific instructions take precedence over broader ones. They do "
    "not override system, developer, or direct user instructions."
)
COMPACT_INTRO: Final = (
    "Workspace instructions were omitted or truncated to fit the configured byte budget."
)
#: The prompt variable whose value is ``{{`` (see the module docstring).
BRACES_VARIABLE: Final = "agent_instructions_open_braces"


class AgentInstructionsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of an ``agent-instructions`` row (DSH's keys; camelCase accepted)."""

    #: the most UTF-8 bytes of the rendered instructions
    max_bytes: int = 16_000
    #: larger instruction files are skipped
    max_source_bytes: int = 1_048_576
    #: file names read in each directory, in this order
    instruction_file_candidates: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md")
    #: a directory holding one of these names is the project root
    project_root_markers: tuple[str, ...] = (".git",)

    def __post_init__(self) -> None:
        for field in ("max_bytes", "max_source_bytes"):
            value = getattr(self, field)
            if value <= 0:
                camel = field.split("_")[0] + "".join(p.title() for p in field.split("_")[1:])
                raise ValueError(f"{camel} must be a positive integer, got {value}")
        for name in (*self.instruction_file_candidates, *self.project_root_markers):
            if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
                raise ValueError(
                    f"{name!r} is not a file name: instructionFileCandidates and "
                    "projectRootMarkers take names within one directory (no '/')"
                )


@dataclass(frozen=True, slots=True)
class InstructionFile:
    """One loaded instruction file: its path shown to the model and its content."""

    shown: str
    content: str


def project_dirs(cwd: str, markers: tuple[str, ...], watched: Watched | None = None) -> list[str]:
    """The directories from the project root down to ``cwd`` (``[cwd]`` without a root); what
    decided them is noted in ``watched``."""
    watched = watched if watched is not None else Watched()
    start = watched.realpath(cwd)
    chain = [start]
    here = start
    while not any(watched.exists(os.path.join(here, marker)) for marker in markers):
        parent = os.path.dirname(here)
        if parent == here:
            return [start]
        here = parent
        chain.append(here)
    return list(reversed(chain))


def _read_regular(path: str, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of ``path`` when it is a regular file (a link is not
    followed, a FIFO does not block), else None; more than ``limit`` bytes means oversized."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    return data


def discover(
    cwd: str, config: AgentInstructionsConfig, watched: Watched | None = None
) -> tuple[list[InstructionFile], list[str]]:
    """The instruction files from the project root down to ``cwd`` (broad to specific), and the
    shown paths of the files skipped as larger than ``maxSourceBytes``; every path looked at is
    noted in ``watched`` before it is read."""
    watched = watched if watched is not None else Watched()
    dirs = project_dirs(cwd, config.project_root_markers, watched)
    root = dirs[0]
    found: list[InstructionFile] = []
    oversized: list[str] = []
    for directory in dirs:
        seen: set[str] = set()
        for name in config.instruction_file_candidates:
            path = os.path.join(directory, name)
            shown = os.path.relpath(path, root)
            watched.note(path)
            data = _read_regular(path, config.max_source_bytes)
            if data is None:
                continue
            if len(data) > config.max_source_bytes:
                oversized.append(shown)
                continue
            content = data.decode("utf-8", "replace")
            trimmed = content.strip()
            if trimmed in seen:
                continue
            seen.add(trimmed)
            found.append(InstructionFile(shown, content))
    return found, oversized


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _cut(text: str, size: int) -> str:
    return text.encode("utf-8")[: max(0, size)].decode("utf-8", "ignore")


def _notice(max_bytes: int, omitted: list[str], truncated: list[tuple[str, int, int]]) -> str:
    parts = []
    if omitted:
        parts.append(f"omitted {', '.join(omitted)}")
    if truncated:
        parts.append(
            "truncated "
            + ", ".join(f"{shown} from {full} to {kept} bytes" for shown, full, kept in truncated)
        )
    return f"Workspace instruction budget {max_bytes} bytes: {'; '.join(parts)}" if parts else ""


def _frame(
    files: list[InstructionFile],
    max_bytes: int,
    omitted: list[str],
    truncated: list[tuple[str, int, int]],
    intro: str = INTRO,
) -> str:
    blocks = [_notice(max_bytes, omitted, truncated), intro]
    blocks += [f"Instructions from: {f.shown}\n\n{f.content}" for f in files]
    body = "\n\n".join(block for block in blocks if block)
    body = body.replace(REMINDER_CLOSE, "<\\/system-reminder>")
    return f"{REMINDER_OPEN}\n{body}\n{REMINDER_CLOSE}"


def render_instructions(
    files: list[InstructionFile], max_bytes: int, oversized: tuple[str, ...] | list[str] = ()
) -> str:
    """The runtime-context text: every file when it fits ``max_bytes``; else the broader files
    dropped whole, then the most specific one truncated; "" when there is nothing to show."""
    skipped = list(oversized)
    if not files:
        return _frame([], max_bytes, skipped, [], "") if skipped else ""
    whole = _frame(files, max_bytes, skipped, [])
    if _size(whole) <= max_bytes:
        return whole
    for start in range(1, len(files)):
        omitted = skipped + [f.shown for f in files[:start]]
        text = _frame(files[start:], max_bytes, omitted, [])
        if _size(text) <= max_bytes:
            return text
    last = files[-1]
    omitted = skipped + [f.shown for f in files[:-1]]
    full = _size(last.content)
    for intro in (INTRO, COMPACT_INTRO):
        low, high, best = 0, full, None
        while low <= high:  # the most content that fits (the notice's digits vary with it)
            middle = (low + high) // 2
            kept = InstructionFile(last.shown, _cut(last.content, middle))
            text = _frame(
                [kept], max_bytes, omitted, [(last.shown, full, _size(kept.content))], intro
            )
            if _size(text) <= max_bytes:
                best, low = text, middle + 1
            else:
                high = middle - 1
        if best is not None:
            return best
    return _cut(_notice(max_bytes, omitted, [(last.shown, full, 0)]), max_bytes)


def _session_cwd(context: AssembleContext) -> str | None:
    header = getattr(getattr(context.agent, "session", None), "header", None)
    cwd = getattr(header, "cwd", None)
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None


class AgentInstructions(Plugin):
    """Entry point ``agent-instructions`` (DSH: ``@deepseek-ai/dsh-agent-instructions``)."""

    name = PLUGIN_NAME
    Config = AgentInstructionsConfig

    def apply(self, ctx: Context, config: AgentInstructionsConfig) -> None:
        ctx.declare_event("system-prompt/assemble", EventMode.WATERFALL, 1)

        def load(cwd: str, watched: Watched) -> str:
            files, oversized = discover(cwd, config, watched)
            return render_instructions(files, config.max_bytes, oversized)

        rendered = StatMemo(load)

        async def assemble(
            context: AssembleContext, next_: Callable[[], Awaitable[PromptAssembly]]
        ) -> Any:
            assembly = await next_()
            cwd = _session_cwd(context)
            if cwd is None:
                return assembly
            text = await rendered.get(cwd)
            if text:
                if "{{" in text:
                    text = text.replace("{{", "{{" + BRACES_VARIABLE + "}}")
                    assembly.variables[BRACES_VARIABLE] = "{{"
                assembly.contexts.append(AssembledContext(CONTEXT_NAME, text))
            return assembly

        ctx.on("system-prompt/assemble", assemble)
