"""The plugin in a real host: live sessions reach PostgreSQL through the session store's events
(the live-binding contract, tests/persistence/live_contract.py, runs here too);
configs/postgres.yml composes it, and the ``dsh`` CLI runs and resumes on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_session_persistence_postgres import PostgresSessionPersistence
from persistence.live_contract import *  # noqa: F403
from persistence.live_contract import one_turn, wire

from dsh_host import Row, open_host, open_host_from_yaml
from dsh_host._persistence.persistence import SessionOwnershipLostError
from dsh_host.errors import BootError

from .helpers import backend, lock_pid, query, stored_rows, until, until_gone

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def rows(dsn: str, schema: str, **config: Any) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": dsn, "schema": schema, **config}),
    ]


class PostgresLive:
    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema

    def rows(self) -> list[Row]:
        return rows(self.dsn, self.schema)

    async def stored(self, session_id: str) -> list[Any]:
        async with backend(self.dsn, self.schema) as b:
            return wire((await (await b.open(session_id, "read")).read()).events)


@pytest.fixture
def live_backend(pg_dsn: str, pg_schema: str) -> PostgresLive:
    return PostgresLive(pg_dsn, pg_schema)


async def test_the_artifact_is_named_by_schema_and_id(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("live-1", meta={"cwd": "/work/project"})
        path = host.ctx.sessionPersistence.locate(session.header).path
        assert path == f"{pg_schema}.events#live-1"


async def test_the_window_writes_without_an_explicit_flush(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("window", meta={"cwd": "/p"})
        one_turn(session)
        backend_ = host.ctx.sessionPersistence
        await until(lambda: backend_.owner("window") is not None)
        handle = backend_.owner("window")
        await until(lambda: handle.durable_seq == len(session.events))
        assert len(stored_rows(pg_dsn, pg_schema, "window")) == len(session.events)


async def test_a_lost_lock_fails_the_next_sessions_flush(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("lost", meta={"cwd": "/p"})
        one_turn(session, close=False)
        await host.ctx.sessions.flush(session)
        handle = host.ctx.sessionPersistence.owner("lost")
        pid = lock_pid(handle)
        assert pid is not None
        query(pg_dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        await until_gone(pg_dsn, pid)
        session.append("step/end", {"turn": 1, "step": 1})
        with pytest.raises(SessionOwnershipLostError):
            await host.ctx.sessions.flush(session)
        host.ctx.sessions.detach(session)  # the final drain reports the loss; no crash
    assert len(stored_rows(pg_dsn, pg_schema, "lost")) == 3


def test_dsn_comes_from_the_environment_or_the_row_fails(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def boot(config: dict[str, Any]) -> Any:
        row = Row(name="session-persistence-postgres", config={"schema": pg_schema, **config})
        async with open_host([Row(name="sessions"), row]) as host:
            service = host.ctx.sessionPersistence
            assert isinstance(service, PostgresSessionPersistence)
            return await service.list()

    monkeypatch.setenv("DSH_TEST_PG", pg_dsn)
    assert anyio.run(boot, {"dsn_env": "DSH_TEST_PG"}) == []
    monkeypatch.delenv("DSH_TEST_PG")
    with pytest.raises(BootError, match=r"\$DSH_TEST_PG, which is not set"):
        anyio.run(boot, {"dsn_env": "DSH_TEST_PG"})
    with pytest.raises(BootError, match=r"exactly one of config\.dsn"):
        anyio.run(boot, {})
    with pytest.raises(BootError, match=r"exactly one of config\.dsn"):
        anyio.run(boot, {"dsn": pg_dsn, "dsn_env": "DSH_TEST_PG"})


async def test_configs_postgres_yml_composes_the_backend(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_POSTGRES_DSN", pg_dsn)
    monkeypatch.setenv("DSH_POSTGRES_SCHEMA", pg_schema)
    async with open_host_from_yaml(REPO / "configs" / "postgres.yml") as host:
        service = host.ctx.sessionPersistence
        assert isinstance(service, PostgresSessionPersistence)
        assert service.storage.schema == pg_schema
        states = {row["id"]: row["state"] for row in host.status()}
        assert set(states.values()) == {"active"}, states


def dsh(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsh_host", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def test_the_cli_runs_lists_and_resumes_on_postgres(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    env = {"DSH_POSTGRES_DSN": pg_dsn, "DSH_POSTGRES_SCHEMA": pg_schema}
    config = str(REPO / "configs" / "postgres.yml")
    run = dsh("run", "--config", config, "--json", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    session_id = result["sessionId"]
    assert len(stored_rows(pg_dsn, pg_schema, session_id)) == result["events"]
    listing = dsh("sessions", "list", "--config", config, "--json", cwd=tmp_path, env=env)
    assert listing.returncode == 0, listing.stderr
    assert session_id in listing.stdout
    # Another process (another "worker") continues the same session.
    again = dsh(
        "run",
        "and again",
        "--config",
        config,
        "--session",
        session_id,
        "--model",  # a demo session continues only with a model named (the change is logged)
        "demo",
        "--json",
        cwd=tmp_path,
        env=env,
    )
    assert again.returncode in (0, 1), again.stderr
    stored = [json.loads(text) for _, text in stored_rows(pg_dsn, pg_schema, session_id)]
    assert [e["seq"] for e in stored] == list(range(len(stored)))
    assert len(stored) > result["events"]
