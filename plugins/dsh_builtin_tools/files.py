"""``read_file`` and ``write_file`` (and the helpers ``edit_file`` shares): in-process file
tools fenced to the workspace root.

The fence is descriptor-based (D20): the row holds a descriptor of
the workspace directory and every path is opened beneath it with
:mod:`dsh_host._tools.beneath` (``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``,
or an ``O_NOFOLLOW`` walk where the kernel lacks it). No symbolic link is
followed, wherever it points, and ``..`` is refused, so a process racing the
tool (swapping a directory for a symlink, say) cannot move a read or a write
out of the workspace. Files are opened non-blocking and only regular files are
used (a FIFO or a device is refused instead of hanging the harness).

``read_file`` scans the file once and returns a window of numbered lines
(``offset``/``limit``, at most ``readLimit`` lines, ``maxReadBytes`` bytes,
``readMaxLineLength`` characters a line) in DSH's envelope, ending with a footer
that says how many lines follow; a PNG, JPEG, GIF or WebP file (recognised by its
first bytes, at most 5 MiB) comes back as an envelope and the image itself (D31);
a NUL byte in the first 8 KiB of any other file refuses it as binary.

Writes go to a temporary file (``O_EXCL | O_NOFOLLOW``) in the target
directory's descriptor, given the replaced file's mode, and replace the target
with a rename relative to the same descriptor after an ``fsync`` (then the
directory is fsynced), so a crash leaves the old or the new content, never a
torn file; the previous content's sha256 goes to the result's meta.

``write_file`` honours the row's sandbox mode like the bash sandbox does:
under ``read-only`` it refuses with the sandbox denial marker. It never
writes outside the workspace, whatever the mode (``danger-full-access``
widens ``bash`` only).

The filesystem calls run on a worker thread, so a slow disk does not stall
the event loop.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import anyio.to_thread

from dsh_host.sdk import (
    MAX_IMAGE_BYTES,
    AttachmentError,
    BeneathPathError,
    ContentBlock,
    Context,
    ImageBlock,
    SandboxPolicy,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolOutput,
    beneath_parts,
    image_block,
    image_media_type,
    offload,
    open_beneath,
    open_dirs_beneath,
    read_only_cover,
)

from .bash import denial_marker
from .config import BuiltinToolsConfig
from .spill import SpillArea

__all__ = [
    "BINARY_SNIFF_BYTES",
    "READ_FLAGS",
    "FileChangedError",
    "FileFenceError",
    "FileSandboxDeniedError",
    "PolicyOf",
    "ProtectedPathError",
    "WorkspaceRoot",
    "advise_outside",
    "binary_refusal",
    "display_parts",
    "fence_refusal",
    "fenced_parts",
    "open_regular",
    "open_regular_in",
    "read_file_tool",
    "read_window",
    "refuse_protected",
    "refuse_read_only",
    "render_window",
    "replace_in",
    "resolve_in_workspace",
    "target_dir",
    "workspace_parts",
    "workspace_root",
    "write_file_tool",
    "write_meta",
]


class FileFenceError(ToolError):
    """A path resolves outside the workspace root (``FS_OUTSIDE_WORKSPACE``)."""

    code = "FS_OUTSIDE_WORKSPACE"


class FileSandboxDeniedError(ToolError):
    """The row's sandbox mode does not allow this file effect (``FS_SANDBOX_DENIED``)."""

    code = "FS_SANDBOX_DENIED"


