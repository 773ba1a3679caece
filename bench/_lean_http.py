"""A minimal HTTP/1.1 client for the timed window of ``serve_load.py``: JSON POSTs on
keep-alive connections and SSE streams, nothing else.

The driver is the bench's load generator, not what users run, but on two cores its CPU is
taken from the servers it measures: httpx spent ~2.5 ms of CPU per turn (one POST and the
turn's SSE events), more than PostgreSQL. This client parses only what the server sends
(a status line, headers, a ``Content-Length`` or chunked body) and refuses anything else, so
a reply it cannot read is an error, never a guess.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc

__all__ = ["HttpError", "LeanClient"]

#: Bytes asked of the socket at a time.
READ_SIZE = 65536


class HttpError(Exception):
    """A reply this client cannot read (or a connection that ended mid-reply)."""


class _Reader:
    """Buffered reads of one connection."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def _more(self) -> None:
        try:
            self.buffer += await self.stream.receive(READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
            raise HttpError(f"connection ended mid-reply ({type(exc).__name__})") from None

    async def until(self, marker: bytes) -> bytes:
        """Everything up to and including ``marker``."""
        start = 0
        while True:
            at = self.buffer.find(marker, start)
            if at >= 0:
                end = at + len(marker)
                found = bytes(self.buffer[:end])
                del self.buffer[:end]
                return found
            start = max(0, len(self.buffer) - len(marker) + 1)
            await self._more()

    async def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self._more()
        found = bytes(self.buffer[:size])
        del self.buffer[:size]
        return found

    async def head(self) -> tuple[int, dict[str, str]]:
        """The status code and headers (names lower-cased) of the next reply."""
        text = (await self.until(b"\r\n\r\n")).decode("latin-1")
        lines = text.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x status line: {lines[0]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    raise HttpError(f"malformed header line: {line!r}")
                headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    async def chunks(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive: chunked, or ``Content-Length`` bytes."""
        coding = headers.get("transfer-encoding", "").lower()
        if coding == "chunked":
            while True:
                size_line = (await self.until(b"\r\n"))[:-2].split(b";", 1)[0]
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise HttpError(f"bad chunk size line: {size_line!r}") from None
                if size == 0:
                    await self.until(b"\r\n")  # no trailers are sent: the empty line
                    return
                data = await self.exactly(size + 2)
                if not data.endswith(b"\r\n"):
                    raise HttpError("a chunk does not end with CRLF")
                yield data[:-2]
        elif coding:
            raise HttpError(f"unsupported transfer-encoding {coding!r}")
        elif "content-length" in headers:
            size = int(headers["content-length"])
            if size:
                yield await self.exactly(size)
        else:
            raise HttpError("a reply with neither a length nor chunked framing")


class LeanClient:
    """Keep-alive connections to one server (``http://host:port``)."""

    def __init__(self, url: str) -> None:
        if not url.startswith("http://"):
            raise ValueError(f"only http:// URLs: {url!r}")
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        self.host, self.port = host, int(port)
        self._idle: list[_Reader] = []

    async def _connect(self) -> _Reader:
        return _Reader(await anyio.connect_tcp(self.host, self.port))

    def _request(self, method: str, path: str, body: bytes = b"",
                 extra: str = "") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        return head.encode() + b"\r\n" + body

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST a JSON body; the status and the whole reply body."""
        request = self._request("POST", path, body)
        reader = self._idle.pop() if self._idle else None
        if reader is not None:
            try:
                await reader.stream.send(request)
                status, headers = await reader.head()
            except (HttpError, OSError, anyio.BrokenResourceError):
                # The server closed the idle connection (its keep-alive timeout) before it
                # read the request: nothing was done, send it on a new connection.
                with contextlib.suppress(Exception):
                    await reader.stream.aclose()
                reader = None
        if reader is None:
            reader = await self._connect()
            await reader.stream.send(request)
            status, headers = await reader.head()
        body_read = b"".join([piece async for piece in reader.chunks(headers)])
        if headers.get("connection", "").lower() == "close":
            await reader.stream.aclose()
        else:
            self._idle.append(reader)
        return status, body_read

    async def sse_data(self, path: str) -> AsyncIterator[bytes]:
        """The ``data:`` payloads of an SSE stream, each as the server sent it (on a
        connection of its own, closed when the iteration ends)."""
        reader = await self._connect()
        try:
            await reader.stream.send(self._request("GET", path,
                                                   extra="Accept: text/event-stream\r\n"))
            status, headers = await reader.head()
            if status != 200:
                body = b"".join([piece async for piece in reader.chunks(headers)])
                raise HttpError(f"GET {path}: {status} {body[:200]!r}")
            if not headers.get("content-type", "").startswith("text/event-stream"):
                raise HttpError(f"GET {path}: not an event stream: {headers}")
            pending = b""
            async for piece in reader.chunks(headers):
                lines = (pending + piece).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.startswith(b"data: "):
                        yield line[6:]
                    elif b"\r" in line:
                        raise HttpError("CR in an SSE line: this reader splits on LF only")
        finally:
            await reader.stream.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for reader in idle:
            with contextlib.suppress(Exception):
                await reader.stream.aclose()
