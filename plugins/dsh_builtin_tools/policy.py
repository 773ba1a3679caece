"""The one sandbox policy of one call of this row's tools.

Every tool of the row that touches the machine takes its view from the
:class:`~dsh_host._sandbox.SandboxPolicy` built here, once per call: ``bash`` hands it to the
sandbox provider, ``write_file`` / ``edit_file`` refuse writes under its read-only paths
(:func:`~dsh_builtin_tools.files.target_dir`), and ``glob`` / ``grep`` confine their ripgrep
helper with its ``read-only`` form. The protected list is built from the workspace as it is when
the call starts (the virtualenv search walks the tree), so it runs on a worker thread.
"""

from __future__ import annotations

import anyio.to_thread

from dsh_host.sdk import SandboxMode, SandboxPolicy, ToolExecution, call_policy

from .config import BuiltinToolsConfig

__all__ = ["session_id_of", "tool_policy"]


def session_id_of(exec: ToolExecution | None) -> str | None:
    """The id of the session a call belongs to, when it belongs to one."""
    agent = exec.agent if exec is not None else None
    session = getattr(agent, "session", None) if agent is not None else None
    session_id = getattr(session, "id", None)
    return session_id if isinstance(session_id, str) else None


async def tool_policy(
    config: BuiltinToolsConfig, workspace: str, mode: SandboxMode, exec: ToolExecution | None
) -> SandboxPolicy:
    """This row's policy for one call under ``mode`` (the row's, or a granted escalation)."""

    def build() -> SandboxPolicy:
        return call_policy(
            mode,
            workspace,
            protected_names=config.protected_paths,
            virtualenvs=config.protect_virtualenvs,
            session_id=session_id_of(exec),
        )

    return await anyio.to_thread.run_sync(build)
