"""An in-process ``dsh serve`` on a real loopback socket, with a scripted model.

The composition is the shipped default plus a rule that asks before every ``bash`` call (so a
side-effecting call waits for a decision through the API); the model is ``scripted:`` with the
test's responses. The session root and the workspace sit side by side under the test's tmp
directory (never one inside the other: D15).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from dsh_host._server.command import build_compositions
from dsh_host._server.runtime import ServeOptions
from dsh_host._server.serve import bind_socket, serve

REPO = Path(__file__).resolve().parents[2]
ASK_BASH = (
    "\n- id: rules\n  name: tool-rules\n  config:\n    rules:\n"
    "      - {tool: bash, decision: ask, reason: side effects need a human}\n"
)
CALL = "call-ledger"


def ledger_call(call_id: str = CALL) -> dict[str, Any]:
    """The model's side-effecting call: append ``$DSH_CALL_ID`` to ``ledger`` in the workspace."""
    return {"tool_calls": [{"id": call_id, "name": "bash", "arguments": {
        "command": 'printf "%s\\n" "$DSH_CALL_ID" >> ledger', "description": "Append to ledger"}}]}


def write_composition(tmp: Path, base: str = "default.yml", extra: str = "") -> Path:
    """``base`` with bash asked before it runs, and ``extra`` rows (YAML) after it."""
    config = tmp / "dsh.yml"
    config.write_text((REPO / "configs" / base).read_text() + ASK_BASH + extra)
    return config


@dataclass
class Server:
    url: str
    client: httpx.AsyncClient
    workspace: Path
    root: Path

    def ledger(self) -> list[str]:
        path = self.workspace / "ledger"
        return path.read_text().splitlines() if path.exists() else []

    async def create(self, **body: Any) -> str:
        response = await self.client.post("/sessions", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def turn(self, session_id: str, prompt: str) -> int:
        response = await self.client.post(f"/sessions/{session_id}/turns", json={"prompt": prompt})
        assert response.status_code == 202, response.text
        return int(response.json()["turn"])

    async def wait(self, session_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Poll the session until ``done(session)``; no deadline but the test's own."""
        while True:
            response = await self.client.get(f"/sessions/{session_id}")
            assert response.status_code == 200, response.text
            session = response.json()
            if done(session):
                return dict(session)
            await anyio.sleep(0.05)

    async def wait_logged(self, caplog: Any, text: str) -> None:
        """Poll until a captured record of the server's loggers contains ``text``; no deadline
        but the test's."""
        while True:
            if any(text in r.getMessage() for r in caplog.records
                   if r.name.startswith(("dsh.server", "hypercorn"))):
                return
            await anyio.sleep(0.05)

    async def wait_turn_end(self, session_id: str, turn: int) -> dict[str, Any]:
        def ended(session: dict[str, Any]) -> bool:
            end = session["lastTurnEnd"]
            return session["status"] != "running" and end is not None and end["turn"] == turn

        return await self.wait(session_id, ended)

    async def events(self, session_id: str, after: int | None = None) -> list[dict[str, Any]]:
        params = {"after": after} if after is not None else {}
        response = await self.client.get(f"/sessions/{session_id}/events", params=params)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in response.text.splitlines()]


@asynccontextmanager
async def running_server(
    tmp: Path,
    responses: list[Any],
    *,
    token: str | None = None,
    max_body_bytes: int = 1 << 20,
    allow: tuple[str, ...] = (),
    cors: tuple[str, ...] = (),
    body_timeout: float = 30.0,
    model: str | None = None,
    extra_rows: str = "",
) -> AsyncIterator[Server]:
    """A ``dsh serve`` on loopback whose model answers ``responses`` (a script), or is
    ``model`` (a ``--model`` spec; ``responses`` unused); ``extra_rows`` (YAML) are composed
    after the default rows."""
    workspace, root = tmp / "ws", tmp / "sessions"
    workspace.mkdir(exist_ok=True)
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": responses}))
    options = ServeOptions(
        compositions=build_compositions(
            str(write_composition(tmp, extra=extra_rows)), [], model or f"scripted:{script}",
            str(root),
        ),
        default_workspace=str(workspace.resolve()),
        workspace_roots=allow,
        token=token,
        cors_origins=cors,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
    )
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop = anyio.Event()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with anyio.create_task_group() as group:
            await group.start(lambda task_status: serve(
                options, sock, shutdown=stop.wait, task_status=task_status))
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
                try:
                    yield Server(url, client, workspace, root)
                finally:
                    stop.set()
    finally:
        sock.close()


async def read_sse(
    client: httpx.AsyncClient,
    path: str,
    *,
    until: Callable[[dict[str, Any]], bool],
    headers: dict[str, str] | None = None,
    started: Callable[[], Any] | None = None,
) -> list[tuple[int, str, dict[str, Any]]]:
    """Read SSE frames ``(id, event, data)`` from ``path`` until ``until(data)`` is true.

    ``started`` is called once the response headers arrived (the stream is open).
    """
    frames: list[tuple[int, str, dict[str, Any]]] = []
    async with client.stream("GET", path, headers=headers or {}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        if started is not None:
            result = started()
            if hasattr(result, "__await__"):
                await result
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if "data" in fields:
                data = json.loads(fields["data"])
                frames.append((int(fields["id"]), fields["event"], data))
                if until(data):
                    return frames
            fields = {}
    raise AssertionError(f"the stream ended before the awaited event: {frames}")