def read_parameters(max_lines: int) -> dict[str, Any]:
    """``read_file``'s schema; ``limit`` advertises the row's line cap as its default."""
    return {
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
                "description": f"How many lines to return. Defaults to (and at most) {max_lines}.",
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
        "create_parents": {
            "type": "boolean",
            "description": "Create missing parent directories. Defaults to false.",
        },
    },
    "required": ["path", "content"],
}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_in_workspace(path: str, root: str) -> str:
    """The canonical absolute path of ``path`` (relative to ``root``), fenced to ``root``.

    Advisory only (it names where a path points, for messages): the tools themselves open
    through :func:`workspace_parts` and :mod:`dsh_host._tools.beneath`, which a concurrent
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
    parts = fenced_parts(path, root)
    advise_outside(path, root)
    return parts


def fenced_parts(path: Any, root: str) -> tuple[str, ...]:
    """:func:`workspace_parts` without the advisory resolution: the lexical check only. A tool
    that opens through :mod:`dsh_host._tools.beneath` (which follows no link) and calls
    :func:`advise_outside` when that open is refused gives the same answers without resolving
    the path on every call (``read_file``, every step: docs/decisions.md D49)."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise FileFenceError("invalid path: expected a non-empty string without NUL bytes")
    try:
        return beneath_parts(path, root)
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


def advise_outside(path: str, root: str) -> None:
    """Raise the advisory ``resolves to ..., which is outside the workspace`` error when
    ``path`` (already through :func:`fenced_parts`) resolves outside ``root``; else nothing."""
    try:
        resolve_in_workspace(path, root)
    except OSError:
        pass  # a component changed under realpath; the descriptor-based open decides


def display_parts(parts: tuple[str, ...]) -> str:
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


#: The policy of one call of a file tool under the row's mode (``policy.tool_policy``).
PolicyOf: TypeAlias = Callable[[ToolExecution], Awaitable[SandboxPolicy]]

#: How much of the start of a file is sniffed for a NUL byte (git's heuristic, 8000 bytes).
BINARY_SNIFF_BYTES: Final = 8192
_CHUNK: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class ReadWindow:
    """One ``read_file`` window: the numbered lines kept and what the rest of the file holds.

    ``complete`` is False when the scan stopped at its byte budget before the end of the file:
    ``total`` is then the number of lines counted so far, a lower bound.
    """

    offset: int
    lines: tuple[tuple[int, str], ...]
    total: int
    capped: bool
    complete: bool = True
    scanned: int = 0


def binary_refusal(shown: str, head: bytes, tool: str = "read_file") -> ToolError | None:
    """The refusal for a file whose first bytes hold a NUL (git's binary heuristic), or None."""
    at = head.find(b"\0", 0, BINARY_SNIFF_BYTES)
    if at < 0:
        return None
    return ToolError(
        f'"{shown}" looks like a binary file (a NUL byte at offset {at}); {tool} only handles '
        "text files (use bash, e.g. `file` or `xxd`, to inspect it)"
    )


