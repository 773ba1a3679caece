"""``dsh serve`` holds under abuse and faults: rebinding pages, racing clients, bad input, a
full disk, an immutable log. Real Hypercorn on loopback, real JSONL files, a real full disk (a
small tmpfs mounted for the test), a real immutable file (``chattr +i``)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions, open_runtime

from .harness import REPO, Server, read_sse, running_server, write_composition

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["message"]
    return str(error["code"])


# ---------------------------------------------------------------------------- Host / Origin


async def test_without_a_token_only_the_loopback_names_are_answered(tmp_path: Path) -> None:
    """A DNS-rebinding page reaches 127.0.0.1 under its own name: its ``Host`` is refused (421)
    before any route runs, reads and writes alike; the loopback names are answered."""
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        port = _port(server)
        client = server.client
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1", f"localhost:{port + 1}",
                     f"127.0.0.1.nip.io:{port}"):
            for request in (client.get("/sessions", headers={"Host": host}),
                            client.post("/sessions", json={}, headers={"Host": host})):
                assert await _error(await request, 421) == "MISDIRECTED_REQUEST"
        listed = await client.get("/sessions")
        assert listed.status_code == 200 and listed.json() == {"sessions": []}  # none created
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                     f"LOCALHOST:{port}"):
            assert (await client.get("/sessions", headers={"Host": host})).status_code == 200


async def test_a_foreign_origin_cannot_change_state(tmp_path: Path) -> None:
    """Every state-changing request from a foreign ``Origin`` is refused (403 FOREIGN_ORIGIN)
    and changes nothing; the inspector's own origin and a ``--cors-origin`` may."""
    responses = [{"text": "x"}]
    async with running_server(tmp_path, responses, cors=("http://ui.example",)) as server:
        port = _port(server)
        session_id = await server.create()
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                       f"http://127.0.0.1:{port + 1}"):
            headers = {"Origin": origin}
            for method, path, body in (
                ("POST", "/sessions", {}),
                ("POST", f"/sessions/{session_id}/turns", {"prompt": "x"}),
                ("POST", f"/sessions/{session_id}/cancel", None),
                ("POST", f"/sessions/{session_id}/approvals/c1", {"decision": "allow"}),
                ("DELETE", "/sessions", None),
            ):
                response = await server.client.request(method, path, json=body, headers=headers)
                assert await _error(response, 403) == "FOREIGN_ORIGIN", (origin, path)
        listed = (await server.client.get("/sessions")).json()["sessions"]
        # nothing changed: the one event is the run terms the creation recorded
        assert [(s["id"], s["events"]) for s in listed] == [(session_id, 1)]
        for origin in (f"http://127.0.0.1:{port}", "http://ui.example"):
            created = await server.client.post("/sessions", json={}, headers={"Origin": origin})
            assert created.status_code == 201, created.text
    async with running_server(tmp_path, responses, token="t0ken") as server:
        # With a token any Host is answered (a proxy may forward any name), but a foreign
        # page still cannot write, even with the token.
        evil = {"Host": "dsh.example", "Origin": "http://evil.example"}
        assert await _error(await server.client.post("/sessions", json={}, headers=evil),
                            403) == "FOREIGN_ORIGIN"
        own = {"Host": "dsh.example", "Origin": "https://dsh.example"}
        assert (await server.client.post("/sessions", json={}, headers=own)).status_code == 201


# ---------------------------------------------------------------------------- one conflict


async def test_concurrent_creates_of_one_id_get_one_201_and_409s(tmp_path: Path) -> None:
    """20 concurrent ``POST /sessions`` with one id: one is created, every other one is the
    same conflict with the same answer (409 SESSION_ALREADY_EXISTS), whichever layer saw it
    (the store's live id or the backend's stored one)."""
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        for wave in range(3):
            answers: list[tuple[int, str | None]] = []

            async def create(session_id: str, answers: list[tuple[int, str | None]]) -> None:
                response = await server.client.post("/sessions", json={"id": session_id})
                code = None if response.status_code == 201 else response.json()["error"]["code"]
                answers.append((response.status_code, code))

            async with anyio.create_task_group() as group:
                for _ in range(20):
                    group.start_soon(create, f"same-{wave}", answers)
            assert sorted(answers, key=str) == sorted(
                [(201, None)] + [(409, "SESSION_ALREADY_EXISTS")] * 19, key=str), answers


