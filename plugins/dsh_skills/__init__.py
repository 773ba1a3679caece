"""``skills``: ``SKILL.md`` skills, listed by name and description, loaded whole on request.

After DSH's ``tool-skill`` with its ``skill-filesystem`` provider, reduced to one plugin:

- **Discovery** at every prompt assembly (a ``system-prompt/assemble`` listener), from the roots
  in :func:`skill_roots`, each one level deep: ``<root>/<name>/SKILL.md``. The files are reread
  (on a worker thread) only when an ``lstat`` of a path the last reading looked at differs, or
  that reading was within two seconds of a change (:class:`~dsh_host.sdk.StatMemo`). Project
  roots come first, so a project skill shadows a user skill of the same name. Files are opened
  ``O_NOFOLLOW | O_NONBLOCK`` and must be regular files of at most ``maxSkillBytes``; anything
  else (a link, a FIFO, an oversized file, front matter without a kebab-case ``name`` and a
  ``description``) is skipped, never half-read.
- **Catalog**: the model reads only names and descriptions (each description capped at
  ``catalogDescriptionMaxLength`` characters, the whole at ``maxCatalogBytes``), framed in DSH's
  catalog text, as the runtime context ``workspace:skills``. It is logged exactly as
  ``AGENTS.md`` is (the runtime-context snapshot the loop appends when the text changes), so
  ``dsh sessions show --view model`` shows the catalog the model saw.
- **Loading**: the ``skill`` tool (DSH's name) rereads the file and returns its body in DSH's
  ``<skill_content>`` frame with the skill's directory as the resource base; the result is the
  ``tool/result`` the log keeps. Scripts a skill ships are not run by this plugin: the model runs
  them with ``bash``, under the sandbox and approval like any other command.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import anyio.to_thread
import msgspec
import yaml

from dsh_host.sdk import (
    TOOLS,
    AssembleContext,
    AssembledContext,
    Context,
    EventMode,
    Plugin,
    PromptAssembly,
    StatMemo,
    ToolDefinition,
    ToolError,
    ToolExecution,
    Watched,
    config_home,
    text_output,
)

__all__ = [
    "CONTEXT_NAME",
    "Skill",
    "SkillError",
    "Skills",
    "SkillsConfig",
    "discover",
    "render_catalog",
    "render_skill",
    "skill_roots",
]

PLUGIN_NAME: Final = "skills"
#: The runtime context's name in the assembly.
CONTEXT_NAME: Final = "workspace:skills"
TOOL_NAME: Final = "skill"
SKILL_FILE: Final = "SKILL.md"
#: DSH's skill names: kebab-case.
NAME_PATTERN: Final = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
#: Project skill directories, relative to the project root (Codex/agents first, then Claude Code).
PROJECT_SKILL_DIRS: Final = (".agents/skills", ".claude/skills")

CATALOG_OPEN: Final = (
    "<system-reminder>\nA skill is a reusable set of task-specific instructions. The following "
    "skills are available in this session:\n\n<available_skills>\n"
)
CATALOG_CLOSE: Final = (
    "</available_skills>\n\nIf the user names a skill, or the task clearly matches a skill's "
    "description, call the `skill` tool with the exact skill name before taking task actions. "
    "Load all applicable skills, then follow their full instructions. This catalog contains "
    "summaries only; do not infer or follow a skill's instructions until it has been loaded.\n"
    "</system-reminder>"
)
SKILL_DESCRIPTION: Final = (
    "Load a skill's full instructions by its exact name from the available skills listing. "
    "Call it before acting on a task a skill's description matches."
)


class SkillsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``skills`` row (camelCase accepted)."""

    #: a SKILL.md larger than this is skipped (never truncated: half a procedure is worse)
    max_skill_bytes: int = 65_536
    #: each catalog description is cut to this many characters (DSH's default)
    catalog_description_max_length: int = 500
    #: the most UTF-8 bytes of the whole catalog; skills past it are left out and counted
    max_catalog_bytes: int = 8_000
    #: read the user's skill directories too (see :func:`skill_roots`)
    include_user_skills: bool = True
    #: extra skill roots (absolute, or relative to the project root), after the project's
    custom_skill_dirs: tuple[str, ...] = ()
    #: a directory holding one of these names is the project root
    project_root_markers: tuple[str, ...] = (".git",)

    def __post_init__(self) -> None:
        for field, low in (
            ("max_skill_bytes", 1),
            ("catalog_description_max_length", 3),
            ("max_catalog_bytes", 1),
        ):
            value = getattr(self, field)
            if value < low:
                camel = field.split("_")[0] + "".join(p.title() for p in field.split("_")[1:])
                raise ValueError(f"{camel} must be an integer of at least {low}, got {value}")


