"""Configuration of one ``mcp-client`` row (one MCP server per row)."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from dsh_host.sdk import ConfigError, SandboxMode

__all__ = ["McpClientConfig", "McpClientConfigError", "ReconnectConfig"]

_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


class McpClientConfigError(ConfigError, ValueError):
    """Invalid ``mcp-client`` config (a ``ValueError`` too, so msgspec reports it at load)."""

    code = "MCP_CLIENT_CONFIG"


class ReconnectConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``reconnect.*``: the supervisor's budgeted exponential backoff (DSH's defaults)."""

    #: reconnect automatically after a lost connection
    enabled: bool = True
    #: first delay; doubles per consecutive failed attempt
    initial_delay_ms: int = 500
    #: backoff ceiling; also the uptime after which the attempt budget resets
    max_delay_ms: int = 30_000
    #: consecutive failed attempts per outage before giving up for good
    max_attempts: int = 10


class McpClientConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """YAML ``config:`` of an ``mcp-client`` row (DSH's camelCase keys are accepted, D21).

    ``transport: stdio`` needs ``command`` (``args``, ``env``, ``cwd``); ``streamable-http``
    needs ``url`` (``headers``). A stdio server runs under ``sandbox`` (default ``read-only``)
    through ``ctx.sandbox.confine`` with ``bash``'s environment allow-list plus ``env_allow``;
    ``env`` values are set on top. ``workspace`` is the sandbox's workspace root and the
    server's default working directory.
    """

    server_name: str
    transport: Literal["stdio", "streamable-http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    tool_call_timeout_ms: int = 60_000
    #: bound on connect + initialize + the tool listing, per connection attempt
    startup_timeout_ms: int = 30_000
    fail_on_startup_error: bool = False
    reconnect: ReconnectConfig = msgspec.field(default_factory=ReconnectConfig)
    sandbox: SandboxMode = "read-only"
    workspace: str = "."
    env_allow: tuple[str, ...] = ()
    #: a tool the server annotates ``destructiveHint: true`` asks for approval
    ask_destructive: bool = True

    def __post_init__(self) -> None:
        where = f"mcp-client({self.server_name})"
        if not _SERVER_NAME.fullmatch(self.server_name):
            raise McpClientConfigError(
                f"mcp-client: serverName {self.server_name!r} must match [A-Za-z0-9_-]{{1,32}} "
                "(it becomes part of every tool name, mcp__<serverName>__<tool>)"
            )
        if self.transport == "stdio":
            if not self.command:
                raise McpClientConfigError(
                    f"{where}: transport stdio needs `command` (the executable to spawn)"
                )
            if self.url is not None or self.headers:
                raise McpClientConfigError(
                    f"{where}: `url` and `headers` belong to transport streamable-http, not stdio"
                )
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise McpClientConfigError(
                    f"{where}: transport streamable-http needs `url` (http:// or https://)"
                )
            if self.command is not None or self.args or self.env or self.cwd is not None:
                raise McpClientConfigError(
                    f"{where}: `command`, `args`, `env` and `cwd` belong to transport stdio, "
                    "not streamable-http"
                )
        for key in ("tool_call_timeout_ms", "startup_timeout_ms"):
            if getattr(self, key) <= 0:
                raise McpClientConfigError(f"{where}: {_camel(key)} must be a positive integer")
        r = self.reconnect
        if r.initial_delay_ms <= 0 or r.max_delay_ms < r.initial_delay_ms or r.max_attempts <= 0:
            raise McpClientConfigError(
                f"{where}: reconnect needs initialDelayMs > 0, maxDelayMs >= initialDelayMs and "
                "maxAttempts > 0"
            )
        for entry in self.env_allow:
            if not entry or "=" in entry or "\0" in entry or "*" in entry[:-1]:
                raise McpClientConfigError(
                    f"{where}: envAllow entry {entry!r} must be a variable name, or a prefix "
                    "followed by a single trailing '*'"
                )


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)
