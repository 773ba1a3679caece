"""Shared test configuration: which anyio backends an async test runs on, private user dirs.

anyio backends (D2: the code runs on trio and on asyncio):

- An async test marked ``@pytest.mark.both_backends`` (on the test, or a module's
  ``pytestmark``) runs once per backend, ids ``[trio]`` and ``[asyncio]``. Mark the tests
  whose subject behaves differently per backend: cancellation, subprocesses, threads,
  sockets and HTTP, timeouts, signal handling, the persistence write-behind, the agent loop.
- Every other async test (pure logic that happens to be ``async``) runs once, on
  :data:`DEFAULT_BACKEND`, id ``[trio]``: a second run would test the event loop, not dsh.
- A test that parametrizes ``anyio_backend`` itself keeps exactly what it chose.

``tests/test_backends.py`` guards the rule: the core paths must still be collected on both.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

#: Tests never fail on timing (a loaded CI machine is slow, not wrong): hypothesis keeps its
#: input checks but neither a per-example deadline nor the "generation is slow" health check.
settings.register_profile(
    "dsh", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("dsh")

#: Sample projects the tests run tools on (their own tests fail on purpose until a scripted
#: agent fixes them), not part of this suite.
collect_ignore = ["fixtures"]

BACKENDS = ("trio", "asyncio")
DEFAULT_BACKEND = "trio"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_backends: run this async test on trio and on asyncio (its subject is "
        "backend-specific; see tests/conftest.py)",
    )


def _parametrizes_backend(metafunc: pytest.Metafunc) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",")]
        if "anyio_backend" in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "anyio_backend" not in metafunc.fixturenames or _parametrizes_backend(metafunc):
        return
    both = metafunc.definition.get_closest_marker("both_backends") is not None
    backends = BACKENDS if both else (DEFAULT_BACKEND,)
    metafunc.parametrize("anyio_backend", [pytest.param(b, id=b) for b in backends])


@pytest.fixture
def anyio_backend() -> str:
    """Replaced by the parametrization above (this definition shadows anyio's own, which would
    run every async test on every backend)."""
    return DEFAULT_BACKEND


@pytest.fixture(autouse=True)
def _private_user_dirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No test reads or writes the real ``~/.config/dsh``, ``~/.local/share/dsh``, ``~/.cache/dsh``.

    The XDG directories (the default session root, the user's composition and trust store, the
    summaries ``dsh sessions list`` remembers) move to a fresh directory per test, removed
    afterwards. It is under ``/var/tmp``, not ``/tmp``, like a real home: a test's workspace is
    often under ``/tmp``, and Landlock's workspace-write grants the host ``/tmp``, while a
    session root or dsh config directory a tool could write is refused at boot (D15,
    D16). Subprocesses inherit the variables.
    """
    base = Path(tempfile.mkdtemp(prefix="dsh-test-home-", dir="/var/tmp"))
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.delenv("DSH_SESSION_ROOT", raising=False)
    monkeypatch.delenv("DSH_CONFIG", raising=False)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