class SkillError(ToolError):
    """A ``skill`` call the plugin cannot answer; the model reads the message."""

    code: ClassVar[str] = "SKILL_ERROR"


@dataclass(frozen=True, slots=True)
class Skill:
    """One discovered skill: what the catalog shows and where its file is."""

    name: str
    description: str
    directory: str
    path: str


def project_root(cwd: str, markers: tuple[str, ...], watched: Watched | None = None) -> str:
    """The nearest directory at or above ``cwd`` holding a marker, else ``cwd`` itself; what
    decided it is noted in ``watched``."""
    watched = watched if watched is not None else Watched()
    here = start = watched.realpath(cwd)
    while not any(watched.exists(os.path.join(here, marker)) for marker in markers):
        parent = os.path.dirname(here)
        if parent == here:
            return start
        here = parent
    return here


#: The environment variables :func:`user_skill_dirs` (and ``~`` in ``customSkillDirs``) read.
USER_ROOTS_ENVIRONMENT: Final = ("DSH_AGENTS_HOME", "HOME", "XDG_CONFIG_HOME")


def user_skill_dirs() -> tuple[str, ...]:
    """The user's skill roots: dsh's own (``$XDG_CONFIG_HOME/dsh/skills``, beside
    ``config.yml``) and the shared agents root (``~/.agents/skills``, DSH's ``agentsHome``
    that Codex-style tools also read), so one copy serves every agent a user runs."""
    agents_home = os.environ.get("DSH_AGENTS_HOME") or os.path.expanduser("~/.agents")
    return (str(config_home() / "dsh" / "skills"), os.path.join(agents_home, "skills"))


def skill_roots(cwd: str, config: SkillsConfig, watched: Watched | None = None) -> list[str]:
    """Every root in precedence order: the project's, the custom ones, then the user's."""
    root = project_root(cwd, config.project_root_markers, watched)
    roots = [os.path.join(root, rel) for rel in PROJECT_SKILL_DIRS]
    roots += [os.path.join(root, os.path.expanduser(d)) for d in config.custom_skill_dirs]
    if config.include_user_skills:
        roots += user_skill_dirs()
    return roots


def _read_regular(path: str, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of ``path`` when it is a regular file (a link is not
    followed, a FIFO does not block), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit + 1)
    finally:
        os.close(fd)


def parse_skill(text: str) -> tuple[dict[str, Any], str] | None:
    """``(front matter, body)`` of a SKILL.md, or None when it has no YAML mapping on top."""
    if not text.startswith("---"):
        return None
    lines = text.split("\n")
    if lines[0].strip() != "---":
        return None
    for index in range(1, len(lines)):
        if lines[index].strip() in ("---", "..."):
            try:
                meta = yaml.safe_load("\n".join(lines[1:index]))
            except yaml.YAMLError:
                return None
            if not isinstance(meta, dict):
                return None
            return meta, "\n".join(lines[index + 1 :]).lstrip("\n")
    return None


def _load(path: str, limit: int) -> tuple[dict[str, Any], str] | None:
    data = _read_regular(path, limit)
    if data is None or len(data) > limit:
        return None
    return parse_skill(data.decode("utf-8", "replace"))


def _summary(meta: dict[str, Any], directory: str, path: str) -> Skill | None:
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return None
    if not isinstance(description, str) or not description.strip():
        return None
    if meta.get("disable-model-invocation") is True:
        return None
    return Skill(name, " ".join(description.split()), directory, path)


def discover(cwd: str, config: SkillsConfig, watched: Watched | None = None) -> list[Skill]:
    """The model-invocable skills, sorted by name; the first root holding a name wins. Every
    path looked at is noted in ``watched`` before it is listed or read."""
    watched = watched if watched is not None else Watched()
    found: dict[str, Skill] = {}
    for root in skill_roots(cwd, config, watched):
        watched.note(root, follow=True)
        try:
            entries = sorted(os.listdir(root))
        except OSError:
            continue
        for entry in entries:
            directory = os.path.join(root, entry)
            path = os.path.join(directory, SKILL_FILE)
            watched.note(directory, content=False)
            watched.note(path)
            loaded = _load(path, config.max_skill_bytes)
            if loaded is None:
                continue
            skill = _summary(loaded[0], directory, path)
            if skill is not None and skill.name not in found:
                found[skill.name] = skill
    return sorted(found.values(), key=lambda s: s.name)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cap(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 3] + "..."


