"""``dsh serve``'s HTTP API over real HTTP on loopback, on trio and on asyncio.

A real Hypercorn serves the real Starlette app over a socket; the turns run the real agent loop,
tools pipeline (bash in the sandbox), approval row and JSONL store, with a scripted model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from dsh_host._server.command import ServeUsageError
from dsh_host._server.serve import check_bind

from .harness import CALL, Server, ledger_call, running_server

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def results_per_call(events: list[dict[str, Any]]) -> dict[str, int]:
    calls = {e["data"]["callId"]: 0 for e in events if e["type"] == "tool/call"}
    for event in events:
        if event["type"] == "tool/result":
            calls[event["data"]["message"]["source"]["callId"]] += 1
    return calls


def _metrics(text: str) -> dict[str, float]:
    return {name: float(value) for name, value in (
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


async def _logs_read(server: Server) -> float:
    """``dsh_serve_logs_read_total``: the logs the server has read whole to summarize them."""
    return _metrics((await server.client.get("/metrics")).text)["dsh_serve_logs_read_total"]


async def test_session_lifecycle_over_http(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "Hello from the model."}]) as server:
        created = (await server.client.post("/sessions", json={})).json()
        assert created["status"] == "idle" and created["events"] == 1  # its run/terms
        assert created["workspace"] == str(server.workspace.resolve())
        assert created["composition"] == "default"
        session_id = created["id"]
        assert await server.turn(session_id, "say hello") == 1
        session = await server.wait_turn_end(session_id, 1)
        assert session["lastTurnEnd"]["kind"] == "completed"
        assert session["title"] == "say hello"
        assert session["usage"]["outputTokens"] > 0
        # the scripted model has no list price: its cost is unknown, never 0
        assert session["usage"]["requests"] == 1 and session["usage"]["costUsd"] is None
        assert session["header"]["id"] == session_id and session["pendingApprovals"] == []
        listed = (await server.client.get("/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [session_id]
        events = await server.events(session_id)
        assert [e["seq"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "turn/end"
        texts = [b["text"] for e in events if e["type"] == "assistant/message"
                 for b in e["data"]["message"]["content"] if b["type"] == "text"]
        assert texts == ["Hello from the model."]
        tail = await server.events(session_id, after=events[-3]["seq"])
        assert [e["seq"] for e in tail] == [events[-2]["seq"], events[-1]["seq"]]
        assert await server.events(session_id, after=events[-1]["seq"]) == []


async def test_deferred_approval_is_decided_through_the_api_and_runs_once(tmp_path: Path) -> None:
    responses = [ledger_call(), {"text": "The ledger was updated."}]
    async with running_server(tmp_path, responses) as server:
        session_id = await server.create()
        await server.turn(session_id, "append to the ledger")
        session = await server.wait_turn_end(session_id, 1)
        assert session["status"] == "awaiting-approval"
        assert session["lastTurnEnd"]["kind"] == "awaiting-approval"
        assert server.ledger() == []  # nothing ran before the decision
        pending = (await server.client.get("/approvals")).json()["approvals"]
        assert [(p["sessionId"], p["callId"], p["tool"]) for p in pending] == [
            (session_id, CALL, "bash")]
        # A new turn is refused while a call waits.
        busy = await server.client.post(f"/sessions/{session_id}/turns", json={"prompt": "x"})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "AWAITING_APPROVAL"
        # A decision for other arguments than the ones shown is refused, and records nothing.
        wrong = await server.client.post(
            f"/sessions/{session_id}/approvals/{CALL}",
            json={"decision": "allow", "argsDigest": "0" * 64},
        )
        assert wrong.status_code == 409, wrong.text
        assert wrong.json()["error"]["code"] == "APPROVAL_NOT_PENDING"
        decided = await server.client.post(
            f"/sessions/{session_id}/approvals/{CALL}",
            json={"decision": "allow", "reason": "looks fine",
                  "argsDigest": pending[0]["argsDigest"]},
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["continued"] is True and decided.json()["turn"] == 2
        session = await server.wait_turn_end(session_id, 2)
        assert session["lastTurnEnd"]["kind"] == "completed", session
        assert server.ledger() == [CALL]
        events = await server.events(session_id)
        assert results_per_call(events) == {CALL: 1}
        decided_events = [e for e in events if e["type"] == "approval/decided"]
        assert decided_events[-1]["data"]["outcome"] != "rejected"
        assert (await server.client.get("/approvals")).json()["approvals"] == []
        again = await server.client.post(
            f"/sessions/{session_id}/approvals/{CALL}", json={"decision": "deny"})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "APPROVAL_NOT_PENDING"


async def test_a_denied_call_never_runs(tmp_path: Path) -> None:
    responses = [ledger_call(), {"text": "Understood, not appending."}]
    async with running_server(tmp_path, responses) as server:
        session_id = await server.create()
        await server.turn(session_id, "append to the ledger")
        await server.wait_turn_end(session_id, 1)
        decided = await server.client.post(
            f"/sessions/{session_id}/approvals/{CALL}", json={"decision": "deny", "reason": "no"})
        assert decided.status_code == 200, decided.text
        session = await server.wait_turn_end(session_id, 2)
        assert session["lastTurnEnd"]["kind"] == "completed"
        assert server.ledger() == []
        events = await server.events(session_id)
        assert results_per_call(events) == {CALL: 1}


async def test_cancel_ends_the_running_turn_aborted(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "thinking", "hang": True}]) as server:
        session_id = await server.create()
        await server.turn(session_id, "take your time")
        await server.wait(session_id, lambda s: s["status"] == "running")
        busy = await server.client.post(f"/sessions/{session_id}/turns", json={"prompt": "again"})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "SESSION_BUSY"
        cancelled = await server.client.post(f"/sessions/{session_id}/cancel")
        assert cancelled.status_code == 202 and cancelled.json()["turn"] == 1
        session = await server.wait_turn_end(session_id, 1)
        assert session["lastTurnEnd"]["kind"] == "aborted"
        idle = await server.client.post(f"/sessions/{session_id}/cancel")
        assert idle.status_code == 409 and idle.json()["error"]["code"] == "NOT_RUNNING"


async def test_every_error_is_json_with_a_stable_code(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "x"}], max_body_bytes=2048) as server:
        client = server.client

        async def code(response: httpx.Response, status: int) -> str:
            assert response.status_code == status, response.text
            assert response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert error["message"]
            return str(error["code"])

        assert await code(await client.get("/sessions/nope"), 404) == "SESSION_NOT_FOUND"
        assert await code(await client.get("/sessions/nope/events"), 404) == "SESSION_NOT_FOUND"
        assert await code(await client.post("/sessions/nope/turns", json={"prompt": "x"}),
                          404) == "SESSION_NOT_FOUND"
        assert await code(await client.get("/no/such/route"), 404) == "NOT_FOUND"
        assert await code(await client.delete("/sessions"), 405) == "METHOD_NOT_ALLOWED"
        assert await code(await client.post(
            "/sessions", content=b"{not json", headers={"content-type": "application/json"}),
            400) == "INVALID_REQUEST"
        assert await code(await client.post("/sessions", json={"colour": "red"}),
                          400) == "INVALID_REQUEST"
        assert await code(await client.post("/sessions", content=b"{}"), 415) == (
            "UNSUPPORTED_MEDIA_TYPE")
        big = {"prompt": "x" * 4096}
        session_id = await server.create()
        assert await code(await client.post(f"/sessions/{session_id}/turns", json=big),
                          413) == "PAYLOAD_TOO_LARGE"

        async def chunks() -> Any:  # no Content-Length: the limit is counted while reading
            for _ in range(8):
                yield b" " * 512

        assert await code(await client.post(
            f"/sessions/{session_id}/turns", content=chunks(),
            headers={"content-type": "application/json"}), 413) == "PAYLOAD_TOO_LARGE"
        assert await code(await client.post("/sessions", json={"workspace": "/etc"}),
                          400) == "WORKSPACE_REFUSED"
        assert await code(await client.post("/sessions", json={"composition": "other"}),
                          400) == "UNKNOWN_COMPOSITION"
        assert await code(await client.get(f"/sessions/{session_id}/events",
                                           params={"after": "x"}), 400) == "INVALID_REQUEST"
        assert await code(await client.post(
            f"/sessions/{session_id}/approvals/nocall", json={"decision": "maybe"}),
            400) == "INVALID_REQUEST"
        assert await code(await client.post(
            f"/sessions/{session_id}/approvals/nocall", json={"decision": "allow"}),
            409) == "APPROVAL_NOT_PENDING"
        assert await code(await client.post("/sessions", json={"id": session_id}),
                          409) == "SESSION_ALREADY_EXISTS"


async def test_workspace_inside_an_allowed_root(tmp_path: Path) -> None:
    other = tmp_path / "projects" / "one"
    other.mkdir(parents=True)
    async with running_server(tmp_path, [{"text": "x"}],
                              allow=(str((tmp_path / "projects").resolve()),)) as server:
        created = await server.client.post("/sessions", json={"workspace": str(other)})
        assert created.status_code == 201, created.text
        assert created.json()["workspace"] == str(other.resolve())
        outside = await server.client.post("/sessions", json={"workspace": str(tmp_path)})
        assert outside.json()["error"]["code"] == "WORKSPACE_REFUSED"


async def test_bearer_token(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "x"}], token="s3cret-token") as server:
        async with httpx.AsyncClient(base_url=server.url) as anonymous:
            assert (await anonymous.get("/healthz")).status_code == 200
            missing = await anonymous.get("/sessions")
            assert missing.status_code == 401
            assert missing.json()["error"]["code"] == "UNAUTHORIZED"
            wrong = await anonymous.get("/sessions", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "UNAUTHORIZED"
            assert (await anonymous.get("/metrics")).status_code == 401
            assert (await anonymous.post("/sessions", json={})).status_code == 401
        assert (await server.client.get("/sessions")).status_code == 200


async def test_cors_is_off_unless_configured(tmp_path: Path) -> None:
    origin = {"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}
    async with running_server(tmp_path, [{"text": "x"}]) as server:
        response = await server.client.get("/healthz", headers=origin)
        assert "access-control-allow-origin" not in response.headers
    async with running_server(tmp_path, [{"text": "x"}],
                              cors=("http://ui.example",)) as server:
        allowed = await server.client.get("/healthz", headers={"Origin": "http://ui.example"})
        assert allowed.headers["access-control-allow-origin"] == "http://ui.example"
        other = await server.client.get("/healthz", headers=origin)
        assert "access-control-allow-origin" not in other.headers


async def test_openapi_documents_every_route_and_metrics_count(tmp_path: Path) -> None:
    async with running_server(tmp_path, [{"text": "Hi."}]) as server:
        document = (await server.client.get("/openapi.json")).json()
        assert document["openapi"].startswith("3.")
        paths = document["paths"]
        assert set(paths) >= {
            "/healthz", "/metrics", "/sessions", "/sessions/{id}", "/sessions/{id}/events",
            "/sessions/{id}/stream", "/sessions/{id}/turns", "/sessions/{id}/cancel",
            "/approvals", "/sessions/{id}/approvals/{callId}",
        }
        assert set(paths["/sessions"]) == {"get", "post"}
        session_id = await server.create()
        await server.turn(session_id, "hi")
        await server.wait_turn_end(session_id, 1)
        lines = _metrics((await server.client.get("/metrics")).text)
        assert lines["dsh_serve_turns_started_total"] == 1
        assert lines['dsh_serve_turns_ended_total{kind="completed"}'] == 1
        assert lines["dsh_serve_steps_total"] >= 1
        assert lines["dsh_serve_flush_seconds_count"] >= 1
        assert lines["dsh_serve_pending_approvals"] == 0


async def test_listings_read_only_the_logs_that_changed(tmp_path: Path) -> None:
    """``GET /sessions`` (the inspector polls it) and ``GET /approvals`` read a stored log only
    when its revision changed since the last read; what they return is the same either way."""
    async with running_server(tmp_path, [{"text": "One."}, {"text": "Two."}]) as server:
        first, second = await server.create(), await server.create()
        for session_id in (first, second):
            await server.turn(session_id, "hi")
            await server.wait_turn_end(session_id, 1)

        async def listed() -> list[dict[str, Any]]:
            sessions: list[dict[str, Any]] = (await server.client.get("/sessions")).json()[
                "sessions"]
            return sessions

        before = await listed()
        assert {s["id"] for s in before} == {first, second}
        start = await _logs_read(server)
        assert await listed() == before
        assert (await server.client.get("/approvals")).json() == {"approvals": []}
        assert await _logs_read(server) == start

        log = next(server.root.rglob(f"{first}/session.v3.jsonl.zstd"))
        os.utime(log)  # a new revision of the same bytes: read again, the same summary
        assert await listed() == before
        assert await _logs_read(server) == start + 1

        await server.turn(second, "again")
        await server.wait_turn_end(second, 2)
        after = {s["id"]: s for s in await listed()}
        assert after[second]["lastTurn"] == 2 and after[second]["events"] > next(
            s["events"] for s in before if s["id"] == second)
        assert after[first] == next(s for s in before if s["id"] == first)


async def test_a_session_page_reads_its_log_only_when_it_changed(tmp_path: Path) -> None:
    """``GET /sessions/{id}`` (the inspector's session page polls it) asks the store for the
    log's revision and reads the log only when it moved; the answer is the same either way."""
    async with running_server(tmp_path, [{"text": "One."}, {"text": "Two."}]) as server:
        session_id = await server.create()
        await server.turn(session_id, "hi")
        await server.wait_turn_end(session_id, 1)

        async def page() -> dict[str, Any]:
            response = await server.client.get(f"/sessions/{session_id}")
            assert response.status_code == 200
            body: dict[str, Any] = response.json()
            return body

        first = await page()
        assert first["header"]["id"] == session_id and first["pendingApprovals"] == []
        assert first["status"] == "idle" and first["runningTurn"] is None
        start = await _logs_read(server)
        assert await page() == first
        assert await _logs_read(server) == start

        os.utime(next(server.root.rglob(f"{session_id}/session.v3.jsonl.zstd")))
        assert await page() == first
        assert await _logs_read(server) == start + 1

        await server.turn(session_id, "again")
        ended = await server.wait_turn_end(session_id, 2)
        assert ended["lastTurn"] == 2 and ended["events"] > first["events"]
        missing = await server.client.get("/sessions/no-such-session")
        assert missing.status_code == 404


def test_no_token_means_loopback_only(tmp_path: Path) -> None:
    with pytest.raises(ServeUsageError, match="not a loopback address and no token"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "a-token")
    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "dsh_host", "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=work, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("dsh: error: --host 0.0.0.0 is not a loopback address")
    assert "Traceback" not in proc.stderr


def test_a_composition_that_does_not_boot_fails_serve_in_one_line(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    bad = tmp_path / "bad.yml"
    bad.write_text("- id: sessions\n  name: sessions\n- id: x\n  name: no-such-plugin\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dsh_host", "serve", "--config", str(bad), "--port", "0"],
        cwd=work, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # never announced as listening
    assert proc.stderr.startswith("dsh: error: ") and "unknown plugin 'no-such-plugin'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


async def test_every_operation_on_a_session_outside_the_allowed_workspaces_is_refused(
    tmp_path: Path,
) -> None:
    """Before: the list was checked only at creation, so `POST /sessions/{id}/turns` on a
    session stored by `dsh run --workspace /elsewhere` ran its tools there. Now turns and cancel
    answer 400 WORKSPACE_REFUSED and the log is left as it was."""
    from .harness import write_composition

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "cli.json"
    script.write_text('{"responses": [{"text": "made by the CLI"}]}')
    config = write_composition(tmp_path)
    made = await anyio.run_process(
        [sys.executable, "-m", "dsh_host", "run", "--config", str(config), "--root",
         str(tmp_path / "sessions"), "--workspace", str(elsewhere), "--model",
         f"scripted:{script}", "--json", "hi"],
        cwd=tmp_path, check=False, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
    )
    assert made.returncode == 0, made.stderr
    session_id = made.stdout.decode().strip().splitlines()[-1].split('"sessionId": "')[1].split('"')[0]
    logs = sorted((tmp_path / "sessions").rglob("session.v3.jsonl*"))
    before = [p.read_bytes() for p in logs]
    async with running_server(tmp_path, [ledger_call(), {"text": "x"}]) as server:
        turn = await server.client.post(f"/sessions/{session_id}/turns", json={"prompt": "go"})
        assert turn.status_code == 400, turn.text
        assert turn.json()["error"]["code"] == "WORKSPACE_REFUSED"
        assert str(elsewhere) in turn.json()["error"]["message"]
        cancel = await server.client.post(f"/sessions/{session_id}/cancel")
        assert cancel.status_code == 400 and cancel.json()["error"]["code"] == "WORKSPACE_REFUSED"
    assert [p.read_bytes() for p in logs] == before
    assert not (elsewhere / "ledger").exists()