# ---------------------------------------------------------------------------- bad input


async def test_bad_input_is_a_4xx_with_a_stable_code(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        client = server.client
        session_id = await server.create()
        assert await _error(await client.post("/sessions", json={"workspace": "/tmp\x00x"}),
                            400) == "INVALID_REQUEST"
        for bad in (2**53, 2**63, 10**30):
            assert await _error(await client.get(f"/sessions/{session_id}/events",
                                                 params={"after": str(bad)}),
                                400) == "INVALID_REQUEST"
            assert await _error(await client.get(f"/sessions/{session_id}/stream",
                                                 headers={"Last-Event-ID": str(bad)}),
                                400) == "INVALID_REQUEST"
            assert await _error(await client.get(f"/sessions/{session_id}/stream",
                                                 params={"after": str(bad)}),
                                400) == "INVALID_REQUEST"
        # The largest seq a log can hold is a valid cursor: nothing after it.
        assert await server.events(session_id, after=2**53 - 2) == []
        for bad_id in ("a/b", "../x", "..", ".hidden", "-x", "a b", "é", "x" * 129, "a\x00b",
                       ""):
            assert await _error(await client.post("/sessions", json={"id": bad_id}),
                                400) == "INVALID_SESSION_ID", bad_id
        for good_id in ("a", "A.b_c-9", "x" * 128):
            assert (await client.post("/sessions", json={"id": good_id})).status_code == 201
            assert (await client.get(f"/sessions/{good_id}")).status_code == 200
        for path in ("/sessions/a%00b", "/sessions/a%00b/events", "/sessions/a%01b/stream"):
            assert await _error(await client.get(path), 404) == "NOT_FOUND"
        for path in ("/sessions/a%00b/turns", f"/sessions/{session_id}/approvals/c%00"):
            response = await client.post(path, json={"prompt": "x"})
            assert await _error(response, 404) == "NOT_FOUND"


# ---------------------------------------------------------------------------- store faults


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


async def test_a_turn_on_an_immutable_log_is_503_and_loses_nothing(tmp_path: Path) -> None:
    """The log file is immutable (``chattr +i``; root cannot write it either): the store
    cannot take the turn. That is the server's disk, not the client's mistake: 503
    STORE_UNAVAILABLE with Retry-After, and once the file is writable again the same request
    works and the log verifies."""
    answers = [{"text": "before"}, {"text": "after the outage"}]
    async with running_server(tmp_path, answers) as server:
        session_id = await server.create()
        await server.turn(session_id, "first")
        before = await server.wait_turn_end(session_id, 1)
        log = next(server.root.rglob(f"{session_id}/session.v3.jsonl*"))
        with _immutable(log):
            response = await server.client.post(f"/sessions/{session_id}/turns",
                                                json={"prompt": "hi"})
            assert await _error(response, 503) == "STORE_UNAVAILABLE"
            assert int(response.headers["retry-after"]) > 0
            session = (await server.client.get(f"/sessions/{session_id}")).json()
            assert session["status"] == "idle" and session["events"] == before["events"]
        assert await server.turn(session_id, "hi") == 2
        ended = await server.wait_turn_end(session_id, 2)
        assert ended["lastTurnEnd"]["kind"] == "completed"


@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A real filesystem of ``size`` at ``path`` (tmpfs): writing past it is ENOSPC."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; the filler's path (remove it to free the disk)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


SLOW = {"text": "one two three four five six seven eight", "chunk_delay_ms": 20}


async def test_the_stream_shows_only_what_the_store_holds_on_a_full_disk(tmp_path: Path) -> None:
    """A follower streams a turn that runs while the disk is full: the events exist in memory
    but no flush stores them. The stream must show none of them: after the disk is freed, the
    next turn stores *other* events under the same seqs, and every frame the follower got
    must be, byte for byte, the event the log holds under its seq."""
    with _small_disk(tmp_path / "disk", "4m") as disk:
        async with running_server(disk, [SLOW, {"text": "stored"}]) as server:
            session_id = await server.create()
            filler: list[Path] = []

            async def faults() -> None:
                filler.append(_fill(disk))
                response = await server.client.post(f"/sessions/{session_id}/turns",
                                                    json={"prompt": "lost on a full disk"})
                if response.status_code == 202:  # the turn ran and could store nothing
                    await server.wait(session_id, lambda s: s["status"] != "running")
                else:
                    assert await _error(response, 503) == "STORE_UNAVAILABLE"
                filler[0].unlink()
                await server.turn(session_id, "stored after the disk was freed")

            frames = await read_sse(
                server.client, f"/sessions/{session_id}/stream?after=-1",
                until=lambda data: data["type"] == "turn/end"
                and data["data"]["reason"]["kind"] == "completed", started=faults)
            stored = {e["seq"]: e for e in await server.events(session_id)}
            assert frames and all(data == stored[seq] for seq, _, data in frames), (
                frames, stored)
            assert frames[-1][2]["data"]["turn"] == max(
                e["data"]["turn"] for e in stored.values() if e["type"] == "turn/start")
            verify = await anyio.run_process(
                [sys.executable, "-m", "dsh_host", "sessions", "verify", session_id, "--root",
                 str(server.root)], check=False)
            assert verify.returncode == 0, verify.stdout + verify.stderr


# ---------------------------------------------------------------------------- streams


async def test_a_new_follower_gets_news_and_a_cursor_gets_history(tmp_path: Path) -> None:
    """Without a cursor a stream starts after what is stored (every *new* event, as
    documented); ``?after=-1`` replays the history first; ``GET /events`` is streamed."""
    async with running_server(tmp_path, [{"text": "one"}, {"text": "two"}]) as server:
        session_id = await server.create()
        await server.turn(session_id, "first")
        await server.wait_turn_end(session_id, 1)
        history = await server.events(session_id)
        fresh = await read_sse(
            server.client, f"/sessions/{session_id}/stream",
            until=lambda d: d["type"] == "turn/end",
            started=lambda: server.turn(session_id, "second"))
        assert fresh[0][0] == history[-1]["seq"] + 1
        assert [d["data"]["turn"] for _, t, d in fresh if t == "turn/start"] == [2]
        everything = await read_sse(
            server.client, f"/sessions/{session_id}/stream?after=-1",
            until=lambda d: d["type"] == "turn/end" and d["data"]["turn"] == 2)
        stored = await server.events(session_id)
        assert [data for _, _, data in everything] == stored
        assert json.loads(json.dumps(stored[: len(history)])) == history


# ---------------------------------------------------------------------------- status


async def test_an_open_turn_another_process_runs_is_running_not_interrupted(
    tmp_path: Path,
) -> None:
    """``dsh run`` (another process) holds the session with its turn open in the log: the
    server reads the same log as a crash would leave it, but the session is held, so its
    status is ``running``. Once that process is SIGKILLed the open turn is a crash's
    leftover: ``interrupted``."""
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        session_id = await server.create()
        script = tmp_path / "hang.json"
        script.write_text(json.dumps({"responses": [{"text": "thinking", "hang": True}]}))
        runner = await anyio.open_process(
            [sys.executable, "-m", "dsh_host", "run", "--session", session_id, "--root",
             str(server.root), "--config", str(tmp_path / "dsh.yml"), "--model",
             f"scripted:{script}", "--workspace", str(server.workspace), "hold the session"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            opened = await server.wait(session_id, lambda s: s["lastTurn"] == 1)
            assert opened["status"] == "running", opened
            listed = (await server.client.get("/sessions")).json()["sessions"]
            assert [s["status"] for s in listed] == ["running"]
            busy = await server.client.post(f"/sessions/{session_id}/turns",
                                            json={"prompt": "x"})
            # The other process's --model is a logged override of the session's terms that this
            # server cannot build, and the terms are checked before the hold: refused all the same.
            assert await _error(busy, 409) == "TERMS_REFUSED"
        finally:
            runner.kill()
            await runner.wait()
        left = (await server.client.get(f"/sessions/{session_id}")).json()
        assert left["status"] == "interrupted", left


# ---------------------------------------------------------------------------- slow clients


async def _raw(server: Server, request: bytes) -> bytes:
    """Send ``request`` on a raw connection; what the server answers before it closes."""
    port = _port(server)
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        received = b""
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while b"\r\n\r\n" not in received or not received.endswith(b"}"):
                received += await stream.receive()
        return received


async def test_a_body_that_never_arrives_whole_is_408(tmp_path: Path) -> None:
    """A client declares a body and sends part of it, then nothing: the server answers 408
    REQUEST_TIMEOUT once the body deadline passed (it does not wait for ever)."""
    async with running_server(tmp_path, [{"text": "x"}], body_timeout=0.5) as server:
        port = _port(server)
        head = (f"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode()
        with anyio.fail_after(120):  # not a timing: a server that never answers fails here
            answer = await _raw(server, head)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "REQUEST_TIMEOUT"
        assert (await server.client.get("/sessions")).json() == {"sessions": []}


async def test_a_client_gone_mid_body_is_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        port = _port(server)
        head = (f"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode()
        with caplog.at_level("INFO", logger="dsh.server"):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(head)
            await server.wait_logged(caplog, "")  # the server's first word on it
            assert (await server.client.get("/healthz")).status_code == 200
        server_records = [r for r in caplog.records if r.name.startswith(("dsh.server",
                                                                          "hypercorn"))]
        assert [r.exc_info for r in server_records] == [None] * len(server_records), [
            r.getMessage() for r in server_records]
        assert not any("Traceback" in r.getMessage() for r in server_records)


# ---------------------------------------------------------------------------- memory


async def test_a_session_whose_turn_ended_is_not_kept_in_memory(tmp_path: Path) -> None:
    """After its turn, nothing of the server keeps the session's log in memory: the agent
    host used to keep every closed agent (and so every session it ever ran, whole) for the
    server's life. The scripted model's own request record (a test double's) is cleared, and
    then the session object must be gone."""
    (tmp_path / "ws").mkdir()
    script = tmp_path / "script.json"
    # Each answer waits half a second, so the turn is still running when the request that
    # started it looks (a turn that never blocks may otherwise end before it gets the loop).
    script.write_text(json.dumps({"responses": [
        {"text": "one", "delay_ms": 500}, {"text": "two", "delay_ms": 500}]}))
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp_path)), [], f"scripted:{script}", str(tmp_path / "s")),
        default_workspace=str((tmp_path / "ws").resolve()),
    )
    async with open_runtime(options) as runtime:
        gone: list[weakref.ref[Any]] = []
        for prompt in ("first", "second"):
            session_id = (await runtime.create_session(
                workspace=None, composition=None, session_id=None)).id
            await runtime.start_turn(session_id, prompt)
            running = runtime.running(session_id)
            assert running is not None
            gone.append(weakref.ref(running.agent.session))
            del running
            while True:  # the turn ends
                if runtime.running(session_id) is None:
                    break
                await anyio.sleep(0.05)
        host = await runtime.host(options.default_composition, options.default_workspace)
        host.ctx.llm.adapter_for("scripted").requests.clear()
        # A session's write handle closes in the background after its turn (its last window
        # and the release of its lock), so the session goes shortly after the turn, not at
        # once; a session the server keeps never goes (a guard of a minute ends the wait).
        with anyio.move_on_after(60):
            while any(ref() is not None for ref in gone):
                gc.collect()
                await anyio.sleep(0.05)
        assert [ref() for ref in gone] == [None, None]


# ---------------------------------------------------------------------------- store outages


def test_an_unreachable_postgresql_is_one_line_and_a_503(tmp_path: Path) -> None:
    """``dsh serve`` over a PostgreSQL nobody listens for (a closed loopback port): the
    failing background schema check is one log line, not a traceback, and every read is 503
    STORE_UNAVAILABLE with Retry-After (the client did nothing wrong)."""
    pytest.importorskip("psycopg")
    with socket.socket() as probe:  # a port nobody listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
               "DSH_POSTGRES_DSN": f"host=127.0.0.1 port={port} dbname=test connect_timeout=5"}
        config = tmp_path / "dsh.yml"
        config.write_text((REPO / "configs" / "postgres.yml").read_text())
        (tmp_path / "ws").mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsh_host", "serve", "--config", str(config), "--port", "0",
             "--workspace", str(tmp_path / "ws"), "--model", "demo"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("dsh serve: listening on "), line
            url = line.split()[4].rstrip("/")
            for path in ("/sessions", "/approvals", "/sessions/x", "/sessions/x/events"):
                response = httpx.get(f"{url}{path}", timeout=60)
                assert response.status_code == 503, (path, response.text)
                assert response.json()["error"]["code"] == "STORE_UNAVAILABLE"
                assert int(response.headers["retry-after"]) > 0
            created = httpx.post(f"{url}/sessions", json={}, timeout=60)
            assert created.status_code == 503, created.text
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
    assert "cannot reach PostgreSQL" in stderr


