"""Developer sessions: ``nox -s tests_trio tests_asyncio tests_fast lint typecheck bench``.

Async tests run on trio, and those marked ``both_backends`` on asyncio too (tests/conftest.py);
the two test sessions select one backend each (``-k`` on the parameter id) so a failure says
which event loop it belongs to. ``tests_fast`` is the development lane: everything not ``slow``.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests_trio", "tests_asyncio", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests_trio(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-k", "not asyncio", *session.posargs)


@nox.session
def tests_asyncio(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-k", "not trio", *session.posargs)


@nox.session
def tests_fast(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "not slow", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("mypy", "--strict", "dsh_host", "plugins", "tests")


@nox.session
def bench(session: nox.Session) -> None:
    """All benchmarks with small N (see bench/README.md)."""
    session.install("-e", ".")
    session.run("python", "bench/run_all.py", "--small", *session.posargs)
