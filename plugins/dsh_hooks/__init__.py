"""``hooks``: Claude Code command hooks (``hooks.json``) on dsh's chains, confined, fail closed.

After DSH's ``hooks-claude-code`` bridge. A hook is a shell command from a ``hooks.json`` (or a
settings file's ``hooks`` key) in Claude Code's shape::

    {"hooks": {"PreToolUse": [{"matcher": "bash", "hooks": [{"type": "command",
                                                             "command": "...", "timeout": 10}]}]}}

It receives the event as JSON on stdin and answers with its exit code and stdout (Claude Code's
protocol, :func:`verdict`). The points map onto dsh's chains:

=====================  ==========================  =========================================
Claude Code            dsh                         what an answer does
=====================  ==========================  =========================================
``PreToolUse``         ``tools/pre-execute``       deny (the model reads the reason), ask
``PostToolUse``        ``tools/post-execute``      block (feedback replaces the result), context
``UserPromptSubmit``   ``agent/pre-step`` (step 1) block (the turn ends ``blocked``), context
``Stop``               ``agent/turn-stopping``     block: the reason is steered, the turn goes on
``SessionStart``       ``agent/pre-step`` (turn 1) context
=====================  ==========================  =========================================

Where hooks come from (:func:`hook_sources`), because a hook is a command the harness runs: the
row's ``configPath`` (an executable-choosing key: a trusted project ``dsh.yml`` may not set it),
the user's ``$XDG_CONFIG_HOME/dsh/hooks.json``, and a project's ``.claude/settings.json`` /
``.claude/hooks.json`` only when ``dsh trust`` recorded that file's exact bytes. A file a tool
wrote is therefore never run: it is untrusted, or its trust broke when its bytes changed.

Every hook runs through the ``sandbox`` service's ``confine`` (row ``sandbox``, default
``read-only``) with a deadline (the hook's ``timeout`` seconds, else ``defaultTimeoutMs``). A gate
fails closed: a ``PreToolUse`` or ``UserPromptSubmit`` hook that cannot run, crashes (an exit
code other than 0 and 2), times out or answers something unreadable denies. Every run is logged
as DSH's ``hook/invoked`` + ``hook/result`` pair (log-only events DSH reads), the verdict and its
reason included.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

import anyio
import msgspec

from dsh_host.sdk import (
    AGENT_PRE_STEP,
    AGENT_TURN_STOPPING,
    SANDBOX,
    TOOLS_POST_EXECUTE,
    TOOLS_PRE_EXECUTE,
    Accept,
    Ask,
    Block,
    ConfigError,
    Context,
    Deny,
    Enter,
    Plugin,
    PluginSource,
    PostExecuteContext,
    PostToolDecision,
    PreStepContext,
    PreStepDecision,
    PreToolDecision,
    Reject,
    TextBlock,
    ToolExecution,
    TurnStoppingContext,
    UserMessage,
    allowed_environment,
    call_policy,
    config_home,
    new_message_id,
    trust_store_file,
)

__all__ = [
    "POINTS",
    "HookCommand",
    "HookFileError",
    "Hooks",
    "HooksConfig",
    "Verdict",
    "check_trusted_file",
    "hook_sources",
    "parse_hooks",
    "verdict",
]

PLUGIN_NAME: Final = "hooks"
DIALECT: Final = "claude"
POINTS: Final = ("PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop", "SessionStart")
#: Project files read only when trusted, relative to the working directory at boot.
PROJECT_HOOK_FILES: Final = (".claude/settings.json", ".claude/hooks.json")
#: The most bytes of a hook's stdout/stderr kept (the rest is dropped) and logged.
OUTPUT_LIMIT: Final = 65_536
STDERR_SUMMARY_CHARS: Final = 500

VerdictKind = Literal["allow", "deny", "ask", "context", "pass"]


class HooksConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of a ``hooks`` row (camelCase accepted)."""

    #: a hooks.json (or settings file with a ``hooks`` key) named by the composition
    config_path: str | None = None
    #: read ``$XDG_CONFIG_HOME/dsh/hooks.json``
    include_user_hooks: bool = True
    #: read the project's trusted ``.claude/settings.json`` / ``.claude/hooks.json``
    include_project_hooks: bool = True
    #: the sandbox mode every hook runs under
    sandbox: Literal["read-only", "workspace-write"] = "read-only"
    #: a hook's deadline when it sets no ``timeout`` (Claude Code's default: 60 s)
    default_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.default_timeout_ms <= 0:
            raise ValueError(
                f"defaultTimeoutMs must be a positive integer, got {self.default_timeout_ms}"
            )


