"""``mcp-client``: bridge one Model Context Protocol server's tools into the harness."""

from dsh_host.sdk import require_extra

with require_extra("mcp"):
    from .bridge import (
        McpCallError,
        McpOutcomeUnknownError,
        McpStartupError,
        McpTimeoutError,
        McpToolError,
        McpUnavailableError,
        ServerBridge,
    )
    from .config import McpClientConfig, McpClientConfigError, ReconnectConfig
    from .naming import public_tool_name
    from .plugin import McpClient
    from .results import project_text

__all__ = [
    "McpCallError",
    "McpClient",
    "McpClientConfig",
    "McpClientConfigError",
    "McpOutcomeUnknownError",
    "McpStartupError",
    "McpTimeoutError",
    "McpToolError",
    "McpUnavailableError",
    "ReconnectConfig",
    "ServerBridge",
    "project_text",
    "public_tool_name",
]
