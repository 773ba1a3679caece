"""The HTTP API and the web inspector, as one Starlette application.

Every error is a JSON body ``{"error": {"code": "...", "message": "..."}}`` with a stable
``code`` (the table is in :data:`STATUS_CODES` and docs/serve.md). With a token configured,
every route but ``/healthz``, ``/openapi.json`` and the inspector's static page needs
``Authorization: Bearer TOKEN``. Request bodies are JSON, at most ``max_body_bytes``.
The router and the OpenAPI document (``GET /openapi.json``) are both made from one table,
:data:`ENDPOINTS`: each route with the statuses it answers.
"""

from __future__ import annotations

import base64
import getpass
import hmac
import logging
import re
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Final, Literal, TypeVar
from urllib.parse import urlsplit

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    SimpleUser,
    requires,
)
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from dsh_host._llm.attachments import (
    MAX_PROMPT_ATTACHMENT_BYTES,
    AttachmentError,
    attachment_from_bytes,
)
from dsh_host._persistence.persistence import SessionPersistenceError
from dsh_host._session.events import SessionEvent, to_builtins
from dsh_host._session.messages import ContentBlock, TextBlock
from dsh_host._session.session import derive_messages_from_events
from dsh_host.errors import DshError

from .metrics import CONTENT_TYPE
from .runtime import SESSION_ID_PATTERN, ApiError, ServerRuntime, is_store_outage
from .views import event_json

__all__ = ["STATUS_CODES", "create_app"]

T = TypeVar("T")

log = logging.getLogger("dsh.server")

#: HTTP statuses Starlette raises itself, and the stable codes they are reported with.
STATUS_CODES: Final = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    500: "INTERNAL",
}

#: The status of each error the session core or a store reports, by its stable ``code``: one
#: table for every path, so one condition always gets one answer whichever class raised it
#: (the session store's "live id" conflict and the persistence backend's "stored id"
#: conflict are both ``SESSION_ALREADY_EXISTS``, both 409). A store outage
#: (:data:`~.runtime.STORE_OUTAGE_CODES`) is 503. Other codes are a request the session's
#: state refuses (409) when a persistence backend raised them, else a bad request (400).
DSH_ERROR_STATUS: Final[dict[str, tuple[int, str]]] = {
    "SESSION_NOT_FOUND": (404, "SESSION_NOT_FOUND"),
    "SESSION_ALREADY_EXISTS": (409, "SESSION_ALREADY_EXISTS"),
    "SESSION_ALREADY_OWNED": (409, "SESSION_HELD"),
    "INVALID_SESSION_ID": (400, "INVALID_SESSION_ID"),
}

#: Seconds a client is asked to wait (``Retry-After``) after a 503 from a store outage.
RETRY_AFTER_SECONDS: Final = 5

#: The largest seq ``after`` / ``Last-Event-ID`` may name: JSON's exact integer range (2^53-1).
MAX_SEQ: Final = (1 << 53) - 1

#: Events encoded per chunk of a ``GET /events`` response.
EVENTS_PER_CHUNK: Final = 256

#: Events read from the store per page of ``GET /events`` and of an event stream: what one
#: response holds at most, however slowly its client reads (docs/serve.md "Memory").
EVENTS_PER_PAGE: Final = 1024

#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE_SECONDS: Final = 15.0


# ---------------------------------------------------------------------------- bodies


#: A path with no NUL byte (the OS refuses one; it is a bad request, not a server fault).
_NO_NUL = msgspec.Meta(pattern="^[^\\x00]*$", description="a directory path (no NUL byte)")


