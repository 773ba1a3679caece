"""What a confined ``bash`` call's processes get from the host, through the real ``bash`` tool.

Issue 15, class 4: the environment is an allow-list. Every case runs on both sandbox backends
and both confined modes, with an unconfined control proving the probe can see the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_host import CancelToken, Row, open_host
from dsh_host._tools import ToolExecutionInput

from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for

# both backends: subprocesses, kills and timeouts
pytestmark = [linux_only, pytest.mark.anyio, pytest.mark.both_backends]

#: Names issue 15 found leaking (credentials and host-service sockets), plus one harmless name.
LEAKY = {
    "DATABASE_URL": "postgresql://dsh:pw@127.0.0.1/db",
    "PGPASSWORD": "pg-secret",
    "MYSQL_PWD": "my-secret",
    "GITHUB_PAT": "ghp_secret",
    "REDIS_URL": "redis://:pw@127.0.0.1",
    "HTTPS_PROXY": "http://user:pw@proxy:3128",
    "NPM_CONFIG__AUTH": "npm-secret",
    "DOCKER_AUTH_CONFIG": "{}",
    "TMUX": "/tmp/tmux-0/default,1,0",
    "STY": "1.pts-0.host",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus",
}


async def bash(
    backend: str | None, mode: str, workspace: Path, command: str, **config: Any
) -> dict[str, Any]:
    """One ``bash`` call through a real host; ``backend=None`` runs it unconfined."""
    rows = [Row(name="tools")]
    if backend is not None:
        provider_for(backend)
        rows.append(Row(name="sandbox-local", config={"backend": backend}))
    settings = {"workspace": str(workspace), "sandbox": mode, **config}
    rows.append(Row(name="builtin-tools", config=settings))
    async with open_host(rows) as host:
        result = await host.ctx.tools.execute(
            ToolExecutionInput(
                call_id="call-env",
                name="bash",
                arguments={"command": command, "description": "probe the host"},
                signal=CancelToken(),
            )
        )
    assert result.value is not None, result
    value: dict[str, Any] = result.value
    return value


@pytest.fixture
def leaky_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LEAKY.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_harness_secrets_do_not_reach_a_confined_tool(
    scene: Scene, leaky_env: None, backend: str, mode: str
) -> None:
    value = await bash(backend, mode, scene.ws, "env")
    seen = value["stdout"]["text"]
    leaked = [name for name in LEAKY if f"{name}=" in seen]
    assert leaked == [], f"leaked into the {backend} {mode} tool: {leaked}"
    assert "DSH_CALL_ID=call-env" in seen


async def test_control_the_same_probe_sees_allowed_and_unconfined_variables(
    scene: Scene, leaky_env: None
) -> None:
    """Control: the variables are really set, and ``env`` shows whatever the list lets through."""
    value = await bash(None, "danger-full-access", scene.ws, "env", envAllow=list(LEAKY))
    seen = value["stdout"]["text"]
    assert [name for name in LEAKY if f"{name}={LEAKY[name]}" not in seen] == []
    for backend in BACKENDS:
        value = await bash(backend, "read-only", scene.ws, "env", envAllow=["DATABASE_URL"])
        assert f"DATABASE_URL={LEAKY['DATABASE_URL']}" in value["stdout"]["text"], backend


@pytest.mark.parametrize("backend", BACKENDS)
async def test_workspace_git_and_venvs_stay_read_only_through_the_tool(
    scene: Scene, backend: str
) -> None:
    """Class 9: ``.git`` and virtualenvs in the workspace are read-only under workspace-write;
    the rest of the workspace stays writable."""
    (scene.ws / ".git" / "hooks").mkdir(parents=True)
    (scene.ws / "venv").mkdir()
    (scene.ws / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    hook, pth = scene.ws / ".git/hooks/post-checkout", scene.ws / "venv/evil.pth"
    command = f"echo ok > {scene.ws}/free.txt; echo x > {hook}; echo x > {pth}"
    value = await bash(backend, "workspace-write", scene.ws, command)
    assert (scene.ws / "free.txt").read_text() == "ok\n"
    assert not hook.exists() and not pth.exists(), value
    assert value["sandbox"]["denied"] is True


@pytest.mark.parametrize("backend", BACKENDS)
async def test_control_protected_paths_are_what_blocks(scene: Scene, backend: str) -> None:
    """Control: with nothing protected the same writes land (and unconfined they land too)."""
    (scene.ws / ".git" / "hooks").mkdir(parents=True)
    hook = scene.ws / ".git/hooks/post-checkout"
    await bash(
        backend, "workspace-write", scene.ws, f"echo x > {hook}",
        protectedPaths=[], protectVirtualenvs=False,
    )  # fmt: skip
    assert hook.exists()
    hook.unlink()
    await bash(None, "danger-full-access", scene.ws, f"echo x > {hook}")
    assert hook.exists()


def test_landlock_refuses_a_launcher_inside_the_workspace(scene: Scene) -> None:
    """The launcher runs unconfined until it confines itself: one inside a writable root (here:
    a copy in the workspace, or a symlink there to the real one) could be rewritten by a call."""
    import shutil

    from dsh_sandbox_local import (
        LocalSandboxProvider,
        SandboxLocalConfig,
        SandboxUnavailableError,
    )
    from dsh_sandbox_local.profiles import launcher_files

    interpreter, script = launcher_files()
    copy = scene.ws / "landlock_run.py"
    shutil.copy(script, copy)
    link = scene.ws / "python"
    link.symlink_to(interpreter)
    for launcher in ([interpreter, "-I", "-S", str(copy)], [str(link), "-I", "-S", script]):
        provider = LocalSandboxProvider(
            SandboxLocalConfig(backend="landlock"), landlock_launcher=launcher
        )
        with pytest.raises(SandboxUnavailableError, match="lives inside the writable root"):
            provider.confine(["true"], scene.policy("workspace-write"))
        assert provider.confine(["true"], scene.policy("read-only")).backend == "landlock"
    # the default launcher (outside the workspace) is accepted
    default = LocalSandboxProvider(SandboxLocalConfig(backend="landlock"))
    assert default.confine(["true"], scene.policy("workspace-write")).backend == "landlock"
