"""The ``sandbox-local`` plugin: provides the ``sandbox`` service."""

from __future__ import annotations

import logging

import anyio.to_thread

from dsh_host.sdk import (
    SANDBOX,
    Context,
    Plugin,
    RunTermKeys,
)

from .provider import LocalSandboxProvider, SandboxLocalConfig

log = logging.getLogger("dsh.sandbox-local")


class SandboxLocal(Plugin):
    """Local confinement for ``ctx.sandbox.confine(argv, policy)``: bubblewrap, else Landlock.

    The backend probe runs once in a worker thread right after mounting, so the first tool call
    does not block the event loop on it; ``confine`` waits for that probe if it is still running.
    """

    name = "sandbox-local"
    provides = ("sandbox",)
    Config = SandboxLocalConfig
    #: ``runnerCommand`` replaces bubblewrap with any program: only trusted config may set it
    executable_keys = ("runner_command",)
    run_terms = RunTermKeys(network="network")
    runs_confined = True

    def apply(self, ctx: Context, config: SandboxLocalConfig) -> None:
        provider = LocalSandboxProvider(config)
        ctx.provide(SANDBOX, provider)

        async def warm_up() -> None:
            try:
                await anyio.to_thread.run_sync(provider.probe)
            except Exception:  # confine() re-runs the probe and raises it to its caller
                log.exception("sandbox-local: backend probe failed")

        ctx.start_soon(warm_up, name="sandbox-local probe")
