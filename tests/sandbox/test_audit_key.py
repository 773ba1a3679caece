"""The default audit signing key stays out of every confined call's reach.

An attested export is only worth the secrecy of its key: a tool that could read
``$XDG_CONFIG_HOME/dsh/audit-ed25519.pem`` could sign a forged log. Tools run in processes that
never load the audit code, so the key is named in ``harness_secret_paths()``, which every
``confine()`` asks. Each attempt runs confined and unconfined, and confined with the key at a
path the harness does not know (the control proving the confined ``cat`` reads such a file), on
both backends and both modes, judged from the host.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsh_host._sandbox as host_sandbox
from dsh_host._session.audit import default_key_file, load_or_create_key

from .sandbox_harness import BACKENDS, MODES, Scene, linux_only, provider_for, run_confined

pytestmark = linux_only

CELLS = [pytest.param(b, m, id=f"{b}-{m}") for b in BACKENDS for m in MODES]


@pytest.fixture
def no_registered_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(host_sandbox, "_harness_secrets", [])
    yield


def _cat(backend: str, scene: Scene, mode: str, path: Path) -> subprocess.CompletedProcess[str]:
    confined = provider_for(backend).confine(["cat", str(path)], scene.policy(mode))
    return run_confined(confined, cwd="/")


@pytest.mark.parametrize(("backend", "mode"), CELLS)
def test_the_default_audit_key_cannot_be_read_by_a_confined_call(
    scene: Scene,
    backend: str,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    no_registered_secrets: None,
) -> None:
    config = scene.out / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    key_file = default_key_file()
    load_or_create_key()  # what `dsh sessions export --attest` does on first use
    assert key_file == config / "dsh" / "audit-ed25519.pem" and key_file.exists()
    secret = key_file.read_text()
    assert "PRIVATE KEY" in secret
    unconfined = subprocess.run(["cat", str(key_file)], capture_output=True, text=True,
                                check=False)  # fmt: skip
    assert unconfined.stdout == secret  # control: the attempt works without a sandbox
    # Control: with the config dir pointing elsewhere the harness does not know this file is
    # its key, and the same confined cat reads it (reads are not restricted).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(scene.out / "elsewhere"))
    control = _cat(backend, scene, mode, key_file)
    assert secret in control.stdout, "control: the confined cat should read the file"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    assert str(key_file.resolve()) in host_sandbox.harness_secret_paths()
    result = _cat(backend, scene, mode, key_file)
    # bubblewrap covers the file (cat fails), Landlock's launcher binds an empty one over it.
    assert "PRIVATE KEY" not in result.stdout + result.stderr
