"""What the plugins shipped with dsh declare, known without importing them.

A command that only reads stored sessions (``dsh sessions list``) boots the
``sessionPersistence`` provider and what it injects, nothing else. To tell those rows apart
the loader needs each row's ``provides`` and ``inject``; for a shipped plugin they are written
here, so the rows a command does not boot are never imported (the agent loop, the tools, the
sandbox probe are most of a cold start), and a shipped row name resolves to its class without
scanning every installed distribution's entry points.

This table repeats the ``dsh.plugins`` entry points of ``pyproject.toml`` and each plugin's
own class attributes; ``tests/host/test_shipped_plugins.py`` fails when they drift apart, and
the loader checks every row it does import against its line here (a row whose plugin says
otherwise makes it resolve the composition the slow way, every row imported). A row naming
anything else (a third-party entry point, ``module:Attr``) is imported to learn what it
provides, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class DeclaredPlugin:
    """A shipped plugin's entry point and the metadata its class declares."""

    #: ``module:Attr``, the value of its ``dsh.plugins`` entry point
    entry_point: str
    provides: tuple[str, ...] = ()
    inject: tuple[str, ...] = ()
    #: config keys that choose an executable (D16), as the class declares them
    executable_keys: tuple[str, ...] = ()
    #: ``(prefix, provider)`` of the class's ``model_route`` (``--model PREFIX:MODEL``)
    model_route: tuple[str, str] | None = None
    #: the class's ``root_key`` (the config key ``--root`` sets on a file store's row)
    root_key: str | None = None
    #: ``(schemes, key)`` of the class's ``store_url`` (``Agent(store="postgresql://...")``)
    store_url: tuple[tuple[str, ...], str] | None = None
    #: ``(term, config key)`` pairs of the class's ``run_terms``
    run_terms: tuple[tuple[str, str], ...] = ()
    #: the class's ``boots_for_repair``
    boots_for_repair: bool = False
    #: the class's ``runs_confined``
    runs_confined: bool = False
    #: the class's ``project_files``
    project_files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DefaultRow:
    """The shipped row the Python front door adds when its composition has none for a role."""

    #: the row's id
    id: str
    #: the entry-point name it runs
    plugin: str


_TIMEOUT_POLICY: Final = DeclaredPlugin("dsh_timeout_policy:TimeoutPolicy", inject=("tools",))
_HOOKS: Final = DeclaredPlugin(
    "dsh_hooks:Hooks",
    executable_keys=("config_path",),
    runs_confined=True,
    project_files=(".claude/hooks.json", ".claude/settings.json"),
)

#: Entry-point name -> what its plugin declares.
SHIPPED_PLUGINS: Final[dict[str, DeclaredPlugin]] = {
    "sessions": DeclaredPlugin("dsh_host._session.plugin:SessionsPlugin", provides=("sessions",)),
    "llm": DeclaredPlugin("dsh_host._llm.plugin:LlmPlugin", provides=("llm",)),
    "tools": DeclaredPlugin("dsh_host._tools.plugin:ToolsPlugin", provides=("tools",)),
    "agent": DeclaredPlugin(
        "dsh_host._agent.plugin:AgentPlugin",
        provides=("agent",),
        inject=("sessions", "llm", "tools"),
    ),
    "session-persistence-jsonl": DeclaredPlugin(
        "dsh_session_persistence_jsonl:SessionPersistenceJsonl",
        provides=("sessionPersistence",),
        inject=("sessions",),
        root_key="root",
    ),
    "session-checkpoint-policy": DeclaredPlugin(
        "dsh_session_checkpoint_policy:SessionCheckpointPolicy",
        inject=("llm", "sessions", "tools", "sessionPersistence"),
    ),
    "user-approval": DeclaredPlugin(
        "dsh_user_approval:UserApproval",
        provides=("approval",),
        run_terms=(("approval_policy", "policy"), ("unanswered", "unanswered")),
        boots_for_repair=True,
    ),
    "sandbox-local": DeclaredPlugin(
        "dsh_sandbox_local:SandboxLocal",
        provides=("sandbox",),
        executable_keys=("runner_command",),
        run_terms=(("network", "network"),),
        runs_confined=True,
    ),
    "session-persistence-postgres": DeclaredPlugin(
        "dsh_session_persistence_postgres:SessionPersistencePostgres",
        provides=("sessionPersistence",),
        inject=("sessions",),
        store_url=(("postgresql", "postgres"), "dsn"),
    ),
    "session-persistence-sqlite": DeclaredPlugin(
        "dsh_session_persistence_sqlite:SessionPersistenceSqlite",
        provides=("sessionPersistence",),
        inject=("sessions",),
        root_key="root",
    ),
    "session-persistence-memory": DeclaredPlugin(
        "dsh_session_persistence_memory:SessionPersistenceMemory",
        provides=("sessionPersistence",),
        inject=("sessions",),
    ),
    "llm-scripted": DeclaredPlugin("dsh_llm_scripted:LlmScripted", inject=("llm",)),
    "llm-openai-compatible": DeclaredPlugin(
        "dsh_llm_openai_compatible:LlmOpenAICompatible",
        inject=("llm",),
        model_route=("openai-compatible", "deepseek-official"),
    ),
    "llm-anthropic": DeclaredPlugin(
        "dsh_llm_anthropic:LlmAnthropic", inject=("llm",), model_route=("anthropic", "anthropic")
    ),
    "llm-openai-responses": DeclaredPlugin(
        "dsh_llm_openai_responses:LlmOpenAIResponses",
        inject=("llm",),
        model_route=("openai-responses", "openai"),
    ),
    "llm-litellm": DeclaredPlugin(
        "dsh_llm_litellm:LlmLiteLLM", inject=("llm",), model_route=("litellm", "litellm")
    ),
    "llm-retry": DeclaredPlugin("dsh_llm_retry:LlmRetry", inject=("agent",)),
    "builtin-tools": DeclaredPlugin(
        "dsh_builtin_tools:BuiltinTools",
        inject=("tools",),
        run_terms=(("workspace", "workspace"), ("sandbox", "sandbox")),
        runs_confined=True,
    ),
    "tool-rules": DeclaredPlugin("dsh_tool_rules:ToolRules"),
    "timeout-policy": _TIMEOUT_POLICY,
    "tool-call-timeout-policy": _TIMEOUT_POLICY,
    "repeat-tool-reminder": DeclaredPlugin(
        "dsh_repeat_tool_reminder:RepeatToolReminder", inject=("tools",)
    ),
    "token-meter": DeclaredPlugin("dsh_token_meter:TokenMeterPlugin", provides=("tokenMeter",)),
    "compaction-tool-result-pruner": DeclaredPlugin(
        "dsh_compaction_tool_result_pruner:ToolResultPrunerPlugin",
        provides=("toolResultPruner",),
        inject=("tokenMeter",),
    ),
    "compaction-basic": DeclaredPlugin(
        "dsh_compaction_basic:BasicCompaction",
        provides=("compaction",),
        inject=("llm", "tokenMeter", "sessions"),
    ),
    "agent-instructions": DeclaredPlugin("dsh_agent_instructions:AgentInstructions"),
    "mcp-client": DeclaredPlugin(
        "dsh_mcp_client:McpClient",
        inject=("tools",),
        executable_keys=("command", "args", "env", "cwd"),
    ),
    "telemetry-otel": DeclaredPlugin(
        "dsh_telemetry_otel:TelemetryOtel", provides=("telemetry",), boots_for_repair=True
    ),
    "skills": DeclaredPlugin("dsh_skills:Skills", inject=("tools",), runs_confined=True),
    "hooks": _HOOKS,
    "hooks-claude-code": _HOOKS,
    "subagents": DeclaredPlugin(
        "dsh_subagents:Subagents",
        provides=("subagents",),
        inject=("sessions", "tools", "agent"),
        boots_for_repair=True,
    ),
}