class CreateSession(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    workspace: Annotated[str, _NO_NUL] | None = None
    composition: str | None = None
    id: str | None = None


class ForkSession(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    at: Annotated[int, msgspec.Meta(ge=0)] | None = None
    turn: Annotated[int, msgspec.Meta(ge=1)] | None = None
    id: str | None = None


class Upload(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """A file sent with a prompt: its name and its bytes in base64."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    data: str


class StartTurn(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    prompt: str
    #: images and PDFs sent with the prompt (the limits of ``dsh run --attach``)
    attachments: list[Upload] = msgspec.field(default_factory=list)


class Decide(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    decision: Literal["allow", "deny"]
    reason: str | None = None
    args_digest: str | None = None


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def read_body(request: Request, kind: type[T]) -> T:
    """The request's JSON body as ``kind``; too large, not JSON or the wrong shape is refused.

    The whole body must arrive within the server's ``body_timeout`` (408 otherwise): a client
    trickling a byte at a time would else hold a connection and a buffer for ever. (Hypercorn's
    own read timeout cannot do it: it would also close every idle event stream.) A client that
    goes away mid-body is one log line, not a traceback.
    """
    options = runtime_of(request).options
    limit = options.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"the request body is over {limit} bytes")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as application/json")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(options.body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, "PAYLOAD_TOO_LARGE",
                                   f"the request body is over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, "REQUEST_TIMEOUT",
                       f"the request body did not arrive within {options.body_timeout:g} s "
                       f"({size} bytes came); send it at once") from None
    except ClientDisconnect:
        log.info("%s %s: the client went away after %d bytes of its body", request.method,
                 request.url.path, size)
        raise ApiError(400, "CLIENT_DISCONNECTED", "the client went away mid-body") from None
    try:
        return msgspec.json.decode(b"".join(chunks) or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "INVALID_REQUEST", f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "INVALID_REQUEST", f"the request body is not JSON: {exc}") from None


def _after(value: str | None, where: str) -> int:
    if value is None or value == "":
        return -1
    try:
        after = int(value)
    except ValueError:
        raise ApiError(400, "INVALID_REQUEST", f"{where} must be an integer seq") from None
    if after >= MAX_SEQ:
        raise ApiError(400, "INVALID_REQUEST",
                       f"{where} {value} is past the largest seq a log can hold ({MAX_SEQ - 1})")
    return max(after, -1)


# ---------------------------------------------------------------------------- auth


class BearerToken(AuthenticationBackend):
    """``Authorization: Bearer TOKEN``; with no token configured everyone is let in."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        if self._token is None:
            return AuthCredentials(["authenticated"]), SimpleUser("local")
        scheme, _, credentials = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credentials:
            return None
        if not hmac.compare_digest(credentials.strip().encode(), self._token):
            raise AuthenticationError("the bearer token is not this server's")
        return AuthCredentials(["authenticated"]), SimpleUser("bearer")


#: Methods that change nothing; every other one is refused from a foreign ``Origin``.
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


class HostOriginGuard:
    """DNS rebinding and cross-site writes, refused before any route runs.

    Without a token, loopback is the only protection, and a web page defeats it by DNS
    rebinding: its own name starts resolving to 127.0.0.1, and the browser then sends the
    page's requests here as same-origin, with ``Host: evil.example``. So with no token only
    the bound loopback names are answered (``127.0.0.1``, ``localhost``, ``[::1]`` with the
    port): any other ``Host`` is ``421 MISDIRECTED_REQUEST``. With a token the page cannot
    authenticate, and a proxy may forward any name, so every ``Host`` is answered.

    A browser names the page that sent a request in ``Origin``. Every state-changing request
    (any method but GET, HEAD, OPTIONS) with an ``Origin`` must come from this server's own
    origin (the inspector: the same scheme-less ``host:port`` as its ``Host``) or a
    ``--cors-origin``: anything else is ``403 FOREIGN_ORIGIN``. Without ``Origin`` the
    request is not a browser's cross-site one (curl, scripts) and goes on to the token check.
    """

    def __init__(self, app: ASGIApp, *, port: int, check_host: bool,
                 origins: tuple[str, ...]) -> None:
        self.app = app
        hosts = ("127.0.0.1", "localhost", "[::1]")
        self.hosts: frozenset[str] | None = frozenset(
            [f"{h}:{port}" for h in hosts] + (list(hosts) if port == 80 else [])
        ) if check_host else None
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "").strip().lower()
        if self.hosts is not None and host not in self.hosts:
            shown = host or "(none)"
            refused = error_response(
                421, "MISDIRECTED_REQUEST",
                f"Host {shown!r} is not this server's: without a token it answers only "
                f"{', '.join(sorted(self.hosts))} (a page on another name may be a DNS "
                "rebinding attack); use one of those names, or configure a token",
            )
            await refused(scope, receive, send)
            return
        origin = headers.get("origin")
        if scope["method"] not in SAFE_METHODS and origin is not None:
            normal = origin.strip().rstrip("/").lower()
            own = urlsplit(normal).netloc == host and normal.startswith(("http://", "https://"))
            if not own and normal not in self.origins:
                refused = error_response(
                    403, "FOREIGN_ORIGIN",
                    f"a {scope['method']} from the page at Origin {origin!r} is refused: only "
                    "this server's own pages and the --cors-origin origins may change state",
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _auth_error(conn: HTTPConnection, exc: Exception) -> Response:
    return error_response(401, "UNAUTHORIZED", str(exc))


authenticated = requires("authenticated", status_code=401)


# ---------------------------------------------------------------------------- handlers


def runtime_of(request: Request) -> ServerRuntime:
    runtime: ServerRuntime = request.app.state.runtime
    return runtime


async def healthz(request: Request) -> Response:
    """Liveness."""
    return JSONResponse({"status": "ok"})


@authenticated
async def metrics(request: Request) -> Response:
    """Prometheus metrics (text format)."""
    runtime = runtime_of(request)
    await runtime.pending_approvals()
    runtime.metrics.turns_running.set(runtime.running_count())
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)


@authenticated
async def create_session(request: Request) -> Response:
    """Create a session."""
    runtime = runtime_of(request)
    body = await read_body(request, CreateSession)
    load = await runtime.create_session(
        workspace=body.workspace, composition=body.composition, session_id=body.id
    )
    return JSONResponse(await runtime.summary(load), status_code=201)


@authenticated
async def list_sessions(request: Request) -> Response:
    """Every stored session, most recently updated first."""
    runtime = runtime_of(request)
    await runtime.refresh()
    return JSONResponse({"sessions": await runtime.summaries()})


@authenticated
async def get_session(request: Request) -> Response:
    """One session's header, status and usage."""
    runtime = runtime_of(request)
    await runtime.refresh()
    session_id = request.path_params["id"]
    stored = await runtime.stored_summary(session_id)
    running = runtime.running(session_id)
    return JSONResponse({
        **stored.fields,
        "status": await runtime.status(session_id, stored),
        "header": stored.header,
        "pendingApprovals": list(stored.approvals),
        "runningTurn": running.turn if running is not None else None,
        # why this server would refuse every operation on it (null: none); the inspector
        # offers no action then
        "refused": runtime.refusal(session_id, stored),
    })


@authenticated
async def session_model_view(request: Request) -> Response:
    """What the model is sent next: the messages derived from the stored log (a compaction's
    checkpoint in place of what it replaced), as ``dsh sessions show --view model`` prints."""
    runtime = runtime_of(request)
    events = await runtime.events_after(request.path_params["id"], -1)
    messages = [to_builtins(message) for message in derive_messages_from_events(events)]
    return JSONResponse({"messages": messages})


@authenticated
async def session_events(request: Request) -> Response:
    """Stored events after a seq, as JSON lines (application/x-ndjson).

    Read from the store a page at a time (``EVENTS_PER_PAGE``), each page encoded and sent
    before the next is read: Hypercorn's send waits while the client's socket is full, so a
    client that stops reading holds one page, never the whole answer (docs/serve.md)."""
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    after = _after(request.query_params.get("after"), "after")
    first = await runtime.events_after(session_id, after, EVENTS_PER_PAGE)  # 404 before 200

    async def lines() -> AsyncIterator[bytes]:
        page: Sequence[SessionEvent] = first
        while page:
            last = page[-1].seq
            full = len(page) >= EVENTS_PER_PAGE
            for start in range(0, len(page), EVENTS_PER_CHUNK):
                yield b"".join(
                    event_json(e) + b"\n" for e in page[start:start + EVENTS_PER_CHUNK]
                )
            if not full:
                return
            page = ()
            page = await _next_page(runtime, session_id, last) or ()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _next_page(
    runtime: ServerRuntime, session_id: str, last: int
) -> Sequence[SessionEvent] | None:
    """The next page of a response already under way; None when the store fails now, which
    ends the response (one log line; the client has the events up to ``last`` and asks again
    from there)."""
    try:
        return await runtime.events_after(session_id, last, EVENTS_PER_PAGE)
    except Exception as exc:
        if not is_store_outage(exc) and not isinstance(exc, DshError):
            raise
        log.warning("events of session %s ended after seq %d: %s: %s", session_id, last,
                    type(exc).__name__, exc)
        return None


@authenticated
async def session_stream(request: Request) -> Response:
    """Server-sent events of the session's new events. Each SSE event has id = the event's seq,
    event = its type and data = the event as JSON; only stored events are sent. Without a
    cursor the stream starts after what is stored; with the Last-Event-ID header (or
    ?after=SEQ, -1 for the whole history) every event after that seq comes first. Comment
    lines keep an idle stream open."""
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    resumed = request.headers.get("last-event-id")
    if resumed is not None:
        after = _after(resumed, "Last-Event-ID")
    else:
        after = _after(request.query_params.get("after"), "after")
    first: Sequence[SessionEvent] = ()
    if resumed is None and "after" not in request.query_params:
        # A new follower: what is stored now is history (GET /events), the stream is news. The
        # end is known without reading the events (404 for an unknown session).
        after = await runtime.stored_end(session_id)
    else:  # a 404 before the stream starts
        first = await runtime.events_after(session_id, after, EVENTS_PER_PAGE)

    async def frames() -> AsyncIterator[bytes]:
        last = after
        pending = first
        yield b": dsh event stream\n\n"
        while True:
            for event in pending:
                yield b"id: %d\nevent: %s\ndata: %s\n\n" % (
                    event.seq, event.type.encode(), event_json(event)
                )
                last = event.seq
            if len(pending) >= EVENTS_PER_PAGE:  # a page of history: the next one at once
                page = await _next_page(runtime, session_id, last)
                if page is None:
                    return
                if page:
                    pending = page
                    continue
            pending = ()
            quiet_until = anyio.current_time() + KEEPALIVE_SECONDS
            while True:
                # Woken by a flush, a NOTIFY or the process's one idle poll (D47): no read of
                # its own while nothing may have changed.
                if not await runtime.wait_for_events(
                    session_id, last, quiet_until - anyio.current_time()
                ):
                    quiet_until = anyio.current_time() + KEEPALIVE_SECONDS
                    yield b": keep-alive\n\n"
                    continue
                try:
                    pending = await runtime.events_after(session_id, last, EVENTS_PER_PAGE)
                except Exception as exc:
                    if not is_store_outage(exc) and not isinstance(exc, DshError):
                        raise
                    # The stream ends (its client reconnects with Last-Event-ID): one line.
                    log.warning("stream of session %s ended after seq %d: %s: %s", session_id,
                                last, type(exc).__name__, exc)
                    return
                if pending:
                    break

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _uploaded(uploads: list[Upload]) -> list[ContentBlock]:
    """The blocks of a turn's uploads; a file that is not base64, not an accepted type or too
    large is refused (400) naming it, before anything is logged."""
    blocks: list[ContentBlock] = []
    total = 0
    for upload in uploads:
        try:
            raw = base64.b64decode(upload.data, validate=True)
        except ValueError:
            raise ApiError(400, "INVALID_ATTACHMENT",
                           f"attachment {upload.name!r}: data is not base64") from None
        total += len(raw)
        try:
            blocks.append(attachment_from_bytes(raw, upload.name))
        except AttachmentError as exc:
            raise ApiError(400, "INVALID_ATTACHMENT", str(exc)) from None
    if total > MAX_PROMPT_ATTACHMENT_BYTES:
        raise ApiError(400, "INVALID_ATTACHMENT",
                       f"{len(uploads)} attachments of {total} bytes together are over the "
                       f"{MAX_PROMPT_ATTACHMENT_BYTES} bytes allowed for one prompt")
    return blocks


@authenticated
async def fork_session(request: Request) -> Response:
    """Fork a session at a turn boundary. A new stored session copies the source's events up to
    the boundary (``at`` a seq, ``turn`` a turn number, neither: the last turn boundary), links
    to it (``parentSession``) and carries the effects ledger of the turns it leaves out; the
    source is not changed."""
    runtime = runtime_of(request)
    body = await read_body(request, ForkSession)
    load, fork = await runtime.fork_session(
        request.path_params["id"], at=body.at, turn=body.turn, child_id=body.id
    )
    return JSONResponse({**await runtime.summary(load), "fork": fork}, status_code=201)


@authenticated
async def start_turn(request: Request) -> Response:
    """Start a turn (runs in the background)."""
    runtime = runtime_of(request)
    body = await read_body(request, StartTurn)
    session_id = request.path_params["id"]
    prompt: str | list[ContentBlock] = body.prompt
    if body.attachments:
        prompt = [TextBlock(text=body.prompt), *_uploaded(body.attachments)]
    try:
        turn = await runtime.start_turn(session_id, prompt)
    except AttachmentError as exc:  # the session's model takes no images (D31)
        raise ApiError(400, "IMAGES_UNSUPPORTED", str(exc)) from None
    return JSONResponse({"sessionId": session_id, "turn": turn}, status_code=202)


@authenticated
async def cancel_turn(request: Request) -> Response:
    """Cancel the session's turn: a running one ends aborted once started tool bodies return; one
    still queued for a worker (--queue) never starts."""
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    turn = await runtime.cancel(session_id)
    return JSONResponse({"sessionId": session_id, "turn": turn, "cancelled": True},
                        status_code=202)


@authenticated
async def list_approvals(request: Request) -> Response:
    """Pending approvals across sessions, oldest first. {approvals: [{sessionId, callId, tool,
    argsDigest, arguments, askedAt, turn}]}."""
    return JSONResponse({"approvals": await runtime_of(request).pending_approvals()})


@authenticated
async def decide(request: Request) -> Response:
    """Allow or deny a pending call (bound to its call id and argsDigest, one-shot). When no call
    of the session waits any more, the turn continues in the background: allowed calls run
    once, denied ones get the rejection text, then the model."""
    runtime = runtime_of(request)
    body = await read_body(request, Decide)
    session_id, call_id = request.path_params["id"], request.path_params["callId"]
    user = request.user.display_name if request.user.is_authenticated else "anonymous"
    continued = await runtime.decide(
        session_id, call_id, body.decision, reason=body.reason, args_digest=body.args_digest,
        decided_by=f"dsh serve ({user}) on {socket.gethostname()} as {_os_user()}",
    )
    # a child's decision continues the parent that waits on it (D36): that session is named
    return JSONResponse({"sessionId": session_id, "callId": call_id, "decision": body.decision,
                         "continued": continued is not None,
                         "continuedSession": None if continued is None else continued[0],
                         "turn": None if continued is None else continued[1]})


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


async def inspector(request: Request) -> Response:
    """The web inspector (HTML; it calls this API with the token given in the page)."""
    page = resources.files("dsh_host._server").joinpath("inspector.html").read_text("utf-8")
    return HTMLResponse(page, headers={
        "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    })


# ---------------------------------------------------------------------------- errors


def _unavailable(message: str) -> Response:
    """The store cannot take or give the data now (disk full, an immutable or unwritable
    file, the database down): nothing the client sent is wrong, so 503 with Retry-After."""
    response = error_response(503, "STORE_UNAVAILABLE", message)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status == 503:
        return _unavailable(str(exc))
    return error_response(exc.status, exc.code, str(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = STATUS_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    message = exc.detail if exc.status_code != 401 else (
        "this server needs Authorization: Bearer TOKEN (the token it was started with)"
    )
    return error_response(exc.status_code, code, message)


async def _dsh_error(request: Request, exc: Exception) -> Response:
    if is_store_outage(exc):
        return _unavailable(f"the session store is unavailable, retry later: {exc}")
    code = str(getattr(exc, "code", "DSH_ERROR"))
    status, shown = DSH_ERROR_STATUS.get(code, (0, code))
    if status == 0:
        status = 409 if code.endswith("BUSY") or isinstance(exc, SessionPersistenceError) else 400
    return error_response(status, shown, str(exc))


async def _outage(request: Request, exc: Exception) -> Response:
    """An ``OSError`` or a database driver's error reached a handler: the disk or the database
    under the store failed (one log line; a 503 for the client)."""
    if not is_store_outage(exc):
        return await _internal(request, exc)
    log.error("%s %s: the session store is unavailable: %s: %s", request.method,
              request.url.path, type(exc).__name__, exc)
    return _unavailable(f"the session store is unavailable, retry later: "
                        f"{type(exc).__name__}: {exc}")


async def _internal(request: Request, exc: Exception) -> Response:
    return error_response(500, "INTERNAL", f"internal error: {type(exc).__name__}: {exc}")


def _outage_classes() -> list[type[Exception]]:
    """The exception classes a store outage arrives as. psycopg's only when a row loaded it
    (the app is made after the hosts booted): importing it for a JSONL server would cost
    ~10 MB of RSS for nothing."""
    classes: list[type[Exception]] = [OSError, sqlite3.OperationalError]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        classes.append(psycopg.OperationalError)
    return classes


# ---------------------------------------------------------------------------- app

_COMPONENTS: Final[dict[str, Any]] = {
    "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    "schemas": {
        "Error": {
            "type": "object",
            "properties": {"error": {"type": "object", "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}}},
        },
        "CreateSession": {"type": "object", "additionalProperties": False, "properties": {
            "workspace": {"type": "string", "pattern": "^[^\\x00]*$"},
            "composition": {"type": "string"},
            "id": {"type": "string", "pattern": SESSION_ID_PATTERN}}},
        "ForkSession": {"type": "object", "additionalProperties": False, "properties": {
            "at": {"type": "integer", "minimum": 0},
            "turn": {"type": "integer", "minimum": 1},
            "id": {"type": "string", "pattern": SESSION_ID_PATTERN}}},
        "StartTurn": {"type": "object", "required": ["prompt"], "additionalProperties": False,
                      "properties": {"prompt": {"type": "string"}, "attachments": {
                          "type": "array", "items": {
                              "type": "object", "required": ["name", "data"],
                              "additionalProperties": False,
                              "properties": {"name": {"type": "string", "minLength": 1},
                                             "data": {"type": "string",
                                                      "format": "byte"}}}}}},
        "Decide": {"type": "object", "required": ["decision"], "additionalProperties": False,
                   "properties": {"decision": {"enum": ["allow", "deny"]},
                                  "reason": {"type": "string"},
                                  "argsDigest": {"type": "string"}}},
        "Session": {"type": "object", "properties": {
            "id": {"type": "string"}, "title": {"type": "string", "nullable": True},
            "status": {"enum": ["idle", "queued", "running", "awaiting-approval",
                                "interrupted"]},
            "createdAt": {"type": "integer"}, "updatedAt": {"type": "integer"},
            "workspace": {"type": "string", "nullable": True},
            "composition": {"type": "string", "nullable": True},
            "events": {"type": "integer"}, "lastTurn": {"type": "integer"},
            "lastTurnEnd": {"type": "object", "nullable": True},
            "usage": {"type": "object", "properties": {
                "inputTokens": {"type": "integer"}, "outputTokens": {"type": "integer"},
                "cacheReadTokens": {"type": "integer"}, "cacheWriteTokens": {"type": "integer"},
                "reasoningTokens": {"type": "integer"}, "requests": {"type": "integer"},
                "costUsd": {"type": "number", "nullable": True},
                "unpricedModels": {"type": "array", "items": {"type": "string"}}}}}},
    },
}


class _PathId(Convertor[str]):
    """A session or call id in a path: no control character (a NUL can name no file and no
    row, so such a path is no route: 404), no ``/``."""

    regex = "[^/\x00-\x1f\x7f]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("pathid", _PathId())


@dataclass(frozen=True)
class Endpoint:
    """One route and what it answers: the router and the OpenAPI document are both made from
    :data:`ENDPOINTS`, so the document cannot miss a route or a status the route returns."""

    method: str
    #: the OpenAPI path (``{id}``); the router's path adds the id convertor
    path: str
    handler: Callable[[Request], Awaitable[Response]]
    #: the statuses this route's own code answers, with the codes: ``{202: "...", 409: "..."}``
    responses: Mapping[int, str]
    #: the request body's component schema
    body: str | None = None
    #: integer query parameters (``after``) and headers (``Last-Event-ID``)
    query: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    #: no token needed, and nothing stored is read
    public: bool = False
    #: the media type of a 2xx answer
    media: str = "application/json"

    def all_responses(self) -> dict[int, str]:
        """:attr:`responses` plus what every route of its kind may answer (one place)."""
        out = {421: "MISDIRECTED_REQUEST (no token: a Host that is not this server's)"}
        if not self.public:
            out[401] = "UNAUTHORIZED"
            out[503] = "STORE_UNAVAILABLE (with Retry-After)"
        if "{" in self.path:
            out[404] = "SESSION_NOT_FOUND, NOT_FOUND (a control character in a path id)"
        if self.method not in SAFE_METHODS:
            out[403] = "FOREIGN_ORIGIN"
        if self.body is not None:
            out[400] = "INVALID_REQUEST, CLIENT_DISCONNECTED"
            out.update({408: "REQUEST_TIMEOUT", 413: "PAYLOAD_TOO_LARGE",
                        415: "UNSUPPORTED_MEDIA_TYPE"})
        if self.query or self.headers:
            out[400] = "INVALID_REQUEST (a bad seq)"
        for status, codes in self.responses.items():
            out[status] = f"{out[status]}, {codes}" if status in out else codes
        return dict(sorted(out.items()))


_SESSION = {"application/json": {"schema": {"$ref": "#/components/schemas/Session"}}}

ENDPOINTS: Final[tuple[Endpoint, ...]] = (
    Endpoint("GET", "/healthz", healthz, {200: "{status: ok}"}, public=True),
    Endpoint("GET", "/metrics", metrics, {200: "Prometheus text"}, media=CONTENT_TYPE),
    Endpoint("POST", "/sessions", create_session,
             {201: "the stored session", 400: "INVALID_SESSION_ID, WORKSPACE_REFUSED, "
              "UNKNOWN_COMPOSITION, NO_MODEL", 409: "SESSION_ALREADY_EXISTS"},
             body="CreateSession"),
    Endpoint("GET", "/sessions", list_sessions, {200: "{sessions: [Session]}"}),
    Endpoint("GET", "/sessions/{id}", get_session,
             {200: "the summary plus header, pendingApprovals, runningTurn"}),
    Endpoint("GET", "/sessions/{id}/events", session_events,
             {200: "one stored event per line"}, query=("after",),
             media="application/x-ndjson"),
    Endpoint("GET", "/sessions/{id}/model", session_model_view,
             {200: "{messages: [...]}: what the model is sent next (the inspector's model view)"}),
    Endpoint("GET", "/sessions/{id}/stream", session_stream,
             {200: "SSE: id = seq, event = type, data = the event"}, query=("after",),
             headers=("Last-Event-ID",), media="text/event-stream"),
    Endpoint("POST", "/sessions/{id}/turns", start_turn,
             {202: "{sessionId, turn}: the turn's start is stored",
              409: "SESSION_BUSY, SESSION_HELD, AWAITING_APPROVAL, UNKNOWN_COMPOSITION, "
              "a store's code"}, body="StartTurn"),
    Endpoint("POST", "/sessions/{id}/fork", fork_session,
             {201: "the child session, with fork: {sessionId, parentSession, boundary, effects}",
              400: "INVALID_SESSION_ID, INVALID_BOUNDARY, NOT_A_TURN_BOUNDARY",
              409: "SESSION_ALREADY_EXISTS"}, body="ForkSession"),
    Endpoint("POST", "/sessions/{id}/cancel", cancel_turn,
             {202: "{sessionId, turn, cancelled: true}", 409: "NOT_RUNNING"}),
    Endpoint("GET", "/approvals", list_approvals, {200: "{approvals: [...]}"}),
    Endpoint("POST", "/sessions/{id}/approvals/{callId}", decide,
             {200: "{sessionId, callId, decision, continued, continuedSession, turn}",
              409: "APPROVAL_NOT_PENDING, SESSION_BUSY, SESSION_HELD, a store's code"},
             body="Decide"),
    Endpoint("GET", "/", inspector, {200: "the inspector page (text/html)"}, public=True,
             media="text/html"),
)


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    doc = (endpoint.handler.__doc__ or "").strip()
    summary, _, description = doc.partition(". ")
    parameters: list[dict[str, Any]] = [
        {"name": name[1:-1], "in": "path", "required": True,
         "schema": {"type": "string", "pattern": "^[^/\\x00-\\x1f\\x7f]+$"}}
        for name in re.findall(r"\{[^}]+\}", endpoint.path)
    ]
    seq = {"type": "integer", "minimum": -1, "maximum": MAX_SEQ - 1}
    parameters += [{"name": q, "in": "query", "required": False, "schema": seq}
                   for q in endpoint.query]
    parameters += [{"name": h, "in": "header", "required": False, "schema": seq}
                   for h in endpoint.headers]
    responses: dict[str, Any] = {}
    for status, codes in endpoint.all_responses().items():
        if status < 300:
            media = _SESSION if status == 201 else {endpoint.media: {}}
            responses[str(status)] = {"description": codes, "content": media}
        else:
            responses[str(status)] = {"description": codes, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Error"}}}}
    operation: dict[str, Any] = {"summary": summary.rstrip("."), "responses": responses}
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if endpoint.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{endpoint.body}"}}}}
    if endpoint.public:
        operation["security"] = []
    return operation


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3 document of :data:`ENDPOINTS`."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    return {"openapi": "3.0.3", "info": {"title": "dsh serve", "version": "1"},
            "security": [{"bearer": []}], "components": _COMPONENTS, "paths": paths}


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


def routes() -> list[Route]:
    """The router's table: :data:`ENDPOINTS` (ids through the ``pathid`` convertor), and the
    document itself."""
    table = [Route(e.path.replace("{id}", "{id:pathid}").replace("{callId}", "{callId:pathid}"),
                   e.handler, methods=[e.method]) for e in ENDPOINTS]
    return [Route("/openapi.json", openapi, methods=["GET"]), *table]


def create_app(runtime: ServerRuntime, *, port: int) -> Starlette:
    """The application over a started runtime, listening on ``port`` (the ``Host`` check)."""
    options = runtime.options
    middleware = [
        Middleware(HostOriginGuard, port=port, check_host=options.token is None,
                   origins=options.cors_origins),
        Middleware(AuthenticationMiddleware, backend=BearerToken(options.token),
                   on_error=_auth_error),
    ]
    if options.cors_origins:
        middleware.insert(1, Middleware(
            CORSMiddleware, allow_origins=list(options.cors_origins),
            allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type",
                                                          "Last-Event-ID"],
        ))
    app = Starlette(
        routes=routes(),
        middleware=middleware,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            DshError: _dsh_error,
            **dict.fromkeys(_outage_classes(), _outage),
            Exception: _internal,
        },
    )
    app.state.runtime = runtime
    return app
