"""A small MCP stdio server of ours, for what the reference servers cannot do on demand.

Run as ``python fixture_server.py``. Its tools: ``whoami`` (returns the request's ``_meta``
and its own pid), ``write_file`` (tries to create a file at an absolute path and reports what
happened), ``add_tool`` (registers a new tool, which makes the SDK send
``notifications/tools/list_changed``), ``run`` (runs an argv, returns its stdout), ``sleep`` (sleeps, for timeouts and crashes; with ``MARK_DIR`` it first leaves a marker), ``crash`` (exits at
once, mid-call), ``wipe`` (annotated ``destructiveHint: true``; does nothing), ``fail``
(answers ``isError: true``), ``picture`` (a text block and an image block: a real PNG, or
with ``broken`` bytes that are no image). With ``--linger`` it stays alive after its stdin closed.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import zlib

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, TextContent, ToolAnnotations

server = MCPServer("dsh-fixture")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami(ctx: Context) -> str:
    """Report the request's _meta and this server's pid."""
    meta = ctx.request_context.meta
    return json.dumps({"meta": dict(meta) if meta else None, "pid": os.getpid()})


@server.tool()
def write_file(path: str) -> str:
    """Try to create `path` and write a marker into it."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("written by the fixture MCP server\n")
    except OSError as exc:
        return f"refused: {exc.strerror} ({exc.errno})"
    return "written"


@server.tool()
def run(argv: list[str]) -> str:
    """Run `argv` (the server's own child, so under the server's confinement); its stdout."""
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    return done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr}"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a new tool called `name` (then tell the client the list changed)."""

    def added() -> str:
        return f"{name} answers"

    server.add_tool(added, name=name, description=f"added at run time: {name}")
    await ctx.request_context.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def sleep(seconds: float, ctx: Context) -> str:
    """Sleep `seconds`, then answer. With `MARK_DIR` set, first leave `started-<callId>` there
    (the host can see that the call reached the server)."""
    mark_dir = os.environ.get("MARK_DIR")
    if mark_dir:
        meta = ctx.request_context.meta or {}
        mark = anyio.Path(mark_dir) / f"started-{meta.get('dsh/callId')}"
        await mark.write_text("started\n")
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Exit the server process at once, before answering."""
    sys.stdout.flush()
    os._exit(17)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def wipe() -> str:
    """Pretend to wipe something (annotated destructive)."""
    return "wiped"


@server.tool()
def fail() -> str:
    """Always fail."""
    raise ToolError("the fixture refuses")


def png() -> bytes:
    """A real 2x2 red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return len(data).to_bytes(4, "big") + kind + data + crc.to_bytes(4, "big")

    header = (2).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def picture(broken: bool = False) -> list[TextContent | ImageContent]:
    """A caption, then an image."""
    raw = b"not an image at all" if broken else png()
    return [
        TextContent(type="text", text="a red square"),
        ImageContent(type="image", data=base64.b64encode(raw).decode(), mime_type="image/png"),
    ]


if __name__ == "__main__":
    server.run("stdio")
    if "--linger" in sys.argv:  # a server that outlives its stdin: only a kill ends it
        time.sleep(3600)