#: Role -> the shipped row ``Agent(...)`` adds when its composition has none for it: the file
#: store of ``store=DIR`` and the checkpoint policy that flushes a store it adds, the approval
#: row, the sandbox and the built-in tools of ``sandbox=``, the rules of ``ask=``, the token
#: meter of ``prices=``. The front door names the role; which plugin fills it is said here.
FRONT_DOOR_ROWS: Final[dict[str, DefaultRow]] = {
    "file-store": DefaultRow("session-persistence", "session-persistence-jsonl"),
    "checkpoints": DefaultRow("session-checkpoints", "session-checkpoint-policy"),
    "approval": DefaultRow("approval", "user-approval"),
    "sandbox": DefaultRow("sandbox", "sandbox-local"),
    "tools": DefaultRow("builtin-tools", "builtin-tools"),
    "ask-rules": DefaultRow("front-door-rules", "tool-rules"),
    "prices": DefaultRow("token-meter", "token-meter"),
    "scripted-model": DefaultRow("model", "llm-scripted"),
    "memory-store": DefaultRow("session-persistence", "session-persistence-memory"),
}


def declared_project_files() -> dict[str, str]:
    """``project file -> plugin name`` of every shipped plugin's ``project_files`` (the first
    name declaring a file wins: ``hooks`` and its DSH alias are one plugin)."""
    out: dict[str, str] = {}
    for name, declared in SHIPPED_PLUGINS.items():
        for path in declared.project_files:
            out.setdefault(path, name)
    return out


def declared_model_routes() -> dict[str, tuple[str, str]]:
    """``prefix -> (plugin name, provider)`` of every shipped model adapter's ``model_route``,
    known without importing one (``dsh run --help`` lists them)."""
    return {
        declared.model_route[0]: (name, declared.model_route[1])
        for name, declared in SHIPPED_PLUGINS.items()
        if declared.model_route is not None
    }


def declared_root_keys() -> dict[str, str]:
    """``plugin name -> config key`` of every shipped file store's ``root_key`` (what ``--root``
    sets), known without importing one."""
    return {
        name: declared.root_key
        for name, declared in SHIPPED_PLUGINS.items()
        if declared.root_key is not None
    }


def declared_term_takers(term: str) -> list[str]:
    """The shipped plugins whose ``run_terms`` take ``term`` (for an error's hint)."""
    return [name for name, declared in SHIPPED_PLUGINS.items()
            if any(taken == term for taken, _key in declared.run_terms)]


def declared_store_urls() -> dict[str, tuple[str, str]]:
    """``URL scheme -> (plugin name, config key)`` of every shipped store's ``store_url``, known
    without importing one."""
    return {
        scheme: (name, declared.store_url[1])
        for name, declared in SHIPPED_PLUGINS.items()
        if declared.store_url is not None
        for scheme in declared.store_url[0]
    }
