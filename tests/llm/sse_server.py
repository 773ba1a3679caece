"""A real chat-completions stand-in: HTTP/1.1 on 127.0.0.1, SSE over chunked transfer encoding.

It is the one allowed stand-in in the suite (a remote model API speaking the
same wire protocol). It runs ``http.server`` in a background thread, so it
serves tests on either anyio backend and tests that drive the ``dsh`` CLI in a
subprocess alike::

    with SseServer([sse(text_events("hello"))]) as server:
        ...  # point llm-openai-compatible's base_url at server.url
        assert server.requests[0].body["model"] == "deepseek-chat"

Each request to ``POST /chat/completions`` consumes the next behaviour of the
script (a request beyond the script gets HTTP 500 ``mock script exhausted``):

- :func:`sse` -- 200 ``text/event-stream``; each payload is written as
  ``data: <payload>\\n\\n`` in its own HTTP chunk, optionally after a delay;
  ``close_early`` drops the socket after the payloads without the terminating
  chunk (a transfer cut mid-body); ``hang`` keeps the response open after the
  payloads until the client goes away or the server stops;
- :func:`raw` -- 200 ``text/event-stream`` with the given body pieces verbatim
  (one HTTP chunk each), for framing tests;
- :func:`http_error` -- any status, body and headers.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Behavior",
    "RecordedRequest",
    "SseServer",
    "http_error",
    "raw",
    "reasoning_events",
    "sse",
    "text_events",
    "tool_call_events",
]


@dataclass
class Behavior:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    #: SSE data payloads (status 200) or None for a plain body
    events: list[str] | None = None
    #: raw body pieces written as HTTP chunks (framing tests)
    pieces: list[bytes] | None = None
    #: plain body (error responses)
    body: bytes = b""
    delay_s: float = 0.0
    close_early: bool = False
    hang: bool = False


def sse(
    events: Sequence[str],
    *,
    delay_s: float = 0.0,
    close_early: bool = False,
    hang: bool = False,
    headers: dict[str, str] | None = None,
) -> Behavior:
    return Behavior(
        events=list(events),
        delay_s=delay_s,
        close_early=close_early,
        hang=hang,
        headers=dict(headers or {}),
    )


def raw(pieces: Sequence[bytes]) -> Behavior:
    return Behavior(pieces=list(pieces))


def http_error(
    status: int,
    body: str | dict[str, Any] = "",
    *,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> Behavior:
    data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
    merged = {"content-type": content_type, **(headers or {})}
    return Behavior(status=status, body=data, headers=merged)


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish is not None:
        choice["finish_reason"] = finish
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                       "choices": [choice], **extra})


def text_events(
    *parts: str,
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
    done: bool = True,
) -> list[str]:
    """A streamed text answer: a role chunk, one chunk per part, the finish, ``[DONE]``."""
    events = [_chunk({"role": "assistant", "content": None, "reasoning_content": ""})]
    events += [_chunk({"content": part}) for part in parts]
    final_usage = usage if usage is not None else {"prompt_tokens": 3, "completion_tokens": 1}
    events.append(_chunk({"content": ""}, finish=finish, usage=final_usage))
    if done:
        events.append("[DONE]")
    return events


def reasoning_events(reasoning: Sequence[str], text: Sequence[str]) -> list[str]:
    """Thinking first, then the answer (DeepSeek's reasoning_content channel)."""
    events = [_chunk({"role": "assistant", "content": None, "reasoning_content": ""})]
    events += [_chunk({"reasoning_content": part, "content": None}) for part in reasoning]
    events += [_chunk({"content": part, "reasoning_content": None}) for part in text]
    events.append(
        _chunk(
            {},
            finish="stop",
            usage={
                "prompt_tokens": 50,
                "completion_tokens": 20,
                "prompt_cache_hit_tokens": 30,
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        )
    )
    events.append("[DONE]")
    return events


def tool_call_events(
    calls: Iterable[tuple[str, str, str]],
    *,
    fragment: int = 1,
    text: str | None = None,
    interleave: bool = False,
) -> list[str]:
    """Tool calls streamed OpenAI-style: a header delta with id and name, then the
    arguments in ``fragment``-sized pieces (interleaved across calls when asked)."""
    events = [_chunk({"role": "assistant", "content": text})] if text else []
    pieces: list[list[str]] = []
    for wire_index, (call_id, name, arguments) in enumerate(calls):
        events.append(_chunk({"tool_calls": [{
            "index": wire_index, "id": call_id, "type": "function",
            "function": {"name": name, "arguments": ""},
        }]}))
        pieces.append([
            _chunk({"tool_calls": [{
                "index": wire_index, "function": {"arguments": arguments[k:k + fragment]},
            }]})
            for k in range(0, len(arguments), fragment)
        ])
    if interleave:
        longest = max((len(p) for p in pieces), default=0)
        for k in range(longest):
            events += [p[k] for p in pieces if k < len(p)]
    else:
        for p in pieces:
            events += p
    events.append(_chunk({}, finish="tool_calls",
                         usage={"prompt_tokens": 10, "completion_tokens": 5}))
    events.append("[DONE]")
    return events


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    #: the client's (address, port): the same for requests sent over one kept-alive connection
    peer: tuple[str, int] = ("", 0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def handle(self) -> None:
        try:
            super().handle()
        finally:
            self.server.owner.connection_ended(self.client_address)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        data = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(data) if data else None
        except ValueError:
            body = data
        owner = self.server.owner
        with owner.lock:
            owner.requests.append(
                RecordedRequest(
                    "POST",
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    (str(self.client_address[0]), int(self.client_address[1])),
                )
            )
            behavior = owner.script.pop(0) if owner.script else None
        if behavior is None:
            self._plain(500, b"mock script exhausted", {"content-type": "text/plain"})
            return
        if behavior.events is None and behavior.pieces is None:
            self._plain(behavior.status, behavior.body, behavior.headers)
            return
        self.send_response(behavior.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in behavior.headers.items():
            self.send_header(name, value)
        self.end_headers()
        pieces = (
            behavior.pieces
            if behavior.pieces is not None
            else [f"data: {event}\n\n".encode() for event in behavior.events or []]
        )
        try:
            for number, piece in enumerate(pieces):
                if number and behavior.delay_s:
                    time.sleep(behavior.delay_s)
                self._write_chunk(piece)
            if behavior.close_early:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if behavior.hang:
                self._hang()
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _hang(self) -> None:
        """Hold the response open until the client disconnects or the server stops."""
        self.close_connection = True
        self.server.owner.hanging.release()  # every piece is written: the stream is mid-way
        self.connection.settimeout(0.05)
        stop = self.server.owner.stopping
        while not stop.is_set():
            try:
                if self.connection.recv(1) == b"":
                    self.server.owner.disconnected.release()  # the client closed its side
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def _write_chunk(self, piece: bytes) -> None:
        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self.wfile.flush()

    def _plain(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: SseServer


class SseServer:
    """The loopback server; a context manager that starts and stops it."""

    def __init__(self, script: Sequence[Behavior] = (), port: int = 0) -> None:
        self.script: list[Behavior] = list(script)
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        #: released once per hanging response whose client went away
        self.disconnected = threading.Semaphore(0)
        #: released once per response that has written its pieces and now hangs
        self.hanging = threading.Semaphore(0)
        #: the peers whose connection has ended (the client closed it, or the server did)
        self.ended_peers: list[tuple[str, int]] = []
        self._ended = threading.Condition(self.lock)
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="sse-server", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL (the adapter appends ``/chat/completions``)."""
        return f"http://127.0.0.1:{self.port}"

    def wait_disconnect(self, timeout: float = 10.0) -> bool:
        """Block until a client dropped a hanging response (False on timeout)."""
        return self.disconnected.acquire(timeout=timeout)

    def connection_ended(self, peer: tuple[str, int]) -> None:
        with self._ended:
            self.ended_peers.append((str(peer[0]), int(peer[1])))
            self._ended.notify_all()

    def wait_connection_ended(self, peer: tuple[str, int], timeout: float = 10.0) -> bool:
        """Block until the connection from ``peer`` has ended (False on timeout)."""
        with self._ended:
            return self._ended.wait_for(lambda: peer in self.ended_peers, timeout=timeout)

    def push(self, *behaviors: Behavior) -> None:
        with self.lock:
            self.script.extend(behaviors)

    def start(self) -> SseServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> SseServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
