"""The HTTP API and the web inspector, as one Starlette application.

Every error is a JSON body ``{"error": {"code": "...", "message": "..."}}`` with a stable
``code`` (the table is in :data:`STATUS_CODES` and docs/serve.md). With a token configured,
every route but ``/healthz``, ``/openapi.json`` and the inspector's static page needs
``Authorization: Bearer TOKEN``. Request bodies are JSON, at most ``max_body_bytes``.
The OpenAPI document (``GET /openapi.json``) is generated from the route docstrings.
"""

from __future__ import annotations

import getpass
import hmac
import socket
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any, Final, Literal, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    SimpleUser,
    requires,
)
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from dsh_host.errors import DshError
from dsh_host.session.persistence import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
)

from .metrics import CONTENT_TYPE
from .runtime import ApiError, ServerRuntime
from .views import event_json

__all__ = ["STATUS_CODES", "create_app"]

T = TypeVar("T")

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

#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE_SECONDS: Final = 15.0


# ---------------------------------------------------------------------------- bodies


class CreateSession(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    workspace: str | None = None
    composition: str | None = None
    id: str | None = None


class StartTurn(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    prompt: str


class Decide(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    decision: Literal["allow", "deny"]
    reason: str | None = None
    args_digest: str | None = None


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def read_body(request: Request, kind: type[T], limit: int) -> T:
    """The request's JSON body as ``kind``; too large, not JSON or the wrong shape is refused."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"the request body is over {limit} bytes")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as application/json")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "PAYLOAD_TOO_LARGE", f"the request body is over {limit} bytes")
        chunks.append(chunk)
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


def _auth_error(conn: HTTPConnection, exc: Exception) -> Response:
    return error_response(401, "UNAUTHORIZED", str(exc))


authenticated = requires("authenticated", status_code=401)


# ---------------------------------------------------------------------------- handlers


def runtime_of(request: Request) -> ServerRuntime:
    runtime: ServerRuntime = request.app.state.runtime
    return runtime


async def healthz(request: Request) -> Response:
    """
    summary: Liveness
    responses:
      200: {description: "The process serves requests: {status: ok}"}
    """
    return JSONResponse({"status": "ok"})


@authenticated
async def metrics(request: Request) -> Response:
    """
    summary: Prometheus metrics (text format)
    responses:
      200: {description: "turns, steps, flush latency, pending approvals"}
    """
    runtime = runtime_of(request)
    await runtime.pending_approvals()
    runtime.metrics.turns_running.set(runtime.running_count())
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)


@authenticated
async def create_session(request: Request) -> Response:
    """
    summary: Create a session
    requestBody:
      content:
        application/json:
          schema: {$ref: "#/components/schemas/CreateSession"}
    responses:
      201:
        description: The stored session
        content:
          application/json: {schema: {$ref: "#/components/schemas/Session"}}
      400: {description: "INVALID_REQUEST, WORKSPACE_REFUSED, UNKNOWN_COMPOSITION"}
    """
    runtime = runtime_of(request)
    body = await read_body(request, CreateSession, runtime.options.max_body_bytes)
    load = await runtime.create_session(
        workspace=body.workspace, composition=body.composition, session_id=body.id
    )
    return JSONResponse(runtime.summary(load), status_code=201)


@authenticated
async def list_sessions(request: Request) -> Response:
    """
    summary: Every stored session, most recently updated first
    responses:
      200: {description: "{sessions: [Session]}"}
    """
    runtime = runtime_of(request)
    await runtime.refresh()
    return JSONResponse({"sessions": await runtime.summaries()})


@authenticated
async def get_session(request: Request) -> Response:
    """
    summary: One session's header, status and usage
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    responses:
      200:
        description: The session's summary plus header, pendingApprovals, runningTurn, refused
        content:
          application/json: {schema: {$ref: "#/components/schemas/Session"}}
      404: {description: "SESSION_NOT_FOUND"}
    """
    runtime = runtime_of(request)
    await runtime.refresh()
    session_id = request.path_params["id"]
    stored = await runtime.stored_summary(session_id)
    running = runtime.running(session_id)
    return JSONResponse({
        **stored.fields,
        "status": runtime.status(session_id, stored),
        "header": stored.header,
        "pendingApprovals": list(stored.approvals),
        "runningTurn": running.turn if running is not None else None,
        # why this server would refuse every operation on it (null: none); the inspector
        # offers no action then
        "refused": runtime.refusal(session_id, stored),
    })


@authenticated
async def session_events(request: Request) -> Response:
    """
    summary: Stored events after a seq, as JSON lines (application/x-ndjson)
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
      - name: after
        in: query
        required: false
        schema: {type: integer}
        description: "only events with a larger seq (default: all)"
    responses:
      200: {description: "one event per line, in its stored wire form"}
      404: {description: "SESSION_NOT_FOUND"}
    """
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    after = _after(request.query_params.get("after"), "after")
    events = await runtime.events_after(session_id, after)
    body = b"".join(event_json(e) + b"\n" for e in events)
    return Response(body, media_type="application/x-ndjson")


@authenticated
async def session_stream(request: Request) -> Response:
    """
    summary: Server-sent events of the session's new events
    description: >-
      Each SSE event has id = the event's seq, event = its type and data = the event as
      JSON. Resume with the Last-Event-ID header (or ?after=SEQ). Comment lines keep an idle
      stream open.
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
      - {name: after, in: query, required: false, schema: {type: integer}}
      - {name: Last-Event-ID, in: header, required: false, schema: {type: integer}}
    responses:
      200: {description: "text/event-stream"}
      404: {description: "SESSION_NOT_FOUND"}
    """
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    resumed = request.headers.get("last-event-id")
    if resumed is not None:
        after = _after(resumed, "Last-Event-ID")
    else:
        after = _after(request.query_params.get("after"), "after")
    first = await runtime.events_after(session_id, after)  # a 404 before the stream starts

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
            idle = 0.0
            while True:
                await runtime.wait_for_events(session_id, runtime.options.poll_interval)
                pending = await runtime.events_after(session_id, last)
                if pending:
                    break
                idle += runtime.options.poll_interval
                if idle >= KEEPALIVE_SECONDS:
                    idle = 0.0
                    yield b": keep-alive\n\n"

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@authenticated
async def start_turn(request: Request) -> Response:
    """
    summary: Start a turn (runs in the background)
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    requestBody:
      content:
        application/json:
          schema: {$ref: "#/components/schemas/StartTurn"}
    responses:
      202: {description: "{sessionId, turn}: the turn's number; follow it with /stream"}
      404: {description: "SESSION_NOT_FOUND"}
      409: {description: "SESSION_BUSY, SESSION_HELD, AWAITING_APPROVAL"}
    """
    runtime = runtime_of(request)
    body = await read_body(request, StartTurn, runtime.options.max_body_bytes)
    session_id = request.path_params["id"]
    turn = await runtime.start_turn(session_id, body.prompt)
    return JSONResponse({"sessionId": session_id, "turn": turn}, status_code=202)


@authenticated
async def cancel_turn(request: Request) -> Response:
    """
    summary: >-
      Cancel the session's turn: a running one ends aborted once started tool bodies return;
      one still queued for a worker (--queue) never starts
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    responses:
      202: {description: "{sessionId, turn, cancelled: true}"}
      409: {description: "NOT_RUNNING"}
    """
    runtime = runtime_of(request)
    session_id = request.path_params["id"]
    turn = await runtime.cancel(session_id)
    return JSONResponse({"sessionId": session_id, "turn": turn, "cancelled": True},
                        status_code=202)


@authenticated
async def list_approvals(request: Request) -> Response:
    """
    summary: Pending approvals across sessions, oldest first
    responses:
      200:
        description: >-
          {approvals: [{sessionId, callId, tool, argsDigest, arguments, askedAt, turn}]}
    """
    return JSONResponse({"approvals": await runtime_of(request).pending_approvals()})


@authenticated
async def decide(request: Request) -> Response:
    """
    summary: Allow or deny a pending call (bound to its call id and argsDigest, one-shot)
    description: >-
      When no call of the session waits any more, the turn continues in the background:
      allowed calls run once, denied ones get the rejection text, then the model.
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
      - {name: callId, in: path, required: true, schema: {type: string}}
    requestBody:
      content:
        application/json:
          schema: {$ref: "#/components/schemas/Decide"}
    responses:
      200: {description: "{sessionId, callId, decision, continued, turn}"}
      404: {description: "SESSION_NOT_FOUND"}
      409: {description: "APPROVAL_NOT_PENDING, SESSION_BUSY, SESSION_HELD"}
    """
    runtime = runtime_of(request)
    body = await read_body(request, Decide, runtime.options.max_body_bytes)
    session_id, call_id = request.path_params["id"], request.path_params["callId"]
    user = request.user.display_name if request.user.is_authenticated else "anonymous"
    turn = await runtime.decide(
        session_id, call_id, body.decision, reason=body.reason, args_digest=body.args_digest,
        decided_by=f"dsh serve ({user}) on {socket.gethostname()} as {_os_user()}",
    )
    return JSONResponse({"sessionId": session_id, "callId": call_id, "decision": body.decision,
                         "continued": turn is not None, "turn": turn})


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


async def inspector(request: Request) -> Response:
    """
    summary: The web inspector (HTML; it calls this API with the token given in the page)
    responses:
      200: {description: "text/html"}
    """
    page = resources.files("dsh_host.server").joinpath("inspector.html").read_text("utf-8")
    return HTMLResponse(page, headers={
        "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    })


# ---------------------------------------------------------------------------- errors


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, str(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = STATUS_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    message = exc.detail if exc.status_code != 401 else (
        "this server needs Authorization: Bearer TOKEN (the token it was started with)"
    )
    return error_response(exc.status_code, code, message)


async def _dsh_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, SessionNotFoundError):
        return error_response(404, "SESSION_NOT_FOUND", str(exc))
    if isinstance(exc, SessionAlreadyOwnedError):
        return error_response(409, "SESSION_HELD", str(exc))
    if isinstance(exc, SessionAlreadyExistsError):
        return error_response(409, "SESSION_ALREADY_EXISTS", str(exc))
    code = getattr(exc, "code", "DSH_ERROR")
    return error_response(409 if code.endswith("BUSY") else 400, code, str(exc))


async def _internal(request: Request, exc: Exception) -> Response:
    return error_response(500, "INTERNAL", f"internal error: {type(exc).__name__}: {exc}")


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
            "workspace": {"type": "string"}, "composition": {"type": "string"},
            "id": {"type": "string"}}},
        "StartTurn": {"type": "object", "required": ["prompt"], "additionalProperties": False,
                      "properties": {"prompt": {"type": "string"}}},
        "Decide": {"type": "object", "required": ["decision"], "additionalProperties": False,
                   "properties": {"decision": {"enum": ["allow", "deny"]},
                                  "reason": {"type": "string"},
                                  "argsDigest": {"type": "string"}}},
        "Session": {"type": "object", "properties": {
            "id": {"type": "string"}, "title": {"type": "string", "nullable": True},
            "status": {"enum": ["idle", "queued", "running", "awaiting-approval",
                                "interrupted"]},
            "createdAt": {"type": "integer"}, "updatedAt": {"type": "integer"},
            "workspace": {"type": "string"}, "composition": {"type": "string"},
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


def routes() -> list[Route]:
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
        Route("/sessions", create_session, methods=["POST"]),
        Route("/sessions", list_sessions, methods=["GET"]),
        Route("/sessions/{id}", get_session, methods=["GET"]),
        Route("/sessions/{id}/events", session_events, methods=["GET"]),
        Route("/sessions/{id}/stream", session_stream, methods=["GET"]),
        Route("/sessions/{id}/turns", start_turn, methods=["POST"]),
        Route("/sessions/{id}/cancel", cancel_turn, methods=["POST"]),
        Route("/approvals", list_approvals, methods=["GET"]),
        Route("/sessions/{id}/approvals/{callId}", decide, methods=["POST"]),
        Route("/", inspector, methods=["GET"]),
    ]


_SCHEMAS = SchemaGenerator({
    "openapi": "3.0.3",
    "info": {"title": "dsh serve", "version": "1"},
    "security": [{"bearer": []}],
    "components": _COMPONENTS,
})


async def openapi(request: Request) -> Response:
    return JSONResponse(_SCHEMAS.get_schema(routes=request.app.routes))


def create_app(runtime: ServerRuntime) -> Starlette:
    """The application over a started runtime."""
    options = runtime.options
    middleware = [
        Middleware(AuthenticationMiddleware, backend=BearerToken(options.token),
                   on_error=_auth_error),
    ]
    if options.cors_origins:
        middleware.insert(0, Middleware(
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
            Exception: _internal,
        },
    )
    app.state.runtime = runtime
    return app
