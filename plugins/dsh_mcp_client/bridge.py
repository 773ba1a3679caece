"""One MCP server's bridge: connection supervisor, tool generations, and the tool bodies.

Lifecycle (one :class:`ServerBridge` per ``mcp-client`` row):

* :meth:`ServerBridge.run` is the supervisor (a host background task). Each attempt opens the
  transport, initializes an ``mcp.ClientSession`` and synchronizes the tool list (all within
  ``startupTimeoutMs``), then waits until the connection is lost. A lost connection is retried
  with exponential backoff (``reconnect.initialDelayMs`` doubling to ``reconnect.maxDelayMs``);
  ``reconnect.maxAttempts`` consecutive failures end the outage for good and unregister the
  server's tools. A connection that stayed up longer than ``maxDelayMs`` resets the budget.
  During an outage the last good generation stays registered and its calls fail with
  ``MCP_UNAVAILABLE`` (nothing is sent).
* A generation is the complete tool list of one synchronization: it is fetched in full
  (paginated ``tools/list``) before anything is touched, then swapped in at once; a fetch that
  fails keeps the previous generation, a registration conflict rolls the attempted one back
  (zero tools from this server, never a partial set). ``notifications/tools/list_changed``
  triggers one re-synchronization (coalesced while one runs).
* A tool body sends ``tools/call`` with the raw MCP name and the call's idempotency key, id and
  session in ``_meta`` (``dsh/idempotencyKey``, ``dsh/callId``, ``dsh/sessionId``) and maps the
  result (:mod:`.results`); MCP
  ``isError`` becomes a tool error (``MCP_TOOL_ERROR``).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Final

import anyio
import mcp_types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from dsh_host.sdk import (
    DEFAULT_ENV_ALLOW,
    SANDBOX,
    TOOL_OUTCOME_UNKNOWN,
    TOOLS,
    AbortError,
    ContentBlock,
    Context,
    DshError,
    SandboxUnavailableError,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolOutput,
    allowed_environment,
    call_policy,
    to_json_builtins,
)

from .config import McpClientConfig, McpClientConfigError
from .naming import public_tool_name
from .results import render_content, render_result
from .schema import lower_input_schema
from .transport import Link, StderrTail, http_transport, stdio_transport

__all__ = [
    "McpCallError",
    "McpOutcomeUnknownError",
    "McpStartupError",
    "McpTimeoutError",
    "McpToolError",
    "McpUnavailableError",
    "ServerBridge",
]

_CLIENT_INFO: Final = mcp_types.Implementation(name="dsh", version="0.1.0")
#: ``_meta`` keys carrying the call's identity to the server: its idempotency key (D11;
#: the same for the call in every process that runs it, unique across sessions and calls),
#: its id (unique in its session only) and its session.
IDEMPOTENCY_KEY_META: Final = "dsh/idempotencyKey"
CALL_ID_META: Final = "dsh/callId"
SESSION_ID_META: Final = "dsh/sessionId"

#: How long after ``toolCallTimeoutMs`` the call's own deadline fires (the policy's goes first).
_BACKSTOP_GRACE_S: Final = 1.0
#: The canonical value of a successful call: the MCP blocks as JSON, and structured content.
_OUTPUT_SCHEMA: Final = {
    "type": "object",
    "properties": {"content": {"type": "array"}, "structuredContent": {}},
    "required": ["content"],
}


class McpToolError(ToolError):
    """The server answered the call with ``isError: true`` (its text is the message)."""

    code: ClassVar[str] = "MCP_TOOL_ERROR"


class McpCallError(ToolError):
    """The server answered ``tools/call`` with a JSON-RPC error, or a malformed result."""

    code: ClassVar[str] = "MCP_ERROR"


class McpOutcomeUnknownError(ToolError):
    """The connection ended while the call was in flight: it may have run on the server."""

    code: ClassVar[str] = TOOL_OUTCOME_UNKNOWN


class McpTimeoutError(ToolError):
    """No answer within ``toolCallTimeoutMs`` (without a ``timeout-policy`` row to stop it first);
    the SDK sent ``notifications/cancelled``."""

    code: ClassVar[str] = "TOOL_TIMEOUT"


class McpUnavailableError(ToolError):
    """The server is not connected (starting, reconnecting, or given up): nothing was sent."""

    code: ClassVar[str] = "MCP_UNAVAILABLE"


class McpStartupError(DshError):
    """The first connection or tool synchronization failed and ``failOnStartupError`` is set."""

    code: ClassVar[str] = "MCP_STARTUP_FAILED"


def _session_id(exec: ToolExecution) -> str | None:
    session = getattr(exec.agent, "session", None) if exec.agent is not None else None
    sid = getattr(session, "id", None)
    return sid if isinstance(sid, str) else None



def server_environment(config: McpClientConfig) -> dict[str, str]:
    """The environment a stdio server starts with: the allow-listed inherited names, then the
    row's own ``env``."""
    env = allowed_environment(DEFAULT_ENV_ALLOW + config.env_allow)
    env.update(config.env)
    return env


