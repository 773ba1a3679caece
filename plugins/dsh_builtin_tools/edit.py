"""``edit_file``: exact string replacement in one text file, written atomically.

The file is opened beneath the workspace descriptor like every file tool (no link followed, no
``..``, regular files only, non-blocking), read whole (up to ``maxEditBytes``), and the literal
``old_string`` must occur exactly once unless ``replace_all`` is set: zero or several matches are
refused with the count, so the model never edits the wrong place. The new content replaces the
file through :func:`~dsh_builtin_tools.files.replace_in` (temp file in the same directory,
fsync, rename, directory fsync; the file's permission bits kept), which hashes the file again
just before the rename and aborts if it changed since it was read. The result is a short
confirmation and a small unified diff; the previous and new content digests go to the durable
``tool/result`` meta.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from typing import Any, Final

import anyio.to_thread

from dsh_host.sdk import (
    ContentBlock,
    SandboxPolicy,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolOutput,
)

from .config import BuiltinToolsConfig
from .files import (
    PolicyOf,
    WorkspaceRoot,
    binary_refusal,
    display_parts,
    open_regular_in,
    replace_in,
    target_dir,
    workspace_parts,
    write_meta,
)

__all__ = ["EditMatchError", "edit_file_tool", "small_diff"]

#: The diff shown to the model keeps at most this many lines (the rest is counted).
DIFF_MAX_LINES: Final = 60
#: And at most this many characters per diff line.
DIFF_MAX_LINE_CHARS: Final = 400


class EditMatchError(ToolError):
    """``old_string`` matched zero times, or several times without ``replace_all``."""

    code = "FS_EDIT_MATCH"


EDIT_PARAMETERS: Final = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "File to edit; a relative path is resolved against the workspace.",
        },
        "old_string": {
            "type": "string",
            "description": (
                "The exact text to replace, including whitespace and indentation (without the "
                "line-number prefix read_file shows). It must occur exactly once unless "
                "replace_all is true."
            ),
        },
        "new_string": {"type": "string", "description": "The text to put in its place."},
        "replace_all": {
            "type": "boolean",
            "description": "Replace every occurrence instead of exactly one. Defaults to false.",
        },
    },
    "required": ["path", "old_string", "new_string"],
}


def small_diff(shown: str, before: str, after: str) -> str:
    """A unified diff (3 lines of context) of ``before`` → ``after``, capped for the model."""
    lines = list(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            fromfile=f"a/{shown}",
            tofile=f"b/{shown}",
            lineterm="",
        )
    )
    kept = [
        line if len(line) <= DIFF_MAX_LINE_CHARS else f"{line[:DIFF_MAX_LINE_CHARS]}..."
        for line in lines[:DIFF_MAX_LINES]
    ]
    if len(lines) > DIFF_MAX_LINES:
        kept.append(f"... (diff truncated, {len(lines) - DIFF_MAX_LINES} more lines)")
    return "\n".join(kept)


def _render_edit(_args: Any, value: Any) -> list[ContentBlock]:
    path, count = value["path"], value["replacements"]
    if value["replaceAll"]:
        head = (
            f"The file {path} has been updated. All occurrences were successfully replaced "
            f"({count})."
        )
    else:
        head = f"The file {path} has been updated successfully."
    return [TextBlock(text=f"{head}\n{value['diff']}" if value["diff"] else head)]


def edit_file_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, workspace_policy: PolicyOf
) -> ToolDefinition:
    """Build ``edit_file``: replace ``old_string`` by ``new_string`` in one file, atomically."""
    max_bytes = config.max_edit_bytes
    holder, workspace = root, root.path

    def edit_sync(
        parts: tuple[str, ...], old: str, new: str, every: bool, policy: SandboxPolicy
    ) -> dict[str, Any]:
        shown = display_parts(parts)
        dir_fd = target_dir(holder, parts, workspace, create=False, policy=policy, tool="edit_file")
        try:
            name = parts[-1]
            fd = open_regular_in(dir_fd, name, shown, workspace, "edit_file")
            try:
                size = os.fstat(fd).st_size
                if size > max_bytes:
                    raise ToolError(
                        f'"{shown}" is {size} bytes; edit_file edits files up to {max_bytes} '
                        "bytes (maxEditBytes)"
                    )
                with os.fdopen(fd, "rb", closefd=False) as handle:
                    data = handle.read(max_bytes + 1)
            finally:
                os.close(fd)
            refusal = binary_refusal(shown, data, "edit_file")
            if refusal is not None:
                raise refusal
            try:
                before = data.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ToolError(
                    f'"{shown}" is not valid UTF-8 (at byte {error.start}); edit_file only edits '
                    "UTF-8 text files"
                ) from None
            count = before.count(old)
            if count == 0:
                raise EditMatchError(
                    f'old_string was not found in "{shown}" (0 matches); it must match the file '
                    "exactly, including whitespace and indentation; read the file again and copy "
                    "the text"
                )
            if count > 1 and not every:
                raise EditMatchError(
                    f'old_string matches {count} times in "{shown}"; provide a longer old_string '
                    "that matches exactly once, or set replace_all to true"
                )
            after = before.replace(old, new)
            encoded = after.encode("utf-8")
            previous = replace_in(
                dir_fd, name, encoded, shown, workspace, expected=hashlib.sha256(data).hexdigest()
            )
        finally:
            os.close(dir_fd)
        return {
            "path": shown,
            "operation": "update",
            "replacements": count,
            "replaceAll": every,
            "previousSha256": previous,
            "sha256": hashlib.sha256(encoded).hexdigest(),
            "diff": small_diff(shown, before, after),
        }

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args["path"], workspace)
        policy = await workspace_policy(exec)
        old, new = args["old_string"], args["new_string"]
        if not old:
            raise ToolError("old_string must be a non-empty string")
        if old == new:
            raise ToolError("old_string and new_string must differ")
        every = bool(args.get("replace_all", False))
        return await anyio.to_thread.run_sync(edit_sync, parts, old, new, every, policy)

    return ToolDefinition(
        name="edit_file",
        description=(
            "Edit a UTF-8 text file inside the workspace by exact string replacement: "
            "`old_string` (copied literally from the file, without read_file's line-number "
            "prefix) is replaced by `new_string`. By default old_string must occur exactly once; "
            "if it occurs several times, give more surrounding context or set `replace_all`. The "
            "write is atomic and the result shows a short diff. Read the file first."
        ),
        parameters=EDIT_PARAMETERS,
        execute=execute,
        output=ToolOutput(
            schema={
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "operation": {"type": "string"},
                    "replacements": {"type": "integer"},
                    "replaceAll": {"type": "boolean"},
                    "previousSha256": {"type": "string"},
                    "sha256": {"type": "string"},
                    "diff": {"type": "string"},
                },
                "required": [
                    "path",
                    "operation",
                    "replacements",
                    "replaceAll",
                    "previousSha256",
                    "sha256",
                    "diff",
                ],
            },
            render=_render_edit,
            presentation_meta=write_meta,
        ),
    )
