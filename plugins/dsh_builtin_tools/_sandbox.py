"""The one place this plugin imports the sandbox contract.

The contract (policy, confined argv, ``SandboxUnavailableError`` with code
``SANDBOX_UNAVAILABLE``) currently lives in ``dsh_sandbox_local.contract`` and
is moving to ``dsh_host.sandbox``; when it moves, this import is the only line
to change. Everything else in the plugin talks to the provider through
``ctx.get("sandbox")``, never through the provider's module.
"""

from __future__ import annotations

from dsh_host.sandbox import (
    DEFAULT_PROTECTED_NAMES,
    SANDBOX_MODES,
    ConfinedArgv,
    SandboxMode,
    SandboxPolicy,
    SandboxUnavailableError,
    workspace_read_only_paths,
    writable_roots,
)

__all__ = [
    "DEFAULT_PROTECTED_NAMES",
    "SANDBOX_MODES",
    "ConfinedArgv",
    "SandboxMode",
    "SandboxPolicy",
    "SandboxUnavailableError",
    "workspace_read_only_paths",
    "writable_roots",
]