def server_cwd(config: McpClientConfig, workspace: str) -> str:
    """The working directory a stdio server starts in (``cwd`` is relative to the workspace)."""
    return os.path.join(workspace, config.cwd) if config.cwd else workspace


def check_command(config: McpClientConfig, workspace: str) -> None:
    """Refuse at load a stdio ``command`` that names no executable, naming it, where it was
    looked for and the closest executable of that PATH.

    A misspelt command is a configuration error, not an outage: left to the connection it
    failed as one line from inside the sandbox that named no command ("exec failed: No such
    file or directory"), and the run went on without the server's tools and exited 0.
    """
    command = config.command
    assert command is not None
    where = f"mcp-client({config.server_name})"
    if os.sep in command:
        path = os.path.join(server_cwd(config, workspace), os.path.expanduser(command))
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        state = "is not executable" if os.path.isfile(path) else "does not exist"
        raise McpClientConfigError(
            f"{where}: command {command!r} ({os.path.normpath(path)}) {state}; fix `command` "
            "(a relative path starts from the row's cwd, the workspace by default)"
        )
    search = server_environment(config).get("PATH", os.defpath)
    if shutil.which(command, path=search) is not None:
        return
    found: set[str] = set()
    for directory in filter(None, search.split(os.pathsep)):
        with contextlib.suppress(OSError):
            found.update(entry.name for entry in os.scandir(directory))
    close = difflib.get_close_matches(command, sorted(found), n=1, cutoff=0.8)
    hint = f'; did you mean "{close[0]}"?' if close else "; install it or give its full path"
    raise McpClientConfigError(
        f"{where}: command {command!r} is not an executable on the server's PATH "
        f"({search}){hint}"
    )


