"""``read_file`` and ``write_file``: in-process file tools fenced to the workspace root.

The fence is path-based: a path is resolved against the workspace, symlinks
included (``realpath``), and must land inside the canonical workspace root.
A symlink that points out of the workspace is refused, not followed. Writes
go to a temporary file in the target directory and replace the target with
``os.replace`` after an ``fsync``, so a crash leaves the old or the new
content, never a torn file; the final component is opened without following
symlinks.

``write_file`` honours the row's sandbox mode like the bash sandbox does:
under ``read-only`` it refuses with the sandbox denial marker. It never
writes outside the workspace, whatever the mode (``danger-full-access``
widens ``bash`` only).

Both run the filesystem calls on a worker thread, so a slow disk does not
stall the event loop.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Any, Final

import anyio.to_thread

from dsh_host.session.messages import ContentBlock, TextBlock
from dsh_host.tools import ToolDefinition, ToolError, ToolExecution, ToolOutput, text_output

from .bash import denial_marker
from .config import BuiltinToolsConfig

__all__ = [
    "FileFenceError",
    "FileSandboxDeniedError",
    "read_file_tool",
    "resolve_in_workspace",
    "write_file_tool",
]


class FileFenceError(ToolError):
    """A path resolves outside the workspace root (``FS_OUTSIDE_WORKSPACE``)."""

    code = "FS_OUTSIDE_WORKSPACE"


class FileSandboxDeniedError(ToolError):
    """The row's sandbox mode does not allow this file effect (``FS_SANDBOX_DENIED``)."""

    code = "FS_SANDBOX_DENIED"


READ_PARAMETERS: Final = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "File to read; a relative path is resolved against the workspace.",
        },
        "offset": {
            "type": "integer",
            "description": "First line to return (1-based). Defaults to 1.",
        },
        "limit": {
            "type": "integer",
            "description": "How many lines to return. Defaults to the whole file.",
        },
    },
    "required": ["path"],
}

WRITE_PARAMETERS: Final = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "File to write; a relative path is resolved against the workspace.",
        },
        "content": {"type": "string", "description": "The complete new content of the file."},
    },
    "required": ["path", "content"],
}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_in_workspace(path: str, root: str) -> str:
    """The canonical absolute path of ``path`` (relative to ``root``), fenced to ``root``.

    The deepest existing ancestor is resolved with ``realpath`` (so a symlinked
    directory counts where it points); the not-yet-existing rest is appended
    lexically. Raises :class:`FileFenceError` when the result is outside ``root``.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise FileFenceError("invalid path: expected a non-empty string without NUL bytes")
    candidate = os.path.normpath(path if os.path.isabs(path) else os.path.join(root, path))
    resolved = os.path.realpath(candidate)
    if not _inside(resolved, root):
        raise FileFenceError(
            f'path "{path}" resolves to {resolved}, which is outside the workspace {root}; '
            "the file tools only reach files inside the workspace"
        )
    return resolved


def _display(path: str, root: str) -> str:
    relative = os.path.relpath(path, root)
    return path if relative.startswith("..") else relative


def read_file_tool(config: BuiltinToolsConfig, workspace: str) -> ToolDefinition:
    """Build ``read_file``: the text of one file (optionally a line range)."""
    limit_bytes = config.max_read_bytes

    def read_sync(path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f'"{path}" is not a regular file')
            if info.st_size > limit_bytes:
                raise ToolError(
                    f'"{path}" is {info.st_size} bytes; read_file returns files up to '
                    f"{limit_bytes} bytes (use bash with head/sed for a part of a larger file)"
                )
            with os.fdopen(fd, "rb", closefd=False) as handle:
                return handle.read(limit_bytes + 1)
        finally:
            os.close(fd)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        path = await anyio.to_thread.run_sync(resolve_in_workspace, args["path"], workspace)
        offset = args.get("offset", 1)
        count = args.get("limit")
        if offset < 1:
            raise ToolError(f"invalid offset: expected a line number >= 1, got {offset}")
        if count is not None and count < 1:
            raise ToolError(f"invalid limit: expected a positive line count, got {count}")
        try:
            data = await anyio.to_thread.run_sync(read_sync, path)
        except FileNotFoundError:
            raise ToolError(f'file "{_display(path, workspace)}" does not exist') from None
        except IsADirectoryError:
            raise ToolError(f'"{_display(path, workspace)}" is a directory') from None
        if b"\0" in data[:8192]:
            raise ToolError(f'"{_display(path, workspace)}" looks like a binary file')
        text = data.decode("utf-8", "replace")
        if offset == 1 and count is None:
            return text
        lines = text.splitlines(keepends=True)
        end = None if count is None else offset - 1 + int(count)
        return "".join(lines[offset - 1 : end])

    return ToolDefinition(
        name="read_file",
        description=(
            "Read a UTF-8 text file inside the workspace and return its content (optionally a "
            "line range with `offset` and `limit`). Paths outside the workspace are refused."
        ),
        parameters=READ_PARAMETERS,
        execute=execute,
        output=text_output(),
        is_concurrency_safe=lambda args: True,
    )


def _render_write(_args: Any, value: Any) -> list[ContentBlock]:
    return [TextBlock(text=f"Wrote {value['bytes']} bytes to {value['path']}")]


def write_file_tool(config: BuiltinToolsConfig, workspace: str) -> ToolDefinition:
    """Build ``write_file``: replace (or create) one file atomically."""
    mode = config.sandbox

    def write_sync(path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        # Re-check the fence after creating parents: a racing symlink must not move us out.
        if not _inside(os.path.realpath(directory), workspace):
            raise FileFenceError(f"{directory} left the workspace {workspace} while writing")
        if os.path.islink(path):
            raise FileFenceError(f'"{path}" is a symbolic link; write_file does not follow links')
        temp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        path = await anyio.to_thread.run_sync(resolve_in_workspace, args["path"], workspace)
        if mode == "read-only":
            raise FileSandboxDeniedError(
                f"write_file is not allowed under read-only mode {denial_marker(mode)}"
            )
        data = str(args["content"]).encode("utf-8")
        await anyio.to_thread.run_sync(write_sync, path, data)
        return {"path": _display(path, workspace), "bytes": len(data)}

    return ToolDefinition(
        name="write_file",
        description=(
            "Write a UTF-8 text file inside the workspace, replacing it if it exists and creating "
            "missing parent directories. The write is atomic (the file has the old or the new "
            "content, never a mix). Paths outside the workspace are refused."
        ),
        parameters=WRITE_PARAMETERS,
        execute=execute,
        output=ToolOutput(
            schema={
                "type": "object",
                "properties": {"path": {"type": "string"}, "bytes": {"type": "integer"}},
                "required": ["path", "bytes"],
            },
            render=_render_write,
        ),
    )
