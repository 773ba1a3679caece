"""The plugin in a real host: live sessions reach PostgreSQL through the session store's events;
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
from persistence.helpers import plain

from dsh_host import Row, open_host, open_host_from_yaml
from dsh_host.errors import BootError
from dsh_host.session.events import event_to_builtins
from dsh_host.session.persistence import (
    SessionAlreadyExistsError,
    SessionOwnershipLostError,
    SessionPersistence,
)
from dsh_host.session.repair import interrupted_turn_closers
from dsh_host.session.session import Session

from .helpers import backend, query, stored_rows, until, until_gone

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def wire(events: Any) -> list[Any]:
    return [plain(event_to_builtins(e)) for e in events]


def rows(dsn: str, schema: str, **config: Any) -> list[Row]:
    return [
        Row(name="sessions"),
        Row(name="session-persistence-postgres", config={"dsn": dsn, "schema": schema, **config}),
    ]


def one_turn(session: Session, *, close: bool = True) -> None:
    session.append("turn/start", {"turn": 1})
    session.append(
        "user/message",
        {
            "id": "u1",
            "role": "user",
            "content": [{"type": "text", "text": "hi"}],
            "source": {"kind": "user"},
        },
        surface_op="append",
    )
    session.append("step/start", {"turn": 1, "step": 1})
    if close:
        session.append("step/end", {"turn": 1, "step": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


async def stored(dsn: str, schema: str, sid: str) -> list[Any]:
    async with backend(dsn, schema) as b:
        return wire((await (await b.open(sid, "read")).read()).events)


async def test_live_session_is_durable_after_sessions_flush(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        ctx = host.ctx
        assert isinstance(ctx.sessionPersistence, SessionPersistence)
        session = ctx.sessions.create("live-1", meta={"cwd": "/work/project"})
        one_turn(session)
        assert await ctx.sessions.flush(session) is True
        assert await stored(pg_dsn, pg_schema, "live-1") == wire(session.events)
        assert ctx.sessionPersistence.locate(session.header).path == f"{pg_schema}.events#live-1"


async def test_unflushed_events_are_drained_when_the_host_closes(
    pg_dsn: str, pg_schema: str
) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("drain", meta={"cwd": "/p"})
        one_turn(session)
        expected = wire(session.events)
    assert await stored(pg_dsn, pg_schema, "drain") == expected


async def test_the_window_writes_without_an_explicit_flush(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("window", meta={"cwd": "/p"})
        one_turn(session)
        backend_ = host.ctx.sessionPersistence
        await until(lambda: backend_.owner("window") is not None)
        handle = backend_.owner("window")
        await until(lambda: handle.durable_seq == len(session.events))
        assert len(stored_rows(pg_dsn, pg_schema, "window")) == len(session.events)


async def test_resume_adopts_the_resumers_write_handle(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("resume", meta={"cwd": "/p"})
        one_turn(session, close=False)  # the process "crashes" inside turn 1
        await host.ctx.sessions.flush(session)
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        ctx = host.ctx
        handle = await ctx.sessionPersistence.open("resume", "write")
        load = await handle.read()
        closers = interrupted_turn_closers(load.events)
        assert [c.type for c in closers] == ["step/end", "turn/end"]
        handle.append(closers)
        await handle.flush()
        restored = Session.restore(load.header, list(load.events) + closers)
        ctx.sessions.attach(restored)  # session/created: the plugin adopts `handle`
        restored.append("turn/start", {"turn": 2})
        await ctx.sessions.flush(restored)
        assert handle.bound is restored
        events = await stored(pg_dsn, pg_schema, "resume")
        assert events == wire(restored.events)
        assert [e["type"] for e in events[3:]] == [
            "step/end",
            "turn/end",
            "session/end-seed",
            "turn/start",
        ]


async def test_a_new_session_reusing_a_stored_id_fails_at_its_flush(
    pg_dsn: str, pg_schema: str
) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        first = host.ctx.sessions.create("taken", meta={"cwd": "/p"})
        one_turn(first)
        await host.ctx.sessions.flush(first)
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        impostor = host.ctx.sessions.create("taken", meta={"cwd": "/p"})
        impostor.append("turn/start", {"turn": 1})
        with pytest.raises(SessionAlreadyExistsError, match="id collision"):
            await host.ctx.sessions.flush(impostor)
    assert len(stored_rows(pg_dsn, pg_schema, "taken")) == 5  # the stored log is untouched


async def test_a_lost_lock_fails_the_next_sessions_flush(pg_dsn: str, pg_schema: str) -> None:
    async with open_host(rows(pg_dsn, pg_schema)) as host:
        session = host.ctx.sessions.create("lost", meta={"cwd": "/p"})
        one_turn(session, close=False)
        await host.ctx.sessions.flush(session)
        handle = host.ctx.sessionPersistence.owner("lost")
        pid = handle.backend_pid
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
        assert service.schema == pg_schema
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
        "--json",
        cwd=tmp_path,
        env=env,
    )
    assert again.returncode in (0, 1), again.stderr
    stored = [json.loads(text) for _, text in stored_rows(pg_dsn, pg_schema, session_id)]
    assert [e["seq"] for e in stored] == list(range(len(stored)))
    assert len(stored) > result["events"]
