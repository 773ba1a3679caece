"""``dsh plugins``: what a composition resolves to, row by row."""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from .._compositions import load_config
from .._loader import open_host
from .flags import add_config_flag
from .output import console
from .render import terminal_safe


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "plugins",
        help="show each row of a composition: plugin, entry point, services, hooks, state",
        description="Boot the composition (without running anything) and report every row.",
    )
    add_config_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


async def _describe(ctx: Any, row: dict[str, Any]) -> list[str]:
    """What an active row's services say about themselves (``describe()``, e.g. the sandbox
    backend chosen and why); run in a worker thread, since it may probe the host."""
    if row["state"] != "active":
        return []
    lines: list[str] = []
    for name in row["provides"]:
        describe = getattr(ctx.get(name), "describe", None)
        if callable(describe):
            lines.append(f"{name}: {await anyio.to_thread.run_sync(describe)}")
    return lines


#: Config keys whose values are secrets (an ``*_env`` key names a variable, and is shown).
_SECRET = re.compile(
    r"(secret|password|passwd|token|api[_-]?key|credential|authorization|cookie)s?$",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/:@\s]+:)[^@\s]+(?P<at>@)", re.I)


def masked(value: Any, key: str = "") -> Any:
    """``value`` with secrets replaced by ``"***"``: values of secret-named keys, the password
    of a URL (``postgresql://me:***@db``) and ``password=`` in a connection string."""
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET.search(key) and not key.lower().endswith("env"):
            return "***"
        value = _URL_PASSWORD.sub(r"\g<head>***\g<at>", value)
        return re.sub(r"(password\s*=\s*)\S+", r"\1***", value, flags=re.IGNORECASE)
    return value


def _effective_config(host: Any, row_id: str) -> Any:
    """The row's config as its plugin received it (defaults filled in), secrets masked."""
    for fiber in getattr(host, "fibers", ()):
        if fiber.id == row_id and fiber.config is not None:
            try:
                return masked(msgspec.to_builtins(fiber.config))
            except TypeError:
                return None
    return None


def run(args: argparse.Namespace) -> int:
    composition = load_config(args.config)
    config, rows = composition.path, composition.rows
    started = time.perf_counter()

    async def boot() -> list[dict[str, Any]]:
        async with open_host(rows, strict=False) as host:
            status = host.status()
            for row in status:
                row["status"] = await _describe(host.ctx, row)
                row["config"] = _effective_config(host, row["id"])
            return status

    # asyncio: booting and disposing needs no trio (the host runs on both, as `dsh chat` boots
    # the same rows on asyncio), and importing trio is a sixth of this command's start.
    status = anyio.run(boot, backend="asyncio")
    elapsed_ms = (time.perf_counter() - started) * 1000
    problems = [row for row in status if row["state"] not in ("active", "disabled")]
    if args.json:
        print(json.dumps({"config": str(config), "origin": composition.origin,
                          "bootMs": round(elapsed_ms, 1), "rows": status}))
    else:
        out = console()
        out.print(f"{config} ({composition.origin}; booted in {elapsed_ms:.0f} ms)", markup=False)
        for row in status:
            style = {"active": "green", "disabled": "dim"}.get(row["state"], "red")
            detail = f"[{style}]{row['detail']}[/{style}]"
            out.print(f"[bold]{row['id']}[/bold]  {row['name']}  {detail}")
            out.print(f"    entry point: {row['entryPoint'] or '-'}", markup=False)
            out.print(
                f"    provides: {', '.join(row['provides']) or '-'}   "
                f"injects: {', '.join(row['injects']) or '-'}",
                markup=False,
            )
            out.print(f"    hooks: {', '.join(row['hooks']) or '-'}", markup=False)
            if row["config"]:
                shown = json.dumps(row["config"], ensure_ascii=False, sort_keys=True)
                out.print(f"    config: {terminal_safe(shown, multiline=False)}", markup=False)
            for line in row["status"]:
                out.print(f"    status: {line}", markup=False)
        if problems:
            console(stderr=True).print(
                f"[red]{len(problems)} row(s) not active[/red]: "
                + "; ".join(f"{r['id']} ({r['detail']})" for r in problems)
            )
    return 1 if problems else 0
