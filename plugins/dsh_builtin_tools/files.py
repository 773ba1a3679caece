"""``read_file`` and ``write_file``: in-process file tools fenced to the workspace root.

The fence is descriptor-based (DECISIONS D20): the row holds a descriptor of
the workspace directory and every path is opened beneath it with
:mod:`dsh_host.tools.beneath` (``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``,
or an ``O_NOFOLLOW`` walk where the kernel lacks it). No symbolic link is
followed, wherever it points, and ``..`` is refused, so a process racing the
tool (swapping a directory for a symlink, say) cannot move a read or a write
out of the workspace. ``read_file`` opens non-blocking and reads regular
files only (a FIFO or a device is refused instead of hanging the harness).
Writes go to a temporary file (``O_EXCL | O_NOFOLLOW``) in the target
directory's descriptor and replace the target with a rename relative to the
same descriptor after an ``fsync``, so a crash leaves the old or the new
content, never a torn file.

``write_file`` honours the row's sandbox mode like the bash sandbox does:
under ``read-only`` it refuses with the sandbox denial marker. It never
writes outside the workspace, whatever the mode (``danger-full-access``
widens ``bash`` only).

Both run the filesystem calls on a worker thread, so a slow disk does not
stall the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import Any, Final

import anyio.to_thread

from dsh_host.context import Context
from dsh_host.session.messages import ContentBlock, TextBlock
from dsh_host.tools import ToolDefinition, ToolError, ToolExecution, ToolOutput, text_output
from dsh_host.tools.beneath import (
    BeneathPathError,
    beneath_parts,
    open_beneath,
    open_dirs_beneath,
)

from .bash import denial_marker
from .config import BuiltinToolsConfig

__all__ = [
    "FileFenceError",
    "FileSandboxDeniedError",
    "WorkspaceRoot",
    "read_file_tool",
    "resolve_in_workspace",
    "workspace_parts",
    "workspace_root",
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

    Advisory only (it names where a path points, for messages): the tools themselves open
    through :func:`workspace_parts` and :mod:`dsh_host.tools.beneath`, which a concurrent
    rename cannot redirect. Raises :class:`FileFenceError` when the result is outside ``root``.
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


def workspace_parts(path: Any, root: str) -> tuple[str, ...]:
    """The components of ``path`` beneath the workspace ``root``, or a :class:`FileFenceError`.

    A path pointing out through a symlink gets the advisory ``resolves to`` message first; the
    open itself refuses every symlink whatever it points at.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise FileFenceError("invalid path: expected a non-empty string without NUL bytes")
    try:
        parts = beneath_parts(path, root)
    except BeneathPathError as error:
        if error.reason == "dotdot":
            raise FileFenceError(
                f'path "{path}" contains "..", which could lead outside the workspace {root}; '
                'the file tools only take paths that stay beneath it (no ".." components)'
            ) from None
        raise FileFenceError(
            f'path "{path}" is outside the workspace {root}; the file tools only reach files '
            "inside the workspace"
        ) from None
    try:
        resolve_in_workspace(path, root)
    except OSError:
        pass  # a component changed under realpath; the descriptor-based open decides
    return parts


def _display_parts(parts: tuple[str, ...]) -> str:
    return os.sep.join(parts) or "."


def _fence_error(error: OSError, shown: str, root: str) -> ToolError | None:
    """The tool error for a refused resolution, or None when ``error`` is something else."""
    if error.errno == errno.ELOOP:
        return FileFenceError(
            f'path "{shown}" goes through a symbolic link; the file tools do not follow links '
            f"(a link can lead outside the workspace {root})"
        )
    if error.errno == errno.EXDEV:
        return FileFenceError(
            f'path "{shown}" left the workspace {root} while it was being opened; the file tools '
            "only reach files inside the workspace"
        )
    if error.errno == errno.ENOTDIR:
        return ToolError(f'path "{shown}": a parent component is not a directory')
    return None


