"""Run the application under Hypercorn, on trio or asyncio (whichever loop is running).

The listening socket is bound here (so a test can bind port 0 and learn the port) and handed
to Hypercorn as ``fd://``. Without a token the server refuses any address that is not
loopback: nobody else may reach an unauthenticated agent.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import anyio
import sniffio
from anyio.abc import TaskStatus

from .app import create_app
from .command import ServeUsageError
from .runtime import ServeOptions, open_runtime

__all__ = ["KEEP_ALIVE_SECONDS", "bind_socket", "check_bind", "serve"]

log = logging.getLogger("dsh.server")

#: Seconds an idle keep-alive connection stays open (see :func:`serve`).
KEEP_ALIVE_SECONDS = 5.0


def _is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ServeUsageError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback address unless a token is configured."""
    if token is None and not _is_loopback(host):
        raise ServeUsageError(
            f"--host {host} is not a loopback address and no token is configured: anyone who "
            "reaches it could run the agent; set DSH_SERVE_TOKEN (or --token-file FILE), or "
            "serve on 127.0.0.1"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServeUsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


async def serve(
    options: ServeOptions,
    sock: socket.socket,
    *,
    shutdown: Callable[[], Awaitable[None]] | None = None,
    on_ready: Callable[[], None] | None = None,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on ``sock`` until ``shutdown()`` returns (or the task is cancelled).

    ``on_ready()`` is called once the hosts have booted, just before Hypercorn starts.
    """
    from hypercorn.config import Config

    config = Config()
    # Hypercorn takes ownership of the descriptor it is given (and closes it): give it a copy.
    config.bind = [f"fd://{os.dup(sock.fileno())}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 2.0
    # An idle keep-alive connection is closed after this long: Hypercorn keeps the descriptor
    # of a connection its client already closed until then (measured: every finished request
    # of a client that went away held one socket for the whole timeout).
    config.keep_alive_timeout = KEEP_ALIVE_SECONDS
    stop = anyio.Event()

    async def trigger() -> None:
        if shutdown is None:
            await stop.wait()
        else:
            await shutdown()

    async with open_runtime(options) as runtime:
        app = create_app(runtime, port=sock.getsockname()[1])
        task_status.started()
        if on_ready is not None:
            on_ready()
        if sniffio.current_async_library() == "trio":
            from hypercorn.trio import serve as hypercorn_serve
        else:
            from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[assignment]
        await hypercorn_serve(app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]