class HookFileError(ConfigError):
    """A hooks file that cannot be read as Claude Code's shape; names the file and the key."""

    code: ClassVar[str] = "HOOKS_CONFIG"


@dataclass(frozen=True, slots=True)
class HookCommand:
    """One command hook: where it is configured, what selects it, what it runs."""

    point: str
    matcher: str | None
    command: str
    timeout_s: float | None
    source: str
    handler_id: str

    def matches(self, subject: str | None) -> bool:
        """Claude Code's matcher: empty or ``*`` matches all, else a regular expression on the
        tool name (``Edit|Write``); a plain name matches exactly."""
        if self.matcher in (None, "", "*") or subject is None:
            return True
        try:
            return re.fullmatch(self.matcher, subject) is not None
        except re.error:
            return fnmatch.fnmatchcase(subject, self.matcher)


def parse_hooks(data: Any, source: str) -> list[HookCommand]:
    """The command hooks of a decoded hooks file; :class:`HookFileError` names what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("hooks"), dict):
        raise HookFileError(f'{source}: expected a JSON object with a "hooks" object')
    found: list[HookCommand] = []
    for point, groups in data["hooks"].items():
        if point not in POINTS:
            raise HookFileError(
                f"{source}: hooks.{point} is not a supported hook point; use one of "
                + ", ".join(POINTS)
            )
        if not isinstance(groups, list):
            raise HookFileError(f"{source}: hooks.{point} must be a list of matcher groups")
        for g, group in enumerate(groups):
            where = f"{source}: hooks.{point}[{g}]"
            if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
                raise HookFileError(f'{where} must be an object with a "hooks" list')
            matcher = group.get("matcher")
            if matcher is not None and not isinstance(matcher, str):
                raise HookFileError(f"{where}.matcher must be a string (a tool name or regex)")
            for h, hook in enumerate(group["hooks"]):
                at = f"{where}.hooks[{h}]"
                if not isinstance(hook, dict) or hook.get("type") != "command":
                    raise HookFileError(f'{at} must be {{"type": "command", "command": "..."}}')
                command = hook.get("command")
                if not isinstance(command, str) or not command.strip():
                    raise HookFileError(f"{at}.command must be a non-empty string")
                timeout = hook.get("timeout")
                if timeout is not None and (
                    isinstance(timeout, bool)
                    or not isinstance(timeout, int | float)
                    or timeout <= 0
                ):
                    raise HookFileError(f"{at}.timeout must be a positive number of seconds")
                ident = hashlib.sha256(f"{source}\0{point}\0{g}\0{h}\0{command}".encode())
                found.append(
                    HookCommand(point, matcher, command, timeout, source, ident.hexdigest()[:16])
                )
    return found


def _decode_file(data: bytes, source: str) -> list[HookCommand]:
    try:
        decoded = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HookFileError(f"{source}: not a UTF-8 JSON file ({exc})") from None
    if isinstance(decoded, dict) and "hooks" not in decoded:
        return []  # a settings file without hooks
    return parse_hooks(decoded, source)


def check_trusted_file(data: bytes, path: Path) -> None:
    """What ``dsh trust`` checks before it records a project hooks file: it parses."""
    _decode_file(data, str(path))


def _trusted_digest(path: str) -> str | None:
    """The SHA-256 ``dsh trust`` recorded for ``path`` (canonical), if any."""
    try:
        store = json.loads(trust_store_file().read_bytes())
    except (OSError, ValueError):
        return None
    files = store.get("files") if isinstance(store, dict) else None
    recorded = files.get(os.path.realpath(path)) if isinstance(files, dict) else None
    return recorded if isinstance(recorded, str) else None


def _note(text: str) -> None:
    import sys

    print(f"dsh: note: {text}", file=sys.stderr)


def hook_sources(config: HooksConfig, cwd: str) -> list[HookCommand]:
    """Every hook this row runs, in order: ``configPath``, the user's file, trusted project
    files. An untrusted or changed project file is skipped with a one-line note."""
    hooks: list[HookCommand] = []
    if config.config_path is not None:
        path = Path(os.path.expanduser(config.config_path))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise HookFileError(
                f"hooks: configPath {path} cannot be read ({exc.strerror})"
            ) from None
        hooks += _decode_file(data, str(path))
    if config.include_user_hooks:
        user = config_home() / "dsh" / "hooks.json"
        if user.is_file():
            hooks += _decode_file(user.read_bytes(), str(user))
    if config.include_project_hooks:
        for relative in PROJECT_HOOK_FILES:
            path = Path(cwd) / relative
            if not path.is_file():
                continue
            data = path.read_bytes()
            if not _declares_hooks(data):
                continue  # e.g. a Claude Code settings.json holding only permissions
            recorded = _trusted_digest(str(path))
            if recorded is None:
                _note(
                    f"{relative} was not loaded: project hooks run only when trusted "
                    f"(`dsh trust {relative}`)"
                )
                continue
            if recorded != hashlib.sha256(data).hexdigest():
                _note(
                    f"{relative} was not loaded: it changed since you trusted it; review it, "
                    f"then run `dsh trust {relative}` again"
                )
                continue
            hooks += _decode_file(data, str(path))  # the very bytes that were hashed
    return hooks


def _declares_hooks(data: bytes) -> bool:
    """Whether a project file may declare hooks: a JSON object with a non-empty ``hooks``, or
    anything that is not JSON (then it is not ours to judge, and the trust rules apply). A
    ``settings.json`` without hooks is skipped silently rather than noted on every run."""
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return True
    return not isinstance(parsed, dict) or bool(parsed.get("hooks"))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one hook answered, in dsh's terms."""

    kind: VerdictKind
    reason: str | None = None
    context: str | None = None