def read_window(
    fd: int,
    shown: str,
    *,
    offset: int,
    limit: int,
    max_line: int,
    max_bytes: int,
    max_scan: int,
) -> ReadWindow:
    """Scan the open file ``fd`` once: keep lines ``offset``.. (at most ``limit`` of them, each cut
    to ``max_line`` characters, at most ``max_bytes`` in all) and count the lines.

    Reads at most ``max_scan`` bytes: a file can be far larger than anything a window needs (a
    sparse file of 15 TiB reads as zeros to its end), and the read runs on a worker thread the
    call's cancellation cannot stop, so it must end by itself. Once the window is full the rest
    is only counted (newlines in the raw bytes, no decoding). A line buffer never grows past
    ``max_line + 1`` characters, so one huge line cannot blow up memory. Raises the binary
    refusal when the first bytes hold a NUL.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    kept: list[tuple[int, str]] = []
    total = used = scanned = 0
    capped = False
    buffer: list[str] = []
    buffered = 0
    first = True
    counting = False  # the window is full: only count the newlines of the rest
    partial = False  # bytes after the last newline (a last line without one)

    def consume(raw: str) -> None:
        nonlocal total, used, capped
        total += 1
        if capped or total < offset or len(kept) >= limit:
            return
        text = raw[:-1] if raw.endswith("\r") else raw
        if len(text) > max_line:
            text = f"{text[:max_line]}... (line truncated to {max_line} chars)"
        size = len(text.encode("utf-8", "replace")) + 1
        if kept and used + size > max_bytes:
            capped = True
            return
        used += size
        kept.append((total, text))

    def take(piece: str) -> None:
        nonlocal buffered
        room = max_line + 1 - buffered
        if room > 0 and piece:
            buffer.append(piece[:room])
        buffered += len(piece)

    complete = True
    while True:
        if scanned >= max_scan:
            complete = False
            break
        chunk = os.read(fd, min(_CHUNK, max_scan - scanned))
        scanned += len(chunk)
        if first:
            refusal = binary_refusal(shown, chunk)
            if refusal is not None:
                raise refusal
            first = False
        if counting:
            if not chunk:
                break
            total += chunk.count(b"\n")
            partial = not chunk.endswith(b"\n")
            continue
        text = decoder.decode(chunk, final=not chunk)
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            take(text[start:newline])
            consume("".join(buffer))
            buffer, buffered = [], 0
            start = newline + 1
        take(text[start:])
        if not chunk:
            break
        if capped or len(kept) >= limit:
            counting, partial = True, buffered > 0
    if counting:
        total += 1 if partial else 0
    elif buffered:
        consume("".join(buffer))
    if offset > max(total, 1):
        if not complete:
            raise ToolError(
                f'offset {offset} is past the first {max_scan} bytes of "{shown}" ({total} '
                "lines), which is as far as read_file reads; use bash for a file this large "
                f"(e.g. `sed -n '{offset},{offset + 99}p' FILE` or `tail -n 100 FILE`)"
            )
        raise ToolError(f'offset {offset} is out of range for "{shown}" ({total} lines)')
    return ReadWindow(
        offset=offset,
        lines=tuple(kept),
        total=total,
        capped=capped,
        complete=complete,
        scanned=scanned,
    )


def render_window(shown: str, window: ReadWindow, max_bytes: int) -> str:
    """The model view of a window: DSH's envelope, ``<n>: <text>`` lines and one footer."""
    body = "".join(f"{number}: {text}\n" for number, text in window.lines)
    last = window.lines[-1][0] if window.lines else window.offset - 1
    more = window.total - last
    if not window.complete:
        lead = f"Output truncated at {max_bytes} bytes: showing" if window.capped else "Showing"
        footer = (
            f"({lead} lines {window.offset}-{last}; the file goes on past the {window.scanned} "
            f"bytes read_file reads ({window.total} lines so far). Use offset={last + 1} to "
            "continue, or bash for the far end of a file this large.)"
        )
    elif more > 0:
        plural = "s" if more != 1 else ""
        showing = f"lines {window.offset}-{last} of {window.total}, {more} more line{plural}"
        lead = f"Output truncated at {max_bytes} bytes: showing" if window.capped else "Showing"
        footer = f"({lead} {showing}. Use offset={last + 1} to continue.)"
    else:
        footer = f"(End of file - total {window.total} lines)"
    return f"<path>{shown}</path>\n<type>file</type>\n<content>\n{body}\n{footer}\n</content>"


