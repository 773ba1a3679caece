"""Harness secrets stay out of a tool call's reach (issue 43, class 7).

``dsh serve --token-file F`` used to leave ``F`` readable by a ``read-only`` ``cat``; the
token approves gated calls. The policy's ``hidden_paths`` (and the process-wide registry ``dsh
serve`` fills) are covered inside the sandbox; a backend that cannot hide them refuses to confine.
The harness's environment (DSNs, API keys) is not readable through ``/proc/<pid>/environ``.
Each attempt runs confined and unconfined (the control proves it works), judged from the host.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig, SandboxPolicy

import dsh_host._sandbox as host_sandbox
from dsh_host._sandbox import SandboxUnavailableError
from dsh_host._server import command as serve_command

from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for, run_confined

pytestmark = linux_only

CELLS = [pytest.param(b, m, id=f"{b}-{m}") for b in BACKENDS for m in MODES]


@pytest.fixture
def no_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(host_sandbox, "_harness_secrets", [])
    yield


VALUE = "tok-" + uuid.uuid4().hex
"""The secret's content (never part of a path, so an error message naming the file is no leak)."""


def _secret(scene: Scene) -> str:
    path = scene.out / "token"
    path.write_text(f"{VALUE}\n")
    return str(path)


def _cat(backend: str, policy: SandboxPolicy, path: str) -> subprocess.CompletedProcess[str]:
    confined = provider_for(backend).confine(["cat", path], policy)
    return run_confined(confined, cwd="/")


@pytest.mark.parametrize(("backend", "mode"), CELLS)
def test_a_hidden_path_cannot_be_read(
    scene: Scene, backend: str, mode: str, no_registered_secrets: None
) -> None:
    secret = _secret(scene)
    base = scene.policy(mode)
    hidden = SandboxPolicy(mode=base.mode, workspace_root=base.workspace_root,
                           read_only_paths=base.read_only_paths, hidden_paths=(secret,))  # fmt: skip
    control = _cat(backend, base, secret)
    assert VALUE in control.stdout, "control: the confined cat should read the file"
    result = _cat(backend, hidden, secret)
    assert VALUE not in result.stdout + result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_registered_harness_secret_is_hidden_from_every_policy(
    scene: Scene, backend: str, no_registered_secrets: None
) -> None:
    """What ``dsh serve --token-file`` does: registered once, hidden from a policy that never
    named it (a bash call, an MCP server), because ``confine()`` adds it."""
    secret = _secret(scene)
    assert VALUE in _cat(backend, scene.policy("read-only"), secret).stdout  # control
    host_sandbox.hide_from_sandboxes(secret)
    result = _cat(backend, scene.policy("read-only"), secret)
    assert VALUE not in result.stdout + result.stderr


def test_landlock_without_namespaces_refuses_to_confine_a_hidden_path(
    scene: Scene, no_registered_secrets: None
) -> None:
    """A Landlock rule cannot take a file back from a readable root; without the launcher's
    mount namespace the call is refused (fail closed), and ``can_hide_paths`` says so."""
    provider = LocalSandboxProvider(SandboxLocalConfig(backend="landlock"),
                                    landlock_isolation=False)  # fmt: skip
    assert provider.probe().backend == "landlock"
    assert not provider.can_hide_paths()
    policy = SandboxPolicy(mode="read-only", workspace_root=str(scene.ws),
                           hidden_paths=(_secret(scene),))  # fmt: skip
    with pytest.raises(SandboxUnavailableError, match="cannot hide host paths"):
        provider.confine(["cat", "/dev/null"], policy)
    assert provider_for("bubblewrap").can_hide_paths()
    assert provider_for("landlock").can_hide_paths()  # root: the launcher's namespaces


def test_serve_token_file_is_registered_for_hiding(
    scene: Scene, no_registered_secrets: None
) -> None:
    secret = _secret(scene)
    args = argparse.Namespace(token_file=secret)
    assert serve_command._token(args) == VALUE
    assert host_sandbox.harness_secret_paths() == (os.path.realpath(secret),)


@pytest.mark.parametrize(("backend", "mode"), CELLS)
def test_the_harness_environment_is_not_readable(scene: Scene, backend: str, mode: str) -> None:
    """A stand-in harness holds a secret in its environment; ``/proc/<pid>/environ`` gives it
    to the unconfined control, never to a confined call (another PID namespace, and ptrace
    access checks refuse it)."""
    harness = subprocess.Popen(["sleep", "1000"], env={"DSH_FAKE_DSN": f"postgres://{VALUE}"})
    try:
        target = f"/proc/{harness.pid}/environ"
        control = subprocess.run(["cat", target], capture_output=True, text=True, check=False)
        assert VALUE in control.stdout
        confined = provider_for(backend).confine(["cat", target], scene.policy(mode))
        result = run_confined(confined)
        assert VALUE not in result.stdout + result.stderr
        assert result.returncode != 0
    finally:
        harness.kill()
        harness.wait()