@dataclass(frozen=True, slots=True)
class HookRun:
    exit_code: int | None
    stdout: str
    stderr: str
    failure: str | None  #: why it did not run to an exit (timeout, no sandbox, spawn error)


def _object(text: str) -> dict[str, Any] | None:
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def verdict(point: str, run: HookRun) -> Verdict:
    """Claude Code's answer protocol, failing closed for the gates.

    Exit 2 blocks with stderr as the reason. Exit 0 passes, unless stdout is a JSON object that
    decides: ``hookSpecificOutput.permissionDecision`` (``allow``/``deny``/``ask``, reason in
    ``permissionDecisionReason``), ``decision: "block"`` (reason in ``reason``), ``continue:
    false`` (``stopReason``), ``hookSpecificOutput.additionalContext`` (context for the model);
    plain stdout of ``UserPromptSubmit``/``SessionStart`` is context. ``updatedInput`` (a rewrite
    of the call) is answered with a denial that tells the model the rewritten input, so the log
    holds exactly the call that runs. A gate (``PreToolUse``, ``UserPromptSubmit``) denies when
    the hook failed, timed out, exited otherwise or answered an unknown decision.
    """
    gate = point in ("PreToolUse", "UserPromptSubmit")
    fail: VerdictKind = "deny" if gate else "pass"
    if run.failure is not None:
        return Verdict(fail, f"{point} hook failed: {run.failure}")
    if run.exit_code == 2:
        return Verdict("deny", run.stderr.strip() or f"blocked by {point} hook")
    if run.exit_code != 0:
        detail = run.stderr.strip()[:STDERR_SUMMARY_CHARS]
        return Verdict(
            fail,
            f"{point} hook failed: exit code {run.exit_code}" + (f": {detail}" if detail else ""),
        )
    answer = _object(run.stdout)
    if answer is None:
        text = run.stdout.strip()
        if text and point in ("UserPromptSubmit", "SessionStart"):
            return Verdict("context", context=text)
        return Verdict("allow" if gate else "pass")
    specific = answer.get("hookSpecificOutput")
    specific = specific if isinstance(specific, dict) else {}
    context = specific.get("additionalContext")
    context = context if isinstance(context, str) and context.strip() else None
    if answer.get("continue") is False:
        return Verdict("deny", str(answer.get("stopReason") or f"stopped by {point} hook"))
    if point == "PreToolUse" and "updatedInput" in specific:
        rewritten = json.dumps(specific["updatedInput"], ensure_ascii=False)
        return Verdict(
            "deny",
            "the PreToolUse hook rewrote this call's input; dsh runs only calls exactly as "
            f"logged, so call the tool again with these arguments if you agree: {rewritten}",
        )
    decision = specific.get("permissionDecision", answer.get("decision"))
    reason = specific.get("permissionDecisionReason", answer.get("reason"))
    reason = str(reason) if isinstance(reason, str) and reason.strip() else None
    if decision in ("deny", "block"):
        return Verdict("deny", reason or f"blocked by {point} hook")
    if decision == "ask" and point == "PreToolUse":
        return Verdict("ask", reason)
    if decision not in (None, "allow", "approve"):
        return Verdict(fail, f"{point} hook answered an unknown decision {decision!r}")
    if context is not None:
        return Verdict("context", context=context)
    return Verdict("allow" if gate else "pass")


def _session_of(agent: Any) -> Any:
    return getattr(agent, "session", None)


