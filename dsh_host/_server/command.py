"""``dsh serve``: the argument parser and the handler (the web stack is imported on use only).

The composition is built the way ``dsh run`` builds it: the ``--model`` row first, the
``--root`` override on the file store's row (JSONL or SQLite), and approvals deferred
(``policy: ask, unanswered: defer``): nobody sits at the server's terminal, so an ask waits
for a decision through the API.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsh_host._composition_edits import patch, patch_term
from dsh_host._compositions import composition_digest, load_config
from dsh_host._front.models import MODEL_SPECS, parse_model
from dsh_host._front.runner import with_model
from dsh_host._loader import LocatedRow
from dsh_host._session.events.data import CompositionTerms
from dsh_host._shipped_plugins import declared_root_keys
from dsh_host.errors import ConfigError, DshError, install_hint

__all__ = ["QUEUE_DSN_ENV", "TOKEN_ENV", "ServeUsageError", "add_parser", "build_compositions"]

#: The environment variable the bearer token is read from (or --token-file).
TOKEN_ENV = "DSH_SERVE_TOKEN"
#: The environment variable the job queue's PostgreSQL DSN is read from (--queue).
QUEUE_DSN_ENV = "DSH_POSTGRES_DSN"
DEFAULT_PORT = 8321


class ServeUsageError(DshError):
    """A flag, an address or a composition ``dsh serve`` cannot use (exit 2)."""

    code = "CLI_USAGE"
    exit_code = 2


def _port(text: str) -> int:
    """A TCP port, 0-65535 (the OS truncates a larger number to 16 bits and listens there)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535; 0 picks a free one)")
    return port


def add_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve sessions over HTTP (API, event streams, approvals, web inspector)",
        description="Run agents behind an HTTP API: create sessions, start turns in the "
        "background, follow their events (JSON lines or SSE), decide pending approvals, and "
        f"inspect everything in a browser at /. Needs the serve extra: {install_hint('serve')}.",
    )
    serve.add_argument(
        "--config", metavar="FILE", help="YAML composition (default: as for dsh run)"
    )
    serve.add_argument(
        "--composition",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="an extra named composition that POST /sessions may choose (repeatable); it must "
        "store sessions where the default one does",
    )
    serve.add_argument(
        "--root", metavar="DIR", help="the directory of the composition's file session store"
    )
    serve.add_argument(
        "--model",
        metavar="SPEC",
        help=f"{MODEL_SPECS}: the model of new sessions (default: the composition's; a "
        "composition that names none cannot create sessions, and the built-in demo script "
        "runs only when named)",
    )
    serve.add_argument(
        "--workspace",
        metavar="DIR",
        help="default workspace of new sessions (default: the current directory)",
    )
    serve.add_argument(
        "--allow-workspace",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory (and everything below it) a new session may name as its workspace",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                       "127.0.0.1; another address needs a token)")
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT,
                       help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the bearer token clients must send (default: ${TOKEN_ENV}; "
        "neither: no token, loopback only)",
    )
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="allow browser requests from this origin (repeatable; default none)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N",
                       help="largest request body accepted (default 1 MiB)")
    serve.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="time a request body may take to arrive whole (default 30; "
                       "408 after)")
    serve.add_argument("--backend", choices=("trio", "asyncio"),
                       help="event loop (default trio; asyncio with --queue)")
    queue = serve.add_argument_group(
        "many workers", "turn jobs in PostgreSQL (needs the serve-postgres extra and a "
        "composition whose sessions live in PostgreSQL, e.g. configs/postgres.yml)")
    queue.add_argument(
        "--queue", action="store_true",
        help=f"run turns as PostgreSQL jobs (DSN from ${QUEUE_DSN_ENV}); every process started "
        "so takes jobs, any of them serves reads and streams",
    )
    queue.add_argument("--queue-schema", default="dsh_queue", metavar="NAME",
                       help="PostgreSQL schema of the job tables (default dsh_queue)")
    queue.add_argument("--concurrency", type=int, default=4, metavar="N",
                       help="turns this worker runs at once (default 4)")
    queue.add_argument("--stalled-after", type=float, default=6.0, metavar="SECONDS",
                       help="a worker silent this long is taken for dead and its job retried "
                       "(default 6)")
    queue.add_argument(
        "--after-repair", choices=("stop", "continue"), default="stop",
        help="when a job's turn was interrupted by a dead worker: stop after the repair "
        "(default), or continue with a new turn that shows the model the repair",
    )
    serve.set_defaults(handler=run_serve)


def _composition(path: str | None, model: str | None, root: str | None) -> list[LocatedRow]:
    """The rows of one served composition: ``--model`` routed in by the runner's
    :func:`~dsh_host._front.runner.with_model` (as ``dsh run`` does), else the composition's own
    model row (none: the server refuses to create sessions on it, D22 in docs/decisions.md)."""
    rows = list(load_config(path).rows)
    if model is not None:
        try:
            choice = parse_model(model)
        except ConfigError as exc:
            raise ServeUsageError(str(exc)) from None
        rows = with_model(rows, choice, f"--model {model}")
    if root is not None:
        # the file stores say which config key holds their directory (Plugin.root_key)
        stores = declared_root_keys()
        hits = [patch(rows, store, {key: root}) for store, key in stores.items()]
        if not any(hits):
            raise ServeUsageError(
                f"--root needs a row running {' or '.join(stores)} in the composition"
            )
    patch_term(rows, "approval_policy", "ask")
    patch_term(rows, "unanswered", "defer")
    return rows


