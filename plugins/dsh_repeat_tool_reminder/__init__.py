"""``repeat-tool-reminder``: nudge a model that repeats the same tool call (DSH's loop-breaker).

An advisory guard, never a veto. A ``tools/post-execute`` listener counts, per
agent, runs of consecutive calls to the same tool with identical canonical
arguments (deep key-sorted compact JSON). When a run reaches one of the
configured ``thresholds`` it adds a reminder to the call's decision as an
additional context: the loop appends it as a ``user/message`` (source
``{kind: plugin, plugin: repeat-tool-reminder, form: notice}``) after the
step's tool results, so the model reads it in the next request and the log
records it; the ``tool/result`` itself is left as the tool produced it.

- the first threshold gets DSH's short generic reminder, every later one the
  detailed form naming the tool, the run length and the arguments (quoted up to
  ``arguments_preview_chars``; detection always compares the full string);
- calls excluded by ``include`` / ``exclude`` (``*`` wildcards) are transparent:
  they neither count nor reset the run;
- denied calls count (they reach post-execute too); calls without an agent and
  nested calls of a composite tool are ignored;
- a step that enters a user message (a prompt, steering) resets the agent's run;
- runs live in memory, keyed by the live agent object (a resumed agent starts
  afresh).
"""

from __future__ import annotations

import dataclasses
import json
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from dsh_host.sdk import (
    AGENT_PRE_STEP,
    TOOLS_POST_EXECUTE,
    Accept,
    Block,
    Context,
    Plugin,
    PluginSource,
    PostExecuteContext,
    PostToolDecision,
    PreStepContext,
    PreStepDecision,
    TextBlock,
    ToolAgent,
    ToolExecution,
    UserMessage,
    UserSource,
    json_enc_hook,
    new_message_id,
)

__all__ = [
    "GENTLE_REMINDER",
    "PLUGIN_NAME",
    "RepeatToolReminder",
    "RepeatToolReminderConfig",
    "canonical_arguments",
    "detailed_reminder",
]

PLUGIN_NAME: Final = "repeat-tool-reminder"

#: The first-threshold reminder (DSH's exact text).
GENTLE_REMINDER: Final = (
    "You are repeating the exact same tool call with identical arguments. Carefully analyze the "
    "previous result before calling again: if the task is not complete, try a different approach "
    "or different arguments instead of repeating the call."
)


def detailed_reminder(tool_name: str, count: int, arguments: str) -> str:
    """The later-threshold reminder (DSH's exact template)."""
    return (
        "Repeated tool call detected:\n"
        f"- tool: {tool_name}\n"
        f"- consecutive_calls: {count}\n"
        f"- arguments: {arguments}\n"
        "The repeated calls are not making progress. Do not call this tool with these exact "
        "arguments again. Inspect the latest result and choose a different action, different "
        "arguments, or finish the task if enough evidence has been gathered."
    )


def canonical_arguments(arguments: Any) -> str:
    """Compact JSON with every object's keys sorted, deeply: the identity of a call's arguments.

    Arguments holding a lone surrogate (which the runtime answers ``INVALID_ARGS``) cannot be
    UTF-8: they are written with ``\\uXXXX`` escapes instead, so the notice stays valid text.
    """
    try:
        return msgspec.json.encode(arguments, enc_hook=json_enc_hook, order="sorted").decode()
    except UnicodeEncodeError:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=dict)


def _preview(canonical: str, cap: int) -> str:
    if len(canonical) <= cap:
        return canonical
    return f"{canonical[:cap]}… (+{len(canonical) - cap} more chars)"


