"""The plugin boots from a composition row and provides ``ctx.sandbox``."""

from __future__ import annotations

import pytest
from dsh_sandbox_local import LocalSandboxProvider, SandboxLocal, SandboxPolicy, SandboxProvider

from dsh_host import Row, open_host
from dsh_host.errors import ConfigError

from .sandbox_harness import Scene, linux_only, run_confined

# both backends: subprocesses
pytestmark = [linux_only, pytest.mark.anyio, pytest.mark.both_backends]


async def test_host_boots_sandbox_local_and_confines(scene: Scene) -> None:
    rows = [Row(id="sb", name="sandbox-local", config={"network": "deny", "backend": "auto"})]
    async with open_host(rows) as host:
        sandbox = host.ctx.sandbox
        assert isinstance(sandbox, LocalSandboxProvider)
        assert isinstance(sandbox, SandboxProvider)
        confined = host.ctx.sandbox.confine(
            ["bash", "-c", f"echo inside > {scene.ws}/a; echo outside > {scene.out}/b"],
            SandboxPolicy(mode="workspace-write", workspace_root=str(scene.ws)),
        )
        assert confined.backend == "bubblewrap"
        result = run_confined(confined)
        assert result.returncode != 0
        assert (scene.ws / "a").read_text() == "inside\n"
        assert not (scene.out / "b").exists()


async def test_dsh_spelling_and_forced_landlock() -> None:
    rows = [Row(name="dsh-sandbox-local", config={"backend": "landlock", "network": "allow"})]
    async with open_host(rows) as host:
        confined = host.ctx.sandbox.confine(
            ["true"], SandboxPolicy(mode="read-only", workspace_root="/var/tmp")
        )
        assert confined.backend == "landlock"
        assert "--deny-tcp" not in confined.argv


async def test_bad_config_is_a_config_error_naming_the_key() -> None:
    rows = [Row(name="sandbox-local", config={"probeTimeoutMs": 0})]
    with pytest.raises(ConfigError, match="probe_timeout_ms must be a positive finite number"):
        async with open_host(rows):
            pass


def test_plugin_metadata() -> None:
    assert SandboxLocal.name == "sandbox-local"
    assert SandboxLocal.provides == ("sandbox",)
