"""Fixtures of the crash suite: the stores, the sandbox mode, a pool of child runs, the tally.

The suite runs against the persistence backends: JSONL files and an SQLite
database under the session's temporary directory, and a real PostgreSQL server (the one
tests/postgres uses, ``DSH_TEST_POSTGRES_DSN``), where every child run gets a
schema of its own under one random prefix, all dropped when the session ends.
PostgreSQL cases skip, with the reason, only when no server answers.

Children run ``DSH_CRASH_JOBS`` at a time (default 2, the CI machine's cores);
kill points are instrumented inside each child, so overlapping runs do not
change where a child dies, only how long the suite takes. Each module submits
only the runs its *selected* tests need (``-k`` works as expected).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from postgres.conftest import DSN, drop_schemas

from .harness import TALLY, CrashStore, JsonlStore, PostgresStore, SqliteStore, sandbox_mode

#: the persistence backends the suite runs against (``CrashStore.kind``)
KINDS = ("jsonl", "sqlite", "postgres")


@dataclass
class Stores:
    """One :class:`CrashStore` per backend; ``None`` (with ``why``) when it cannot run here."""

    jsonl: JsonlStore
    sqlite: SqliteStore
    postgres: PostgresStore | None
    why: str = ""

    def get(self, kind: str) -> CrashStore | None:
        if kind == "jsonl":
            return self.jsonl
        return self.sqlite if kind == "sqlite" else self.postgres

    def need(self, kind: str) -> CrashStore:
        """The store of ``kind``, or skip the calling test saying why there is none."""
        store = self.get(kind)
        if store is None:
            pytest.skip(self.why)
        return store


def _postgres_problem() -> str | None:
    try:
        with psycopg.connect(DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return f"{type(error).__name__}: {str(error).strip()}"
    return None


@pytest.fixture(scope="session")
def crash_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    jsonl = JsonlStore(tmp_path_factory.getbasetemp())
    sqlite = SqliteStore(tmp_path_factory.getbasetemp())
    problem = _postgres_problem()
    if problem is not None:
        yield Stores(jsonl, sqlite, None, f"no PostgreSQL server answers at {DSN!r} ({problem})")
        return
    prefix = f"dsh_c{uuid.uuid4().hex[:12]}"
    try:
        yield Stores(jsonl, sqlite, PostgresStore(DSN, prefix))
    finally:
        drop_schemas(DSN, prefix)


@pytest.fixture(scope="session")
def crash_pool() -> Iterator[ThreadPoolExecutor]:
    jobs = int(os.environ.get("DSH_CRASH_JOBS", "2"))
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="crash-child") as pool:
        yield pool


@pytest.fixture(scope="session")
def sandbox() -> str:
    """``workspace-write`` (bubblewrap or Landlock confines bash) when a backend works here."""
    return sandbox_mode()


def selected_params(request: pytest.FixtureRequest, name: str) -> list[Any]:
    """The values of parameter ``name`` among the selected tests of the requesting module."""
    out: list[Any] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            if name in callspec.params and callspec.params[name] not in out:
                out.append(callspec.params[name])
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    summary = {kind: TALLY[kind].as_json() for kind in KINDS if kind in TALLY}
    terminalreporter.write_sep("-", "crash suite")
    terminalreporter.write_line(json.dumps(summary, indent=2))
    report = os.environ.get("DSH_CRASH_REPORT")
    if report:
        with open(report, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")