def test_a_damaged_sqlite_index_kills_serve_loudly_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite maps its WAL index (``-shm``): cut short under a running server, the next read
    is SIGBUS, which nothing in Python can catch. The death is said on stderr (the fault
    handler's "Bus error" and where), and a restarted server has every stored session."""
    root, workspace = tmp_path / "root", tmp_path / "ws"
    root.mkdir()
    workspace.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
           "DSH_SESSION_ROOT": str(root)}

    def start() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsh_host", "serve", "--config",
             str(REPO / "configs" / "sqlite.yml"), "--port", "0", "--workspace", str(workspace),
             "--model", "demo"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), line
        return proc, line.split()[4].rstrip("/")

    proc, url = start()
    try:
        created = httpx.post(f"{url}/sessions", json={"id": "kept"}, timeout=60)
        assert created.status_code == 201, created.text
        os.truncate(root / "sessions.sqlite3-shm", 0)
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{url}/sessions", timeout=60)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, stderr)
    assert "Fatal Python error: Bus error" in stderr, stderr
    again, url = start()
    try:
        listed = httpx.get(f"{url}/sessions", timeout=60).json()["sessions"]
        assert [s["id"] for s in listed] == ["kept"]
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)


async def test_a_202_means_the_prompt_is_stored(tmp_path: Path) -> None:
    """Right after ``202`` the session's page shows the turn: its prompt is in the log (the
    page read ``idle, 0 events`` while the turn had not stored anything yet)."""
    async with running_server(tmp_path, [{"text": "thinking", "hang": True}]) as server:
        session_id = await server.create()
        assert await server.turn(session_id, "remember me") == 1
        page = (await server.client.get(f"/sessions/{session_id}")).json()
        assert (page["status"], page["lastTurn"], page["title"]) == (
            "running", 1, "remember me"), page
        assert page["events"] > 0
        stored = await server.events(session_id)
        assert any(e["type"] == "user/message" for e in stored)
        cancelled = await server.client.post(f"/sessions/{session_id}/cancel")
        assert cancelled.status_code == 202, cancelled.text
        ended = await server.wait_turn_end(session_id, 1)
        assert ended["lastTurnEnd"]["kind"] == "aborted"


