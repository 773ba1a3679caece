"""Helpers for the sandbox suite: real bubblewrap, real Landlock, a persistent scratch area.

The workspace and every "outside" target live on a persistent filesystem that is **not** /tmp:
bubblewrap's /tmp is a private tmpfs and Landlock grants all of host /tmp under
``workspace-write``, so a /tmp target would prove nothing. The base directory is
``$DSH_SANDBOX_TEST_ROOT`` or /var/tmp.

A backend that cannot be used on this machine FAILS the tests that need it (the suite exists to
prove confinement; a silent skip would hide a host where nothing is enforced). Set
``DSH_SANDBOX_ALLOW_SKIP=1`` to skip instead, e.g. on a developer machine without bubblewrap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dsh_sandbox_local import (
    ConfinedArgv,
    LocalSandboxProvider,
    SandboxLocalConfig,
    SandboxPolicy,
)

from dsh_host._sandbox import workspace_read_only_paths

BACKENDS = ("bubblewrap", "landlock")
MODES = ("read-only", "workspace-write")

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the local sandbox backends are Linux-only"
)


def persistent_base() -> Path:
    base = Path(os.environ.get("DSH_SANDBOX_TEST_ROOT", "/var/tmp")).resolve()
    if base == Path("/tmp") or Path("/tmp") in base.parents:
        raise RuntimeError(f"DSH_SANDBOX_TEST_ROOT must not be under /tmp (got {base})")
    return base


@dataclass
class Scene:
    """A scratch area: ``ws`` is the workspace, ``out`` is outside every grant."""

    base: Path
    ws: Path
    out: Path
    token: str

    def policy(self, mode: str) -> SandboxPolicy:
        """The policy the ``bash`` tool builds: in ``workspace-write`` the workspace's existing
        ``.git``, ``.dsh``, ``dsh.yml`` and virtualenvs are read-only paths."""
        protected = workspace_read_only_paths(str(self.ws)) if mode == "workspace-write" else ()
        return SandboxPolicy(
            mode=mode,  # type: ignore[arg-type]
            workspace_root=str(self.ws),
            read_only_paths=protected,
        )


@contextlib.contextmanager
def make_scene() -> Iterator[Scene]:
    base = Path(tempfile.mkdtemp(prefix="dsh-sandbox-test-", dir=persistent_base())).resolve()
    ws = base / "ws"
    out = base / "out"
    ws.mkdir()
    out.mkdir()
    try:
        yield Scene(base=base, ws=ws, out=out, token=base.name)
    finally:
        shutil.rmtree(base, ignore_errors=True)


_providers: dict[tuple[str, str, str], LocalSandboxProvider] = {}


def provider_for(
    backend: str, network: str = "deny", unix_sockets: str = "deny"
) -> LocalSandboxProvider:
    """A provider forced onto ``backend``; fails (or skips, see module doc) if unusable."""
    key = (backend, network, unix_sockets)
    provider = _providers.get(key)
    if provider is None:
        config = SandboxLocalConfig(
            backend=backend,  # type: ignore[arg-type]
            network=network,  # type: ignore[arg-type]
            unix_sockets=unix_sockets,  # type: ignore[arg-type]
        )
        provider = LocalSandboxProvider(config)
        _providers[key] = provider
    verdict = provider.probe()
    if verdict.backend != backend:
        message = f"{backend} is not usable here: {'; '.join(verdict.failures)}"
        if os.environ.get("DSH_SANDBOX_ALLOW_SKIP") == "1":
            pytest.skip(message)
        pytest.fail(message)
    return provider


def run_confined(
    confined: ConfinedArgv, cwd: Path | str = "/", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Spawn the wrapped argv the way the bash executor does (own session, only stdio)."""
    return subprocess.run(
        list(confined.argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,  # hang protection only; nothing asserts on time
        close_fds=True,
        start_new_session=True,
        cwd=cwd,
        check=False,
    )


def eventually(predicate: Callable[[], bool]) -> bool:
    """Poll ``predicate`` (hang protection: give up after a minute; no timing is asserted)."""
    for _ in range(600):
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def sleepers(marker: str) -> list[int]:
    """PIDs whose command line carries this test's unique marker (its bash and its sleep)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline and b"bwrap" not in cmdline and b"landlock_run" not in cmdline:
                found.append(int(entry))
    return found