def open_regular(open_fd: Callable[[], int], shown: str, workspace: str, tool: str) -> int:
    """Open with ``open_fd`` and keep the descriptor only if it is a regular file."""
    try:
        fd = open_fd()
    except FileNotFoundError:
        raise ToolError(f'file "{shown}" does not exist') from None
    except OSError as error:
        refused = _fence_error(error, shown, workspace)
        if refused is None:
            raise
        raise refused from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ToolError(f'"{shown}" is a directory')
        if not stat.S_ISREG(mode):
            raise ToolError(
                f'"{shown}" is not a regular file (a FIFO, socket or device); {tool} only '
                "reads regular files"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


#: Non-blocking: opening a FIFO or a device must not wait for a writer (or hang the harness);
#: :func:`open_regular` then refuses anything that is not a regular file.
READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


def open_regular_in(dir_fd: int, name: str, shown: str, workspace: str, tool: str) -> int:
    """Open the entry ``name`` of the directory ``dir_fd`` for reading, without following it
    and without blocking, and keep it only if it is a regular file (see :func:`open_regular`)."""
    return open_regular(
        lambda: os.open(name, READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd),
        shown,
        workspace,
        tool,
    )


def read_file_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, spill: SpillArea
) -> ToolDefinition:
    """Build ``read_file``: a line-numbered window of one text file of the workspace, or of a
    file of the row's spill area named by the absolute path a truncation notice printed."""
    max_bytes, max_lines, max_line = (
        config.max_read_bytes,
        config.read_limit,
        config.read_max_line_length,
    )
    holder, workspace = root, root.path
    reads = offload.QuickLane()  # this row's reads: inline once measured quick (D43)

    def window_of(fd: int, shown: str, offset: int, limit: int) -> Any:
        try:
            head = os.pread(fd, _IMAGE_SNIFF_BYTES, 0)
            if image_media_type(head) is not None:
                return read_image(fd, shown)
            window = read_window(
                fd,
                shown,
                offset=offset,
                limit=limit,
                max_line=max_line,
                max_bytes=max_bytes,
                max_scan=config.max_scan_bytes,
            )
        finally:
            os.close(fd)
        return render_window(shown, window, max_bytes)

    def read_sync(path: Any, offset: int, limit: int) -> Any:
        spilled = spill.locate(path) if isinstance(path, str) else None
        if spilled is not None:
            dir_fd, name = spilled
            fd = open_regular_in(dir_fd, name, path, workspace, "read_file")
            return window_of(fd, path, offset, limit)
        parts = fenced_parts(path, workspace)
        shown = display_parts(parts)
        try:
            fd = open_regular(
                lambda: open_beneath(holder.fd(), parts, READ_FLAGS), shown, workspace, "read_file"
            )
        except (ToolError, OSError):
            # A path that resolves outside gets that message first, as from workspace_parts;
            # an open that succeeded went through no link, so the path is beneath the root
            # and needs no resolution (D49).
            advise_outside(path, workspace)
            raise
        return window_of(fd, shown, offset, limit)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        offset = args.get("offset", 1)
        count = args.get("limit", max_lines)
        if offset < 1:
            raise ToolError(f"invalid offset: expected a line number >= 1, got {offset}")
        if count < 1:
            raise ToolError(f"invalid limit: expected a positive line count, got {count}")
        if count > max_lines:
            raise ToolError(f"limit must be less than or equal to {max_lines}")
        # read_file is the tool a long session calls most: once its reads are measured quick
        # they run on the event loop, a slow one sends the next to a worker thread
        # (docs/decisions.md D43); either way never abandoned when cancelled.
        return await reads.run(read_sync, args["path"], int(offset), int(count))

    return ToolDefinition(
        name="read_file",
        description=(
            "Read a UTF-8 text file inside the workspace. The result numbers every line "
            "(`<n>: <text>`) and ends with a footer saying whether more lines follow; use "
            f"`offset` (1-based) and `limit` (at most {max_lines} lines) to page through a large "
            "file, or through the saved full output a truncated tool result names. A PNG, "
            "JPEG, GIF or WebP image is returned as the image itself. Other binary files "
            "and paths outside the workspace are refused."
        ),
        parameters=read_parameters(max_lines),
        execute=execute,
        output=ToolOutput(render=_render_read),
        is_concurrency_safe=lambda args: True,
        read_only=True,  # D27: a fork ledger or a replay may run it again
    )


#: enough of a file's first bytes to recognise an image (a WebP's signature ends at byte 12)
_IMAGE_SNIFF_BYTES: Final = 16


def read_image(fd: int, shown: str) -> dict[str, Any]:
    """The value of ``read_file`` on an image: its path and attachment record (D31)."""
    size = os.fstat(fd).st_size
    if size > MAX_IMAGE_BYTES:
        raise ToolError(
            f'"{shown}" is an image of {size} bytes, over the {MAX_IMAGE_BYTES} bytes read_file '
            "sends to the model; make a smaller copy (e.g. with bash: `convert IN -resize "
            "1024x1024 OUT.png`) and read that"
        )
    raw = os.pread(fd, MAX_IMAGE_BYTES + 1, 0)
    try:
        block = image_block(raw, os.path.basename(shown), shown=shown)
    except AttachmentError as exc:  # grew past the limit since fstat
        raise ToolError(str(exc)) from None
    return {"path": shown, "image": block.attachment}