def test_a_sqlite_write_failure_is_503_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite cannot write (its files made immutable under the running server): a create is
    503 STORE_UNAVAILABLE with Retry-After (it was 400, as if the client were wrong); once the
    files are writable again the same request is 201 and the earlier session is intact."""
    root, workspace = tmp_path / "root", tmp_path / "ws"
    root.mkdir()
    workspace.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
           "DSH_SESSION_ROOT": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config",
         str(REPO / "configs" / "sqlite.yml"), "--port", "0", "--workspace", str(workspace),
         "--model", "demo"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dsh serve: listening on "), line
        url = line.split()[4].rstrip("/")
        assert httpx.post(f"{url}/sessions", json={"id": "first"}, timeout=60).status_code == 201
        files = sorted(root.glob("sessions.sqlite3*"))
        files = [f for f in files if f.is_file()]
        with contextlib.ExitStack() as stack:
            for path in files:
                stack.enter_context(_immutable(path))
            refused = httpx.post(f"{url}/sessions", json={"id": "second"}, timeout=60)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "STORE_UNAVAILABLE"
            assert int(refused.headers["retry-after"]) > 0
        again = httpx.post(f"{url}/sessions", json={"id": "second"}, timeout=60)
        assert again.status_code == 201, again.text
        listed = httpx.get(f"{url}/sessions", timeout=60).json()["sessions"]
        assert sorted(s["id"] for s in listed) == ["first", "second"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