def build_compositions(
    config: str | None, extra: Sequence[str], model: str | None, root: str | None
) -> dict[str, list[LocatedRow]]:
    """``default`` (``--config``) first, then every ``--composition NAME=FILE``."""
    out = {"default": _composition(config, model, root)}
    for spec in extra:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ServeUsageError(f"--composition {spec!r}: write it NAME=FILE")
        if name in out:
            raise ServeUsageError(f"--composition {name}: the name is used twice")
        out[name] = _composition(path, model, root)
    return out


def composition_identities(
    config: str | None, extra: Sequence[str]
) -> dict[str, CompositionTerms]:
    """Each served composition's identity in the run terms, as ``dsh run`` records it: the file
    and the digest of its rows as loaded (so a session moves between the CLI and the server)."""
    files = {"default": config, **{s.partition("=")[0]: s.partition("=")[2] for s in extra}}
    out = {}
    for name, path in files.items():
        loaded = load_config(path)
        out[name] = CompositionTerms(
            name=str(loaded.path.resolve()), digest=composition_digest(loaded.rows)
        )
    return out


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ServeUsageError(f"--token-file {args.token_file}: {exc.strerror}") from None
        if not token:
            raise ServeUsageError(f"--token-file {args.token_file}: the file is empty")
        _hide_token_file(args.token_file)
        return token
    return os.environ.get(TOKEN_ENV) or None


def _hide_token_file(path: str) -> None:
    """No tool call may read the token (it approves gated calls): every confined call gets the
    file hidden at ``confine()``; a host whose sandbox cannot hide a path refuses the option."""
    from dsh_host._sandbox import hide_from_sandboxes

    hide_from_sandboxes(path)
    try:  # the host layer does not depend on the plugin; without it there is nothing to ask
        plugin = importlib.import_module("dsh_sandbox_local")
    except ImportError:
        return
    if not plugin.LocalSandboxProvider().can_hide_paths():
        raise ServeUsageError(
            f"--token-file {path}: this host's sandbox cannot hide the file from tool calls "
            f"(bubblewrap unusable and Landlock without privileges); pass the token in "
            f"${TOKEN_ENV} instead (tool calls never see the harness's environment)"
        )


def _queue_dsn(args: argparse.Namespace) -> str | None:
    if not args.queue:
        return None
    dsn = os.environ.get(QUEUE_DSN_ENV)
    if not dsn:
        raise ServeUsageError(f"--queue needs ${QUEUE_DSN_ENV} (the PostgreSQL DSN of the queue)")
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        raise ServeUsageError(
            f"--queue needs the serve-postgres extra: {install_hint('serve-postgres')}"
        ) from None
    return dsn


def run_serve(args: argparse.Namespace) -> int:
    try:
        import anyio

        from .runtime import ServeOptions
        from .serve import bind_socket, check_bind, serve
    except ImportError as exc:
        raise ServeUsageError(
            f"dsh serve needs the serve extra ({exc.name} is missing): {install_hint('serve')}"
        ) from None
    # A fatal signal is said, not silent: SQLite maps its WAL index (the "-shm" file), and when
    # that file is cut short under it (another process truncating it, a full tmpfs) the next
    # access is SIGBUS, which no Python code can catch. The process dies either way; with the
    # fault handler it says why and where on stderr (the store itself is intact: a restart
    # rebuilds the index from the WAL).
    faulthandler.enable(file=sys.stderr, all_threads=True)
    token = _token(args)
    check_bind(args.host, token)
    workspace = os.path.realpath(args.workspace or os.getcwd())
    if not os.path.isdir(workspace):
        raise ServeUsageError(f"--workspace {args.workspace}: not a directory")
    roots = tuple(os.path.realpath(p) for p in args.allow_workspace)
    options = ServeOptions(
        compositions=build_compositions(args.config, args.composition, args.model, args.root),
        identities=composition_identities(args.config, args.composition),
        model_spec=args.model,
        default_workspace=workspace,
        workspace_roots=roots,
        token=token,
        cors_origins=tuple(args.cors_origin),
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        after_repair=args.after_repair,
        queue_dsn=_queue_dsn(args),
        queue_schema=args.queue_schema,
        queue_concurrency=args.concurrency,
        stalled_after=args.stalled_after,
    )
    backend = args.backend or ("asyncio" if args.queue else "trio")
    if args.queue and backend != "asyncio":
        raise ServeUsageError("--queue runs on asyncio (procrastinate); drop --backend trio")
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]

    def ready() -> None:  # the first line of output: tests and scripts read the port from it
        print(f"dsh serve: listening on http://{host}:{port}/ (inspector at /, API at "
              "/openapi.json)", flush=True)

    async def main() -> None:
        # SIGINT / SIGTERM stop the server gracefully: open streams close, running turns end
        # aborted (cause disposed) and are flushed, every session is released.
        stop = anyio.Event()

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        failure: Exception | None = None  # raised outside the group: no ExceptionGroup
        async with anyio.create_task_group() as group:
            group.start_soon(on_signal)
            try:
                await serve(options, sock, shutdown=stop.wait, on_ready=ready)
            except Exception as exc:
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    try:
        anyio.run(main, backend=backend)
    finally:
        sock.close()
    return 0