def _cwd_of(agent: Any, fallback: str) -> str:
    header = getattr(_session_of(agent), "header", None)
    cwd = getattr(header, "cwd", None)
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else fallback


def _context_message(point: str, text: str) -> UserMessage:
    return UserMessage(
        id=new_message_id(),
        content=(
            TextBlock(text=f"<system-reminder>\n{point} hook context:\n{text}\n</system-reminder>"),
        ),
        source=PluginSource(plugin=PLUGIN_NAME, form="notice", summary=f"{point} hook"),
    )


class Hooks(Plugin):
    """Entry point ``hooks`` (DSH: ``@deepseek-ai/dsh-hooks-claude-code``)."""

    name = PLUGIN_NAME
    Config = HooksConfig
    #: a hooks file names commands to run: only a user-level or named composition may point at one
    executable_keys = ("config_path",)
    #: command hooks run confined
    runs_confined = True
    #: Claude Code's project hook files name commands to run: read only once trusted
    project_files = (".claude/hooks.json", ".claude/settings.json")
    #: ``dsh trust .claude/hooks.json`` checks the file with this before recording it
    check_trusted_file = staticmethod(check_trusted_file)

    def apply(self, ctx: Context, config: HooksConfig) -> None:
        boot_cwd = os.getcwd()
        hooks = hook_sources(config, boot_cwd)
        by_point: dict[str, list[HookCommand]] = {p: [] for p in POINTS}
        for hook in hooks:
            by_point[hook.point].append(hook)

        async def run_one(hook: HookCommand, payload: Mapping[str, Any], cwd: str) -> HookRun:
            sandbox = ctx.get(SANDBOX)
            if sandbox is None:
                return HookRun(None, "", "", "no sandbox service is composed to confine it")
            root = await anyio.to_thread.run_sync(os.path.realpath, cwd)
            try:
                confined = sandbox.confine(
                    ["bash", "-c", hook.command],
                    call_policy(config.sandbox, root),
                )
            except Exception as exc:  # the sandbox refused: the hook does not run unconfined
                return HookRun(None, "", "", f"the sandbox cannot confine it ({exc})")
            env = allowed_environment()
            env["CLAUDE_PROJECT_DIR"] = cwd
            timeout_s = hook.timeout_s or config.default_timeout_ms / 1000
            data = json.dumps(dict(payload), ensure_ascii=False).encode()
            with anyio.move_on_after(timeout_s) as scope:
                try:
                    done = await anyio.run_process(
                        list(confined.argv), input=data, check=False, cwd=cwd, env=env
                    )
                except OSError as exc:
                    return HookRun(None, "", "", f"it could not start ({exc})")
            if scope.cancelled_caught:
                return HookRun(None, "", "", f"timed out after {timeout_s:g} s")
            out = done.stdout[:OUTPUT_LIMIT].decode("utf-8", "replace")
            err = done.stderr[:OUTPUT_LIMIT].decode("utf-8", "replace")
            code = done.returncode
            if code is not None and code < 0:
                return HookRun(None, out, err, f"killed by signal {-code}")
            return HookRun(code, out, err, None)

        async def run_point(
            point: str, agent: Any, subject: str | None, extra: Mapping[str, Any]
        ) -> list[Verdict]:
            """Run the point's matching hooks serially, in file order, logging each one."""
            session = _session_of(agent)
            cwd = _cwd_of(agent, boot_cwd)
            turn = int(getattr(agent, "last_turn", 0) or 0)
            payload = {
                "session_id": getattr(getattr(session, "header", None), "id", None) or "",
                "transcript_path": "",
                "cwd": cwd,
                "hook_event_name": point,
                **extra,
            }
            verdicts: list[Verdict] = []
            for hook in by_point[point]:
                if not hook.matches(subject):
                    continue
                if session is not None and turn > 0:
                    invoked: dict[str, Any] = {
                        "turn": turn,
                        "point": point,
                        "dialect": DIALECT,
                        "handlerId": hook.handler_id,
                    }
                    if hook.matcher:
                        invoked["matcher"] = hook.matcher
                    session.append("hook/invoked", invoked)
                started = time.monotonic()
                run = await run_one(hook, payload, cwd)
                answer = verdict(point, run)
                if session is not None and turn > 0:
                    result: dict[str, Any] = {
                        "turn": turn,
                        "point": point,
                        "handlerId": hook.handler_id,
                        "decision": answer.kind,
                        "durationMs": int((time.monotonic() - started) * 1000),
                        "command": hook.command,
                        "source": hook.source,
                    }
                    if run.exit_code is not None:
                        result["exitCode"] = run.exit_code
                    if run.stderr.strip():
                        result["stderrSummary"] = run.stderr.strip()[:STDERR_SUMMARY_CHARS]
                    if answer.reason is not None:
                        result["reason"] = answer.reason
                    if answer.context is not None:
                        result["context"] = answer.context
                    session.append("hook/result", result)
                verdicts.append(answer)
            return verdicts

        async def pre_execute(
            execution: ToolExecution, next_: Callable[[], Awaitable[PreToolDecision]]
        ) -> PreToolDecision:
            verdicts = await run_point(
                "PreToolUse",
                execution.agent,
                execution.name,
                {
                    "tool_name": execution.name,
                    "tool_input": _plain(execution.arguments),
                    "tool_use_id": execution.call_id,
                },
            )
            denied = [v for v in verdicts if v.kind == "deny"]
            if denied:  # most restrictive first: deny > ask > allow
                return Deny("; ".join(v.reason or "blocked by PreToolUse hook" for v in denied))
            inner = await next_()
            asked = [v for v in verdicts if v.kind == "ask"]
            if asked and not isinstance(inner, Deny):
                return Ask(asked[0].reason)
            return inner

        async def post_execute(
            post: PostExecuteContext, next_: Callable[[], Awaitable[PostToolDecision]]
        ) -> PostToolDecision:
            execution = post.exec
            outcome = post.result
            verdicts = await run_point(
                "PostToolUse",
                execution.agent,
                execution.name,
                {
                    "tool_name": execution.name,
                    "tool_input": _plain(execution.arguments),
                    "tool_use_id": execution.call_id,
                    "tool_response": [_plain(block) for block in outcome.content],
                },
            )
            downstream = await next_()
            denied = [v for v in verdicts if v.kind == "deny"]
            contexts = tuple(
                _context_message("PostToolUse", v.context) for v in verdicts if v.context
            )
            if denied:
                text = "; ".join(v.reason or "blocked by PostToolUse hook" for v in denied)
                return Block(feedback=(TextBlock(text=text),), additional_contexts=contexts)
            if not contexts:
                return downstream
            if isinstance(downstream, Block):
                return Block(downstream.feedback, (*downstream.additional_contexts, *contexts))
            return Accept(
                content=downstream.content,
                value=downstream.value,
                additional_contexts=(*downstream.additional_contexts, *contexts),
            )

        async def pre_step(
            step: PreStepContext, next_: Callable[[], Awaitable[PreStepDecision]]
        ) -> PreStepDecision:
            if step.step != 1:
                return await next_()
            added: list[UserMessage] = []
            if step.turn == 1:
                for v in await run_point(
                    "SessionStart", step.agent, "startup", {"source": "startup"}
                ):
                    if v.context:
                        added.append(_context_message("SessionStart", v.context))
            prompt = "\n".join(
                block.text
                for m in step.messages
                for block in m.content
                if isinstance(block, TextBlock)
            )
            verdicts = await run_point("UserPromptSubmit", step.agent, None, {"prompt": prompt})
            if any(v.kind == "deny" for v in verdicts):
                return Reject()
            added += [
                _context_message("UserPromptSubmit", v.context) for v in verdicts if v.context
            ]
            downstream = await next_()
            if not added or not isinstance(downstream, Enter):
                return downstream
            return Enter(messages=(*downstream.messages, *added))

        #: agent -> the turn a Stop hook already continued: the next Stop payload says
        #: ``stop_hook_active: true`` (Claude Code's guard against a hook that never lets go)
        continued: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

        async def turn_stopping(stopping: TurnStoppingContext) -> None:
            active = continued.get(stopping.agent) == stopping.turn
            verdicts = await run_point("Stop", stopping.agent, None, {"stop_hook_active": active})
            for v in verdicts:
                if v.kind == "deny":
                    continued[stopping.agent] = stopping.turn
                    stopping.agent.steer(v.reason or "continue: blocked by Stop hook")

        if by_point["PreToolUse"]:
            ctx.on(TOOLS_PRE_EXECUTE, pre_execute)
        if by_point["PostToolUse"]:
            ctx.on(TOOLS_POST_EXECUTE, post_execute)
        if by_point["UserPromptSubmit"] or by_point["SessionStart"]:
            ctx.on(AGENT_PRE_STEP, pre_step)
        if by_point["Stop"]:
            ctx.on(AGENT_TURN_STOPPING, turn_stopping)


def _plain(value: Any) -> Any:
    """JSON builtins of frozen arguments or a content block (for the hook's stdin)."""
    return msgspec.to_builtins(value, str_keys=True, enc_hook=repr)