def _wildcard(pattern: str) -> re.Pattern[str]:
    """``*`` matches any run of characters; everything else is literal."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


class RepeatToolReminderConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``repeat-tool-reminder`` row (DSH's defaults; snake_case keys, DSH's
    camelCase spellings accepted, D21)."""

    #: run lengths that trigger a reminder (each an integer >= 2, no duplicates; any order)
    thresholds: list[int] = msgspec.field(default_factory=lambda: [3, 5, 8])
    #: tool-name patterns to track; empty: every tool
    include: list[str] = msgspec.field(default_factory=list)
    #: tool-name patterns transparent to the run (neither count nor reset)
    exclude: list[str] = msgspec.field(default_factory=list)
    #: cap on the arguments quoted in the detailed reminder
    arguments_preview_chars: int = 500

    def __post_init__(self) -> None:
        if not self.thresholds:
            raise ValueError("thresholds must not be empty (give run lengths such as [3, 5, 8])")
        for value in self.thresholds:
            if value < 2:
                raise ValueError(
                    f"invalid threshold {value} — every threshold must be an integer >= 2"
                )
        if len(set(self.thresholds)) != len(self.thresholds):
            raise ValueError("thresholds must not contain duplicates")
        if self.arguments_preview_chars < 1:
            raise ValueError(
                f"invalid arguments_preview_chars {self.arguments_preview_chars} — must be an "
                "integer >= 1"
            )


@dataclass(slots=True)
class _Run:
    key: tuple[str, str]
    count: int


def _with_reminder(decision: Any, reminder: UserMessage) -> Any:
    """The downstream decision with ``reminder`` first among its contexts (both variants)."""
    if isinstance(decision, Accept | Block):
        contexts = (reminder, *decision.additional_contexts)
        return dataclasses.replace(decision, additional_contexts=contexts)
    if isinstance(decision, Mapping):
        theirs = decision.get("additionalContexts", decision.get("additional_contexts", ()))
        plain = {k: v for k, v in decision.items() if k != "additional_contexts"}
        return {**plain, "additionalContexts": [reminder, *theirs]}
    return decision  # not a decision: the runtime reports it


class RepeatToolReminder(Plugin):
    """Entry point ``repeat-tool-reminder`` (DSH: ``@deepseek-ai/dsh-repeat-tool-reminder``)."""

    name = PLUGIN_NAME
    inject = ("tools",)
    Config = RepeatToolReminderConfig

    def apply(self, ctx: Context, config: RepeatToolReminderConfig) -> None:
        thresholds = sorted(config.thresholds)
        first = thresholds[0]
        triggers = frozenset(thresholds)
        include = [_wildcard(p) for p in config.include]
        exclude = [_wildcard(p) for p in config.exclude]
        cap = config.arguments_preview_chars
        runs: weakref.WeakKeyDictionary[ToolAgent, _Run] = weakref.WeakKeyDictionary()

        def tracked(name: str) -> bool:
            if include and not any(p.fullmatch(name) for p in include):
                return False
            return not any(p.fullmatch(name) for p in exclude)

        def observe(exec_: ToolExecution) -> UserMessage | None:
            agent = exec_.agent
            if agent is None or exec_.parent is not None or not tracked(exec_.name):
                return None
            canonical = canonical_arguments(exec_.arguments)
            key = (exec_.name, canonical)
            try:
                run = runs.get(agent)
                count = run.count + 1 if run is not None and run.key == key else 1
                runs[agent] = _Run(key, count)
            except TypeError:  # an agent object that cannot be weakly referenced
                return None
            if count not in triggers:
                return None
            if count == first:
                text = GENTLE_REMINDER
            else:
                text = detailed_reminder(exec_.name, count, _preview(canonical, cap))
            return UserMessage(
                id=new_message_id(),
                content=(TextBlock(text=text),),
                source=PluginSource(
                    plugin=PLUGIN_NAME, form="notice", summary=f"{exec_.name} × {count}"[:120]
                ),
            )

        async def after_execute(
            post: PostExecuteContext, next_: Callable[[], Awaitable[PostToolDecision]]
        ) -> Any:
            # Count first (the run advances whatever the downstream decides), delegate, then
            # fold the reminder onto whatever came back: a blocked call is nudged too.
            reminder = observe(post.exec)
            downstream = await next_()
            return downstream if reminder is None else _with_reminder(downstream, reminder)

        async def before_step(
            payload: PreStepContext, next_: Callable[[], Awaitable[PreStepDecision]]
        ) -> PreStepDecision:
            if any(isinstance(m.source, UserSource) for m in payload.messages):
                runs.pop(payload.agent, None)  # repetition across a user turn is not a loop
            return await next_()

        ctx.on(TOOLS_POST_EXECUTE, after_execute)
        ctx.on(AGENT_PRE_STEP, before_step)