def render_catalog(skills: list[Skill], config: SkillsConfig) -> str:
    """The catalog text ("" without skills); entries past ``maxCatalogBytes`` are left out and
    a last line says how many."""
    if not skills:
        return ""
    budget = config.max_catalog_bytes - len((CATALOG_OPEN + CATALOG_CLOSE).encode())
    lines: list[str] = []
    for index, skill in enumerate(skills):
        line = (
            f"- `{skill.name}`: "
            f"{_escape(_cap(skill.description, config.catalog_description_max_length))}\n"
        )
        left = len(skills) - index
        notice = f"- ({left} more skills not listed: the catalog budget is full)\n"
        if len(line.encode()) + len(notice.encode()) > budget:
            lines.append(notice)
            break
        lines.append(line)
        budget -= len(line.encode())
    return CATALOG_OPEN + "".join(lines) + CATALOG_CLOSE


def render_skill(skill: Skill, body: str) -> str:
    """The ``skill`` tool's result: DSH's ``<skill_content>`` frame, directory guidance."""
    return (
        f'<skill_content name="{_escape(skill.name)}">\n<skill_resources>\n'
        f"Base directory for this skill: {skill.directory}\n"
        "Resolve relative paths mentioned by this skill against the base directory before "
        "using them. Load referenced resources only as needed.\n</skill_resources>\n\n"
        f"<skill_instructions>\n{body}\n</skill_instructions>\n</skill_content>"
    )


def _session_cwd(agent: Any) -> str | None:
    header = getattr(getattr(agent, "session", None), "header", None)
    cwd = getattr(header, "cwd", None)
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None


def load_skill(cwd: str, name: str, config: SkillsConfig) -> str:
    """The ``skill`` result for ``name``, reread now; :class:`SkillError` names what failed."""
    if not NAME_PATTERN.match(name):
        raise SkillError(f'invalid skill name "{name}"')
    for skill in discover(cwd, config):
        if skill.name == name:
            loaded = _load(skill.path, config.max_skill_bytes)
            if loaded is None or _summary(loaded[0], skill.directory, skill.path) != skill:
                break  # changed since discovery: the next catalog tells the model
            return render_skill(skill, loaded[1])
    raise SkillError(f'skill "{name}" is unknown or no longer available')


def skill_tool(config: SkillsConfig) -> ToolDefinition:
    """The ``skill`` tool: one argument, the exact name from the catalog."""

    async def execute(args: Any, exec: ToolExecution) -> str:
        cwd = _session_cwd(exec.agent) or os.getcwd()
        name = str(args["name"])
        return await anyio.to_thread.run_sync(load_skill, cwd, name, config)

    return ToolDefinition(
        name=TOOL_NAME,
        description=SKILL_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Exact kebab-case skill name from the available skills listing.",
                }
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        execute=execute,
        output=text_output(),
        is_concurrency_safe=lambda _args: True,
    )


class Skills(Plugin):
    """Entry point ``skills`` (DSH: ``@deepseek-ai/dsh-tool-skill`` + ``dsh-skill-filesystem``)."""

    name = PLUGIN_NAME
    inject = ("tools",)
    #: a skill's scripts run through ``bash``, confined
    runs_confined = True
    Config = SkillsConfig

    def apply(self, ctx: Context, config: SkillsConfig) -> None:
        ctx.declare_event("system-prompt/assemble", EventMode.WATERFALL, 1)
        ctx.service(TOOLS).register(skill_tool(config), owner=ctx)

        def catalog(key: tuple[str | None, ...], watched: Watched) -> str:
            return render_catalog(discover(str(key[0]), config, watched), config)

        catalogs = StatMemo(catalog)

        async def assemble(
            context: AssembleContext, next_: Callable[[], Awaitable[PromptAssembly]]
        ) -> Any:
            assembly = await next_()
            cwd = _session_cwd(context.agent)
            if cwd is None:
                return assembly
            # The user's roots come from the environment: a change there is another key.
            environ = os.environ
            key = (cwd, *(environ.get(name) for name in USER_ROOTS_ENVIRONMENT))
            text = await catalogs.get(key)
            if text:
                if "{{" in text:  # the prompt interpolates {{name}}: keep the text literal
                    text = text.replace("{{", "{{skills_open_braces}}")
                    assembly.variables["skills_open_braces"] = "{{"
                assembly.contexts.append(AssembledContext(CONTEXT_NAME, text))
            return assembly

        ctx.on("system-prompt/assemble", assemble)