class WorkspaceRoot:
    """A descriptor of the workspace directory, opened once for the row (closed on dispose).

    Every file tool resolves from it, so even a renamed or replaced workspace path does not
    move the tools to another tree.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def fd(self) -> int:
        if self._fd is None:
            raise ToolError("the builtin-tools row was unloaded; its file tools are gone")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def workspace_root(ctx: Context, workspace: str) -> WorkspaceRoot:
    """The row's workspace descriptor holder, closed when the row is disposed."""
    root = WorkspaceRoot(workspace)
    ctx.effect(root.close, "builtin-tools workspace descriptor")
    return root


def read_file_tool(config: BuiltinToolsConfig, root: WorkspaceRoot) -> ToolDefinition:
    """Build ``read_file``: the text of one file (optionally a line range)."""
    limit_bytes = config.max_read_bytes
    holder, workspace = root, root.path

    def read_sync(parts: tuple[str, ...]) -> bytes:
        shown = _display_parts(parts)
        # Non-blocking: opening a FIFO or a device must not wait for a writer (or hang the
        # harness); the fstat below refuses anything that is not a regular file.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = open_beneath(holder.fd(), parts, flags)
        except FileNotFoundError:
            raise ToolError(f'file "{shown}" does not exist') from None
        except OSError as error:
            refused = _fence_error(error, shown, workspace)
            if refused is None:
                raise
            raise refused from None
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f'"{shown}" is a directory')
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(
                    f'"{shown}" is not a regular file (a FIFO, socket or device); read_file only '
                    "reads regular files"
                )
            if info.st_size > limit_bytes:
                raise ToolError(
                    f'"{shown}" is {info.st_size} bytes; read_file returns files up to '
                    f"{limit_bytes} bytes (use bash with head/sed for a part of a larger file)"
                )
            with os.fdopen(fd, "rb", closefd=False) as handle:
                return handle.read(limit_bytes + 1)
        finally:
            os.close(fd)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args["path"], workspace)
        offset = args.get("offset", 1)
        count = args.get("limit")
        if offset < 1:
            raise ToolError(f"invalid offset: expected a line number >= 1, got {offset}")
        if count is not None and count < 1:
            raise ToolError(f"invalid limit: expected a positive line count, got {count}")
        data = await anyio.to_thread.run_sync(read_sync, parts)
        if b"\0" in data[:8192]:
            raise ToolError(f'"{_display_parts(parts)}" looks like a binary file')
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


def _replace_in(dir_fd: int, name: str, data: bytes, shown: str, workspace: str) -> None:
    """Atomically replace ``name`` in the directory ``dir_fd``: temp file, fsync, rename.

    Every step is relative to ``dir_fd``; the temp file is created ``O_EXCL | O_NOFOLLOW``, and
    the rename replaces a directory entry, so no symlink is ever written through.
    """
    try:
        existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISLNK(existing.st_mode):
        raise FileFenceError(
            f'"{shown}" is a symbolic link; write_file does not follow links (a link can lead '
            f"outside the workspace {workspace})"
        )
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise ToolError(
            f'"{shown}" exists and is not a regular file; write_file replaces files only'
        )
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        temp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=dir_fd,
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
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def write_file_tool(config: BuiltinToolsConfig, root: WorkspaceRoot) -> ToolDefinition:
    """Build ``write_file``: replace (or create) one file atomically."""
    mode = config.sandbox
    holder, workspace = root, root.path

    def write_sync(parts: tuple[str, ...], data: bytes) -> None:
        shown = _display_parts(parts)
        if not parts:
            raise ToolError(f'"{shown}" is a directory')
        name = parts[-1]
        try:
            dir_fd = open_dirs_beneath(holder.fd(), parts[:-1], create=True)
        except OSError as error:
            refused = _fence_error(error, shown, workspace)
            if refused is None:
                raise
            raise refused from None
        try:
            _replace_in(dir_fd, name, data, shown, workspace)
        finally:
            os.close(dir_fd)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args["path"], workspace)
        if mode == "read-only":
            raise FileSandboxDeniedError(
                f"write_file is not allowed under read-only mode {denial_marker(mode)}"
            )
        data = str(args["content"]).encode("utf-8")
        await anyio.to_thread.run_sync(write_sync, parts, data)
        return {"path": _display_parts(parts), "bytes": len(data)}

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
