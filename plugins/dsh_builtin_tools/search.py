"""``glob`` and ``grep``: find files and lines in the workspace, honouring ``.gitignore``.

The walk is descriptor-based like the other file tools: :func:`os.fwalk` from the workspace
descriptor (or a directory opened beneath it), never following a symbolic link (a link is
neither listed nor entered), so a racing process cannot move a search outside the workspace.
``.git`` is never entered; each directory's ``.gitignore`` (read with ``O_NOFOLLOW``,
non-blocking, regular files only) is parsed by ``pathspec``'s gitignore semantics and applies to
the paths beneath that directory. Results are sorted (paths, then line numbers) and capped; a
cap says how many more there were.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from typing import Any, Final, TypeAlias

import anyio.to_thread
import pathspec

from dsh_host.tools import ToolDefinition, ToolError, ToolExecution, text_output
from dsh_host.tools.beneath import open_dirs_beneath

from .config import BuiltinToolsConfig
from .files import (
    BINARY_SNIFF_BYTES,
    READ_FLAGS,
    WorkspaceRoot,
    display_parts,
    fence_refusal,
    workspace_parts,
)

__all__ = ["glob_tool", "grep_tool", "walk_files"]

#: Characters kept of one matching line.
MAX_LINE_CHARS: Final = 300
#: Files larger than this are not searched by ``grep`` (counted in the footer).
MAX_GREP_FILE_BYTES: Final = 4_000_000
#: Most directory entries one walk visits.
MAX_ENTRIES: Final = 200_000
_IGNORE_FILE_BYTES: Final = 1_000_000


def _read_ignore(dir_fd: int) -> list[str]:
    try:
        fd = os.open(".gitignore", READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        return os.read(fd, _IGNORE_FILE_BYTES).decode("utf-8", "replace").splitlines()
    finally:
        os.close(fd)


Specs: TypeAlias = list[tuple[tuple[str, ...], "pathspec.PathSpec[Any]"]]


def _ignored(specs: Specs, path: tuple[str, ...], is_dir: bool) -> bool:
    """Whether a ``.gitignore`` of an ancestor directory (``where``) ignores ``path``."""
    for where, spec in specs:
        relative = "/".join(path[len(where) :]) + ("/" if is_dir else "")
        if spec.match_file(relative):
            return True
    return False


def walk_files(top_fd: int, base: tuple[str, ...]) -> Iterator[tuple[str, int]]:
    """``(workspace-relative path, directory fd)`` of every regular file beneath ``top_fd``
    (whose workspace path is ``base``) that no ``.gitignore`` ignores, in sorted order. The
    descriptor is valid only until the next item."""
    specs: Specs = []
    seen = 0
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
        here = base + tuple(p for p in dirpath.split(os.sep) if p not in ("", "."))
        specs = [(where, spec) for where, spec in specs if here[: len(where)] == where]
        lines = _read_ignore(dir_fd)
        if lines:
            specs.append((here, pathspec.GitIgnoreSpec.from_lines(lines)))
        kept = sorted(d for d in dirnames if d != ".git" and not _ignored(specs, (*here, d), True))
        dirnames[:] = kept
        for name in sorted(filenames):
            seen += 1
            if seen > MAX_ENTRIES:
                raise ToolError(
                    f"the search visited more than {MAX_ENTRIES} entries; search a narrower path"
                )
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and not _ignored(specs, (*here, name), False):
                yield "/".join((*here, name)), dir_fd


def _open_top(holder: WorkspaceRoot, parts: tuple[str, ...], workspace: str) -> int:
    shown = display_parts(parts)
    try:
        return open_dirs_beneath(holder.fd(), parts, create=False)
    except FileNotFoundError:
        raise ToolError(f'directory "{shown}" does not exist') from None
    except OSError as error:
        raise fence_refusal(error, shown, workspace) from None


def _more(count: int, cap: int, what: str, hint: str) -> str:
    return f"\n({count - cap} more {what} not shown; {hint})" if count > cap else ""


PATH_PROPERTY: Final = {
    "type": "string",
    "description": "Directory to search, relative to the workspace. Defaults to the workspace.",
}


def glob_tool(config: BuiltinToolsConfig, root: WorkspaceRoot) -> ToolDefinition:
    """Build ``glob``: the workspace files matching a gitignore-style pattern, sorted."""
    holder, workspace = root, root.path

    def glob_sync(parts: tuple[str, ...], pattern: str) -> str:
        spec = pathspec.GitIgnoreSpec.from_lines([pattern])
        top = _open_top(holder, parts, workspace)
        try:
            found = [
                path
                for path, _fd in walk_files(top, parts)
                if spec.match_file(path[len("/".join(parts)) + 1 :] if parts else path)
            ]
        finally:
            os.close(top)
        cap = config.max_search_results
        if not found:
            return f'No files match "{pattern}".'
        return "\n".join(found[:cap]) + _more(len(found), cap, "files", "narrow the pattern")

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args.get("path", "."), workspace)
        pattern = args["pattern"]
        if not pattern.strip():
            raise ToolError("pattern must be a non-empty string")
        return await anyio.to_thread.run_sync(glob_sync, parts, pattern)

    return ToolDefinition(
        name="glob",
        description=(
            "List the files in the workspace whose path matches a glob pattern (gitignore "
            "syntax: `*.py` matches at any depth, `src/**/*.ts` under src), sorted, at most "
            f"{config.max_search_results}. Files ignored by .gitignore and the .git directory are "
            "skipped; symbolic links are not followed."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "The glob pattern."},
                "path": PATH_PROPERTY,
            },
            "required": ["pattern"],
        },
        execute=execute,
        output=text_output(),
        is_concurrency_safe=lambda args: True,
    )


def grep_tool(config: BuiltinToolsConfig, root: WorkspaceRoot) -> ToolDefinition:
    """Build ``grep``: lines matching a regular expression, as ``path:line: text``, sorted."""
    holder, workspace = root, root.path

    def grep_sync(
        parts: tuple[str, ...], regex: re.Pattern[str], files: pathspec.PathSpec[Any] | None
    ) -> str:
        cap = config.max_search_results
        hits: list[str] = []
        total = skipped = 0
        top = _open_top(holder, parts, workspace)
        prefix = len("/".join(parts)) + 1 if parts else 0
        try:
            for path, dir_fd in walk_files(top, parts):
                if files is not None and not files.match_file(path[prefix:]):
                    continue
                name = path.rsplit("/", 1)[-1]
                try:
                    fd = os.open(name, READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    info = os.fstat(fd)
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    if info.st_size > MAX_GREP_FILE_BYTES:
                        skipped += 1
                        continue
                    with os.fdopen(fd, "rb", closefd=False) as handle:
                        data = handle.read(MAX_GREP_FILE_BYTES + 1)
                finally:
                    os.close(fd)
                if b"\0" in data[:BINARY_SNIFF_BYTES]:
                    continue
                for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                    if regex.search(line):
                        total += 1
                        if len(hits) < cap:
                            if len(line) > MAX_LINE_CHARS:
                                line = f"{line[:MAX_LINE_CHARS]}..."
                            hits.append(f"{path}:{number}: {line}")
        finally:
            os.close(top)
        note = (
            f"\n({skipped} files larger than {MAX_GREP_FILE_BYTES} bytes not searched)"
            if skipped
            else ""
        )
        if not hits:
            return f'No lines match "{regex.pattern}".{note}'
        more = _more(total, cap, "matching lines", "narrow the pattern or the path")
        return "\n".join(hits) + more + note

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args.get("path", "."), workspace)
        pattern = args["pattern"]
        if not pattern:
            raise ToolError("pattern must be a non-empty string")
        try:
            regex = re.compile(pattern, re.IGNORECASE if args.get("ignore_case") else 0)
        except re.error as error:
            raise ToolError(
                f"invalid pattern: {error} (a Python regular expression; escape literal "
                "characters like ( or [ with a backslash)"
            ) from None
        glob = args.get("glob")
        files = pathspec.GitIgnoreSpec.from_lines([glob]) if glob else None
        return await anyio.to_thread.run_sync(grep_sync, parts, regex, files)

    return ToolDefinition(
        name="grep",
        description=(
            "Search the text files of the workspace for a regular expression (Python syntax) "
            "and return the matching lines as `path:line: text`, sorted by path and line, at "
            f"most {config.max_search_results}. `glob` limits the files (e.g. `*.py`); files "
            "ignored by .gitignore, the .git directory and binary files are skipped; symbolic "
            "links are not followed."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "The regular expression."},
                "path": PATH_PROPERTY,
                "glob": {
                    "type": "string",
                    "description": "Only search files matching this glob pattern.",
                },
                "ignore_case": {
                    "type": "boolean",
                    "description": "Match case-insensitively. Defaults to false.",
                },
            },
            "required": ["pattern"],
        },
        execute=execute,
        output=text_output(),
        is_concurrency_safe=lambda args: True,
    )
