"""The ``subagents`` row's config: the child agents a parent may delegate to."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

from dsh_host.sdk import ConfigError

__all__ = [
    "SANDBOX_ORDER",
    "ChildAgentConfig",
    "SubagentsConfig",
    "SubagentsConfigError",
    "TreeBudgetConfig",
    "check_sandbox_narrowing",
]

_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

#: Sandbox modes from narrowest to widest: a child may only move left of its parent.
SANDBOX_ORDER: Final = ("read-only", "workspace-write", "danger-full-access")

SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]


class SubagentsConfigError(ConfigError):
    """The ``subagents`` row's config is invalid (names the agent and the key)."""

    code = "INVALID_SUBAGENTS_CONFIG"


class ChildAgentConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One child agent: who it is, what it may use, how far it may go."""

    name: str
    description: str
    instructions: str = ""
    #: tool names the child may see and call; None: every tool of the host but ``subagent``
    tools: list[str] | None = None
    #: model route (a provider registered with ``llm``); None: the parent's
    provider: str | None = None
    model: str | None = None
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 20
    #: the child's sandbox mode; at most the parent's (None: the parent's)
    sandbox: SandboxMode | None = None
    #: typed output (D34): a JSON Schema (the tools' subset, object-rooted); the child answers
    #: through an ``output_<name>`` tool with it as parameters, and the delegating call's
    #: result is those arguments as JSON (None: the child's last text)
    output_schema: dict[str, Any] | None = None


class TreeBudgetConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Limits summed over a turn's delegation tree: the parent's turn and every descendant (D34).

    Checked before each child model request; None: no limit of that kind.
    """

    #: model requests (steps) of the parent's turn and of every child and grandchild
    max_steps: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: tokens (input, cached and output) reported over the tree
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: dollars over the tree (fails closed: an unpriced model stops the child)
    max_cost_usd: Annotated[float, msgspec.Meta(gt=0)] | None = None


class SubagentsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """YAML ``config:`` of a ``subagents`` row."""

    agents: list[ChildAgentConfig]
    #: how deep delegation may nest (a child at depth ``max_depth`` cannot delegate)
    max_depth: Annotated[int, msgspec.Meta(ge=1)] = 2
    #: the parent's sandbox mode when no ``builtin-tools`` row says it (the front door's
    #: ``sandbox=`` and ``dsh run --sandbox`` patch that row)
    parent_sandbox: SandboxMode | None = None
    #: declared agents the top-level agent may hand the rest of its turn to (the ``handoff``
    #: tool, D34); empty: no handoff tool
    handoffs: list[str] = msgspec.field(default_factory=list)
    #: a total over each parent turn and all its descendants (None: per-agent limits only)
    budget: TreeBudgetConfig | None = None
    #: what ``dsh resume PARENT`` does with a child whose turn was interrupted: ``report`` it
    #: (outcome unknown, D24) or ``continue`` it (a new child turn whose answer is the result)
    resume: Literal["report", "continue"] = "report"

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("agents must list at least one child agent")
        seen: set[str] = set()
        for index, agent in enumerate(self.agents):
            if not _NAME_RE.match(agent.name):
                raise ValueError(
                    f"agents[{index}].name {agent.name!r} must be lowercase letters, digits, "
                    "'-' or '_' (it is what the model passes as `agent`)"
                )
            if agent.name in seen:
                raise ValueError(f"agents[{index}].name {agent.name!r} is declared twice")
            seen.add(agent.name)
            if not agent.description.strip():
                raise ValueError(f"agents[{index}] ({agent.name}): description is empty")
            if (agent.provider is None) != (agent.model is None):
                raise ValueError(
                    f"agents[{index}] ({agent.name}): give both provider and model, or neither "
                    "(the child then uses the parent's route)"
                )
        for index, target in enumerate(self.handoffs):
            if target not in seen:
                raise ValueError(
                    f"handoffs[{index}] {target!r} is not a declared agent (declared: "
                    f"{', '.join(sorted(seen))}); add it to agents or drop it from handoffs"
                )
            if target in self.handoffs[:index]:
                raise ValueError(f"handoffs[{index}] {target!r} is listed twice")


def check_sandbox_narrowing(config: SubagentsConfig, parent_mode: str | None) -> None:
    """Refuse a child whose sandbox is wider than the parent's (D24: never widen)."""
    for agent in config.agents:
        if agent.sandbox is None:
            continue
        if parent_mode is None:
            raise SubagentsConfigError(
                f'subagents: agent "{agent.name}" asks for sandbox {agent.sandbox!r}, but the '
                "parent runs without built-in tools (no sandbox mode to narrow); drop the "
                "child's sandbox key or give the parent one"
            )
        if parent_mode not in SANDBOX_ORDER:
            raise SubagentsConfigError(
                f"subagents: the parent's sandbox mode {parent_mode!r} is not one of "
                f"{', '.join(SANDBOX_ORDER)}"
            )
        if SANDBOX_ORDER.index(agent.sandbox) > SANDBOX_ORDER.index(parent_mode):
            raise SubagentsConfigError(
                f'subagents: agent "{agent.name}" asks for sandbox {agent.sandbox!r}, wider than '
                f"the parent's {parent_mode!r}; a child may only narrow its parent's "
                f"confinement (use {parent_mode!r} or a narrower mode)"
            )
