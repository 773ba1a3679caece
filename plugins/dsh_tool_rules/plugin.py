"""The ``tool-rules`` plugin: per-tool ``allow`` / ``deny`` / ``ask`` from the composition.

One ``tools/pre-execute`` listener. For each call the *first* rule whose
``tool`` glob matches the tool name decides (``fnmatch`` syntax, case
sensitive: ``*``, ``?``, ``[seq]``); with no match, ``default`` decides
(``allow`` unless configured). What each decision does in the waterfall:

``allow``
    This gate has no objection: the rest of the chain decides (``next()``).
``deny``
    Veto: ``Deny(reason)`` without consulting the rest of the chain.
``ask``
    The rest of the chain still runs; if it denies, the denial stands
    (the stricter answer wins); otherwise the call needs approval:
    ``Ask(reason)``, which the tools runtime resolves through
    ``ctx.approval`` (fail closed without it).

So this gate can only make a call *harder* to run than the rest of the chain
would, never easier. Rows mount in YAML order and an earlier row's listener is
the outer one; that changes nothing here because the gate always combines its
decision with the inner chain's.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import msgspec

from dsh_host.sdk import (
    TOOLS_PRE_EXECUTE,
    Ask,
    ConfigError,
    Context,
    Deny,
    Plugin,
    PreToolDecision,
    ToolExecution,
)

__all__ = ["Rule", "ToolRules", "ToolRulesConfig", "ToolRulesError", "default_deny_reason"]

Decision = Literal["allow", "deny", "ask"]


class Rule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One row of ``rules:``."""

    #: glob on the tool name (``write_file``, ``fs_*``, ``*``)
    tool: str
    #: what a matching call gets
    decision: Decision
    #: ``deny``: the model-visible reason (default ``tool "<name>" is denied by tool-rules``);
    #: ``ask``: the reason recorded in ``approval/asked`` and shown to the person asked.
    reason: str | None = None


class ToolRulesConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``tool-rules`` row."""

    #: checked in order; the first match wins
    rules: list[Rule] = msgspec.field(default_factory=list)
    #: the decision for a tool no rule matches
    default: Decision = "allow"


class ToolRulesError(ConfigError):
    """A rule that cannot be applied (empty glob, empty reason); names the key path."""

    code = "TOOL_RULES_CONFIG"


def default_deny_reason(tool_name: str) -> str:
    """The model-visible reason of a ``deny`` rule without its own ``reason``."""
    return f'tool "{tool_name}" is denied by tool-rules'


class _Compiled:
    __slots__ = ("decision", "pattern", "reason", "regex")

    def __init__(self, rule: Rule) -> None:
        self.pattern = rule.tool
        self.decision: Decision = rule.decision
        self.reason = rule.reason
        self.regex = re.compile(fnmatch.translate(rule.tool))


def _compile(rules: Sequence[Rule]) -> list[_Compiled]:
    compiled: list[_Compiled] = []
    for index, rule in enumerate(rules):
        if not rule.tool.strip():
            raise ToolRulesError(
                f"tool-rules: config.rules[{index}].tool must be a non-empty glob on the tool "
                'name (e.g. "write_file" or "fs_*")'
            )
        if rule.reason is not None and not rule.reason.strip():
            raise ToolRulesError(
                f"tool-rules: config.rules[{index}].reason must be a non-empty sentence when "
                "given (omit it to use the default)"
            )
        compiled.append(_Compiled(rule))
    return compiled


Next = Callable[[], Awaitable[PreToolDecision]]


class ToolRules(Plugin):
    """Gate tool calls by name: ``rules: [{tool: write_file, decision: ask}, ...]``."""

    name = "tool-rules"
    Config = ToolRulesConfig

    def apply(self, ctx: Context, config: ToolRulesConfig) -> None:
        rules = _compile(config.rules)
        default: Decision = config.default

        def match(tool_name: str) -> tuple[Decision, str | None]:
            for rule in rules:
                if rule.regex.fullmatch(tool_name):
                    return rule.decision, rule.reason
            return default, None

        async def gate(execution: ToolExecution, next_: Next) -> PreToolDecision:
            decision, reason = match(execution.name)
            if decision == "deny":
                return Deny(reason or default_deny_reason(execution.name))
            inner = await next_()
            if decision == "allow" or isinstance(inner, Deny):
                return inner
            if isinstance(inner, Ask) and reason is None:
                return inner  # keep the inner gate's reason when this rule gives none
            return Ask(reason)

        ctx.on(TOOLS_PRE_EXECUTE, gate)
