"""``sandbox-local``: confine commands with bubblewrap or Landlock; refuse when neither works.

The contract types (:mod:`dsh_host._sandbox`) are re-exported here for convenience.
``danger-full-access`` is *not* a sandbox: consumers spawn the original argv and never call the
provider for it.
"""

from dsh_host.sdk import (
    CONFINED_SANDBOX_MODES,
    SANDBOX_MODES,
    ConfinedArgv,
    InvalidSandboxRequestError,
    RunnerFailureRule,
    SandboxPolicy,
    SandboxProvider,
    SandboxUnavailableError,
    writable_roots,
)

from .plugin import SandboxLocal
from .probe import clear_probe_cache
from .provider import LocalSandboxProvider, SandboxConfigError, SandboxLocalConfig

__all__ = [
    "CONFINED_SANDBOX_MODES",
    "SANDBOX_MODES",
    "ConfinedArgv",
    "InvalidSandboxRequestError",
    "LocalSandboxProvider",
    "RunnerFailureRule",
    "SandboxConfigError",
    "SandboxLocal",
    "SandboxLocalConfig",
    "SandboxPolicy",
    "SandboxProvider",
    "SandboxUnavailableError",
    "clear_probe_cache",
    "writable_roots",
]