def _render_read(_args: Any, value: Any) -> list[ContentBlock]:
    """A text window as its text; an image as DSH's envelope, then the image itself."""
    if isinstance(value, str):
        return [TextBlock(text=value)]
    record = value["image"]
    envelope = (
        f"<path>{value['path']}</path>\n<type>image</type>\n<content>\n"
        f"{record['mediaType']}, {record['bytes']} bytes (the image follows)\n</content>"
    )
    return [TextBlock(text=envelope), ImageBlock(attachment=record)]


def _render_write(_args: Any, value: Any) -> list[ContentBlock]:
    return [TextBlock(text=f"Wrote {value['bytes']} bytes to {value['path']}")]


def write_meta(_args: Any, value: Any) -> dict[str, Any]:
    """The durable record of a write (``tool/result`` meta): what the file held before."""
    return {
        "path": value["path"],
        "operation": value["operation"],
        "previousSha256": value["previousSha256"],
        "sha256": value["sha256"],
    }


def fence_refusal(error: OSError, shown: str, workspace: str) -> BaseException:
    refused = _fence_error(error, shown, workspace)
    return error if refused is None else refused


def _digest_of(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _existing_in(dir_fd: int, name: str, shown: str, workspace: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in ``dir_fd``: None when absent; a symlink or a non-file refused."""
    try:
        existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(existing.st_mode):
        raise FileFenceError(
            f'"{shown}" is a symbolic link; the file tools do not follow links (a link can lead '
            f"outside the workspace {workspace})"
        )
    if not stat.S_ISREG(existing.st_mode):
        raise ToolError(
            f'"{shown}" exists and is not a regular file; the file tools replace files only'
        )
    return existing


def current_digest(dir_fd: int, name: str, shown: str, workspace: str) -> str | None:
    """The sha256 of ``name``'s content in ``dir_fd`` (None when absent), opened without
    following a link and non-blocking."""
    if _existing_in(dir_fd, name, shown, workspace) is None:
        return None
    fd = open_regular_in(dir_fd, name, shown, workspace, "the file tools")
    try:
        return _digest_of(fd)
    finally:
        os.close(fd)


class FileChangedError(ToolError):
    """The file changed on disk while an edit was being prepared (``FS_CHANGED``)."""

    code = "FS_CHANGED"


def replace_in(
    dir_fd: int,
    name: str,
    data: bytes,
    shown: str,
    workspace: str,
    *,
    expected: str | None = None,
) -> str | None:
    """Atomically replace ``name`` in the directory ``dir_fd``: temp file, fsync, rename, fsync
    of the directory. Returns the previous content's sha256 (None when the file was created).

    Every step is relative to ``dir_fd``; the temp file is created ``O_EXCL | O_NOFOLLOW`` and
    given the replaced file's permission bits (and owner, where allowed), and the rename replaces
    a directory entry, so no symlink is ever written through. With ``expected`` (an edit), the
    target is hashed again just before the rename and a change since it was read aborts.
    """
    existing = _existing_in(dir_fd, name, shown, workspace)
    previous = current_digest(dir_fd, name, shown, workspace) if existing is not None else None
    if expected is not None and previous != expected:
        raise FileChangedError(
            f'"{shown}" changed while it was being edited; read it again and retry'
        )
    temp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(
        temp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=dir_fd,
    )
    try:
        try:
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                with contextlib.suppress(OSError):
                    os.fchown(fd, existing.st_uid, existing.st_gid)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if expected is not None and current_digest(dir_fd, name, shown, workspace) != expected:
            raise FileChangedError(
                f'"{shown}" changed while it was being edited; read it again and retry'
            )
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)
    return previous


class ProtectedPathError(ToolError):
    """A write into one of the call policy's read-only paths (``FS_PROTECTED_PATH``)."""

    code = "FS_PROTECTED_PATH"


def refuse_protected(policy: SandboxPolicy, parts: tuple[str, ...], tool: str) -> None:
    """Refuse a write to ``parts`` (beneath the workspace) that the call's policy forbids: any
    write under ``read-only``, and a write into a protected path (``.git``, ``.dsh``,
    ``dsh.yml``, a virtualenv: :attr:`~dsh_host._sandbox.SandboxPolicy.read_only_paths`), which a
    confined ``bash`` call of the same policy sees read-only too."""
    refuse_read_only(policy.mode, tool)
    cover = read_only_cover(policy, os.path.join(policy.workspace_root, *parts))
    if cover is None:
        return
    shown = display_parts(parts)
    where = os.path.relpath(cover, policy.workspace_root)
    raise ProtectedPathError(
        f'{tool} may not write "{shown}": it is inside the protected path "{where}" of the '
        "workspace (git metadata, the harness's own configuration and state, and virtualenvs "
        "hold code that runs later outside the sandbox, so tools get them read-only, bash "
        "included). Write somewhere else, or ask the user to make this change."
    )


def target_dir(
    holder: WorkspaceRoot,
    parts: tuple[str, ...],
    workspace: str,
    *,
    create: bool,
    policy: SandboxPolicy,
    tool: str,
) -> int:
    """The descriptor of the directory holding ``parts[-1]``, resolved beneath the workspace,
    for a write the call's ``policy`` allows (:func:`refuse_protected`, checked before any
    missing parent is created). Every writing file tool gets its directory here."""
    shown = display_parts(parts)
    if not parts:
        raise ToolError(f'"{shown}" is a directory')
    refuse_protected(policy, parts, tool)
    try:
        return open_dirs_beneath(holder.fd(), parts[:-1], create=create)
    except FileNotFoundError:
        parent = display_parts(parts[:-1])
        raise ToolError(
            f'the parent directory "{parent}" of "{shown}" does not exist; pass '
            "create_parents: true to create it"
        ) from None
    except OSError as error:
        raise fence_refusal(error, shown, workspace) from None


def refuse_read_only(mode: str, tool: str) -> None:
    """Refuse a file effect under ``read-only`` with the sandbox denial marker."""
    if mode == "read-only":
        raise FileSandboxDeniedError(
            f"{tool} is not allowed under read-only mode {denial_marker(mode)}"
        )


#: A sha256 hex digest, or null for a file that did not exist.
DIGEST_OR_NULL: Final = {"oneOf": [{"type": "string"}, {"type": "null"}]}


def write_file_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, workspace_policy: PolicyOf
) -> ToolDefinition:
    """Build ``write_file``: replace (or create) one file atomically."""
    holder, workspace = root, root.path

    def write_sync(
        parts: tuple[str, ...], data: bytes, create: bool, policy: SandboxPolicy
    ) -> str | None:
        dir_fd = target_dir(
            holder, parts, workspace, create=create, policy=policy, tool="write_file"
        )
        try:
            return replace_in(dir_fd, parts[-1], data, display_parts(parts), workspace)
        finally:
            os.close(dir_fd)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args["path"], workspace)
        policy = await workspace_policy(exec)
        data = str(args["content"]).encode("utf-8")
        create = bool(args.get("create_parents", False))
        previous = await anyio.to_thread.run_sync(write_sync, parts, data, create, policy)
        return {
            "path": display_parts(parts),
            "bytes": len(data),
            "operation": "create" if previous is None else "update",
            "previousSha256": previous,
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    return ToolDefinition(
        name="write_file",
        description=(
            "Write a UTF-8 text file inside the workspace, replacing it if it exists (prefer "
            "edit_file for a targeted change). Missing parent directories are created only with "
            "`create_parents: true`. The write is atomic (the file has the old or the new "
            "content, never a mix). Paths outside the workspace are refused."
        ),
        parameters=WRITE_PARAMETERS,
        execute=execute,
        output=ToolOutput(
            schema={
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "bytes": {"type": "integer"},
                    "operation": {"type": "string", "enum": ["create", "update"]},
                    "previousSha256": DIGEST_OR_NULL,
                    "sha256": {"type": "string"},
                },
                "required": ["path", "bytes", "operation", "previousSha256", "sha256"],
            },
            render=_render_write,
            presentation_meta=write_meta,
        ),
    )