class ServerBridge:
    """The bridge of one ``mcp-client`` row (see the module docstring)."""

    def __init__(self, ctx: Context, config: McpClientConfig, workspace: str) -> None:
        self._ctx = ctx
        self._config = config
        self._workspace = workspace
        self._name = config.server_name
        self._log = logging.getLogger(f"dsh.mcp-client.{self._name}")
        self._session: ClientSession | None = None
        self._lost: anyio.Event | None = None
        self._generation: dict[str, Callable[[], None]] = {}
        self._destructive: set[str] = set()
        self._resync = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._closing = False
        self._started = anyio.Event()
        self._startup_error: BaseException | None = None
        self._stderr = StderrTail()
        #: connection attempts that succeeded (tests and the README's measurements read it)
        self.connections = 0
        #: generations swapped in
        self.generations = 0
        #: pid (and process group) of the current stdio child, the sandbox runner when confined
        self.server_pid: int | None = None

    # ------------------------------------------------------------------ public surface
    @property
    def server_name(self) -> str:
        return self._name

    @property
    def connected(self) -> bool:
        """A session is up and its transport has not reported the connection lost."""
        return self._session is not None and self._lost is not None and not self._lost.is_set()

    def tool_names(self) -> list[str]:
        return sorted(self._generation)

    def is_destructive(self, public_name: str) -> bool:
        return public_name in self._destructive

    async def wait_started(self) -> None:
        """Wait for the first connection attempt to settle (tools registered, or failed)."""
        await self._started.wait()
        if self._startup_error is not None and self._config.fail_on_startup_error:
            raise McpStartupError(
                f"mcp-client({self._name}): startup failed and failOnStartupError is set: "
                f"{self._describe(self._startup_error)}"
            )

    async def aclose(self) -> None:
        """Stop the supervisor, close the connection (the stdio child is reaped), drop tools."""
        self._closing = True
        if self._scope is not None:
            self._scope.cancel()
            await self._done.wait()
        self._unregister()

    # ------------------------------------------------------------------ supervisor
    async def run(self) -> None:
        reconnect = self._config.reconnect
        failures = 0
        if self._closing:  # unloaded before the task got to run
            self._started.set()
            self._done.set()
            return
        try:
            with anyio.CancelScope() as self._scope:
                while True:
                    connected_at: float | None = None
                    try:
                        async with self._connect() as lost:
                            connected_at = time.monotonic()
                            self.connections += 1
                            if failures:
                                self._log.info(
                                    "mcp-client(%s): recovered after %d attempt(s)",
                                    self._name,
                                    failures,
                                )
                            self._started.set()
                            await self._serve(lost)
                        self._log.warning("mcp-client(%s): connection lost", self._name)
                    except Exception as exc:
                        detail = self._describe(exc)
                        if not self._started.is_set():
                            self._startup_error = exc
                            self._log.error(
                                "mcp-client(%s): initial connection failed: %s", self._name, detail
                            )
                            self._started.set()
                        else:
                            self._log.warning(
                                "mcp-client(%s): connection failed: %s", self._name, detail
                            )
                        if isinstance(exc, SandboxUnavailableError):
                            return  # a host without a sandbox stays one: do not spin
                    if not reconnect.enabled:
                        self._log.error(
                            "mcp-client(%s): reconnect is disabled; its tools fail until the row "
                            "is reloaded",
                            self._name,
                        )
                        return
                    uptime = time.monotonic() - connected_at if connected_at else 0.0
                    if uptime * 1000 >= reconnect.max_delay_ms:
                        failures = 0
                    failures += 1
                    if failures > reconnect.max_attempts:
                        self._log.error(
                            "mcp-client(%s): gave up after %d consecutive failed attempts; its "
                            "tools are unregistered until the row is reloaded",
                            self._name,
                            reconnect.max_attempts,
                        )
                        self._unregister()
                        return
                    delay_ms = min(
                        reconnect.initial_delay_ms * 2 ** (failures - 1), reconnect.max_delay_ms
                    )
                    self._log.warning(
                        "mcp-client(%s): reconnecting (attempt %d of %d) in %d ms",
                        self._name,
                        failures,
                        reconnect.max_attempts,
                        delay_ms,
                    )
                    await anyio.sleep(delay_ms / 1000)
        finally:
            self._started.set()
            self._done.set()

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, TimeoutError):
            exc = TimeoutError(
                f"no answer within startupTimeoutMs ({self._config.startup_timeout_ms} ms)"
            )
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        tail = self._stderr.text()
        return f"{text} (server stderr: {tail[-400:]})" if tail else text

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[anyio.Event]:
        """Transport + initialized session + first synchronization, within the startup bound."""
        async with contextlib.AsyncExitStack() as stack:
            # Entered outside the deadline's scope: their task groups outlive it.
            link = await stack.enter_async_context(self._transport())
            lost = link.lost
            session = await stack.enter_async_context(
                ClientSession(
                    link.read,
                    link.write,
                    message_handler=self._on_message,
                    client_info=_CLIENT_INFO,
                )
            )
            with anyio.fail_after(self._config.startup_timeout_ms / 1000):
                await session.initialize()
                self._resync = anyio.Event()
                await self._synchronize(session)
            self._session, self._lost, self.server_pid = session, lost, link.pid
            try:
                yield lost
            finally:
                self._session = self._lost = self.server_pid = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Link]:
        config = self._config
        if config.transport == "streamable-http":
            assert config.url is not None
            return http_transport(config.url, config.headers)
        assert config.command is not None
        argv = [config.command, *config.args]
        env = server_environment(config)
        cwd = server_cwd(config, self._workspace)
        if config.sandbox != "danger-full-access":
            sandbox = self._ctx.get(SANDBOX)
            if sandbox is None:
                raise SandboxUnavailableError(config.sandbox)
            # The same view as every builtin tool: one policy builder (protected paths,
            # virtualenvs at any depth) for every effect the harness confines.
            policy = call_policy(config.sandbox, self._workspace)
            argv = list(sandbox.confine(argv, policy).argv)
        self._stderr = StderrTail()
        # Its own parent-death signal too: a confined child's runner dies with the harness, and
        # an unconfined child has no runner to do it.
        return stdio_transport(argv, cwd=cwd, env=env, die_with_parent=True, stderr=self._stderr)

    async def _serve(self, lost: anyio.Event) -> None:
        """Until the connection is lost: re-synchronize on each ``list_changed``."""
        session = self._session
        assert session is not None
        async with anyio.create_task_group() as group:

            async def watch_lost() -> None:
                await lost.wait()
                group.cancel_scope.cancel()

            group.start_soon(watch_lost)
            while True:
                await self._resync.wait()
                self._resync = anyio.Event()
                try:
                    await self._synchronize(session)
                except Exception as exc:
                    self._log.error(
                        "mcp-client(%s): re-synchronization failed, keeping the previous tool "
                        "generation: %s",
                        self._name,
                        self._describe(exc),
                    )

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._resync.set()
        elif isinstance(message, Exception):
            self._log.warning("mcp-client(%s): transport error: %s", self._name, message)

    # ------------------------------------------------------------------ generations
    async def _synchronize(self, session: ClientSession) -> None:
        """Fetch the complete tool list, then swap it in as one generation."""
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        definitions: dict[str, ToolDefinition] = {}
        destructive: set[str] = set()
        for tool in listed:
            public = public_tool_name(self._name, tool.name)
            if public in definitions:
                raise McpCallError(
                    f"mcp-client({self._name}): server listed tool {tool.name!r} more than once "
                    "— invalid tool list"
                )
            definitions[public] = self._definition(public, tool)
            annotations = tool.annotations
            if annotations is not None and annotations.destructive_hint is True:
                destructive.add(public)
        self._unregister()
        tools = self._ctx.service(TOOLS)
        registered: dict[str, Callable[[], None]] = {}
        try:
            for public, definition in definitions.items():
                registered[public] = tools.register(definition)
        except Exception as exc:
            for dispose in registered.values():
                dispose()
            self._log.error(
                "mcp-client(%s): tool registration failed, no tools registered: %s",
                self._name,
                exc,
            )
            return
        self._generation = registered
        self._destructive = destructive
        self.generations += 1

    def _unregister(self) -> None:
        generation, self._generation = self._generation, {}
        for dispose in generation.values():
            dispose()
        self._destructive = set()

    def _definition(self, public: str, tool: mcp_types.Tool) -> ToolDefinition:
        raw = tool.name
        parameters, lowered = lower_input_schema(tool.input_schema or {"type": "object"})
        if lowered:
            self._log.debug(
                "mcp-client(%s): tool %r: schema keywords outside the enforced subset are "
                "described, and checked by the server",
                self._name,
                raw,
            )
        read_only = tool.annotations is not None and tool.annotations.read_only_hint is True
        timeout_ms = self._config.tool_call_timeout_ms

        async def execute(args: Any, exec: ToolExecution) -> Any:
            return await self._call(raw, args, exec)

        def render(_args: Any, value: Any) -> list[ContentBlock]:
            return render_content(raw, value)

        return ToolDefinition(
            name=public,
            description=tool.description or "",
            parameters=parameters,
            execute=execute,
            output=ToolOutput(schema=_OUTPUT_SCHEMA, render=render),
            is_concurrency_safe=(lambda _args: True) if read_only else None,
            timeout_ms=timeout_ms,
        )

    # ------------------------------------------------------------------ calls
    async def _call(self, raw: str, args: Any, exec: ToolExecution) -> Any:
        session, lost = self._session, self._lost
        if session is None or lost is None or lost.is_set():
            raise McpUnavailableError(
                f'MCP server "{self._name}" is not connected (starting, or reconnecting after '
                "it was lost); the call was not sent"
            )
        meta: dict[str, Any] = {
            IDEMPOTENCY_KEY_META: exec.idempotency_key,
            CALL_ID_META: exec.call_id,
        }
        session_id = _session_id(exec)
        if session_id is not None:
            meta[SESSION_ID_META] = session_id
        # The frozen arguments as plain JSON; a non-object (a misbehaving model) is sent as {}
        # so the server answers with its own "missing argument" error, as DSH does.
        plain = to_json_builtins(args, "tool arguments")
        arguments: dict[str, Any] = plain if isinstance(plain, dict) else {}
        result: mcp_types.CallToolResult | None = None
        # The timeout-policy row enforces toolCallTimeoutMs (the tool's timeoutMs) and owns the
        # TOOL_TIMEOUT result; this later deadline only holds where no such row is composed.
        timeout_ms = self._config.tool_call_timeout_ms
        backstop_s = timeout_ms / 1000 + _BACKSTOP_GRACE_S
        with exec.signal.linked_scope() as scope:
            try:
                result = await session.call_tool(  # type: ignore[call-overload]
                    raw, arguments, read_timeout_seconds=backstop_s, meta=meta
                )
            except MCPError as exc:
                if exc.code == mcp_types.REQUEST_TIMEOUT:
                    raise McpTimeoutError(
                        f'MCP server "{self._name}" did not answer tools/call {raw!r} within '
                        f"toolCallTimeoutMs ({timeout_ms} ms); it was asked to cancel the call. "
                        "It may have partly run: its outcome is unknown."
                    ) from None
                if lost.is_set() or exc.code == mcp_types.CONNECTION_CLOSED:
                    lost.set()
                    raise _lost_error(self._name) from None
                raise McpCallError(
                    f'MCP server "{self._name}" answered tools/call {raw!r} with error '
                    f"{exc.code}: {exc.error.message}"
                ) from None
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                lost.set()
                raise _lost_error(self._name) from None
            except RuntimeError as exc:  # the SDK's output-schema check of structuredContent
                raise McpCallError(f'MCP server "{self._name}": {exc}') from None
        if scope.cancelled_caught or result is None:
            raise AbortError()
        content = [
            block.model_dump(by_alias=True, mode="json", exclude_none=True)
            for block in result.content
        ]
        if result.is_error:
            raise McpToolError(render_result(raw, {"content": content}))
        value: dict[str, Any] = {"content": content}
        if result.structured_content is not None:
            value["structuredContent"] = result.structured_content
        return value


def _lost_error(server: str) -> McpOutcomeUnknownError:
    return McpOutcomeUnknownError(
        f'the connection to MCP server "{server}" was lost while the call was in flight; it may '
        "have run on the server: its outcome is unknown"
    )
