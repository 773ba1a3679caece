"""``list_dir``: a directory of the workspace as an indented tree, to a depth limit.

The walk is descriptor-based like ``glob``/``grep`` (each directory opened ``O_NOFOLLOW`` relative
to its parent's descriptor, starting beneath the workspace descriptor) and honours the same
ignores: ``.git`` is skipped and every ``.gitignore`` from the workspace down applies. Entries
are sorted by name; a directory ends with ``/``, a symbolic link with ``@`` (listed, never
entered), and a directory at the depth limit says how many entries it holds.

At most ``maxSearchResults`` entries are shown, chosen **breadth-first**: the directory's own
entries first, then the next level shared fairly among the directories shown (a directory
with few entries shows them all, the rest of the budget is split among the large ones), and
so on. A directory whose entries are cut says ``… (N more)`` where they stop. A depth-first cut
would let one directory of 3,000 files fill the budget and hide every sibling after it; this
way the top of the tree is always there. A capped tree is saved whole to the spill area and
the footer names the file.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Final

import anyio.to_thread

from dsh_host.sdk import ToolDefinition, ToolError, ToolExecution, text_output

from .config import BuiltinToolsConfig
from .files import WorkspaceRoot, display_parts, workspace_parts
from .search import (
    MAX_ENTRIES,
    Specs,
    ancestor_specs,
    capped_footer,
    ignored,
    open_search_dir,
    shown_path,
    with_ignore,
)
from .spill import SpillArea, spill_owner

__all__ = ["DEFAULT_DEPTH", "MAX_DEPTH", "list_dir_tool"]

#: Levels shown when the call does not say (1: the directory's own entries).
DEFAULT_DEPTH: Final = 2
#: The deepest tree one call lists.
MAX_DEPTH: Final = 10
_INDENT: Final = "  "


def _entries(dir_fd: int, here: tuple[str, ...], specs: Specs) -> list[tuple[str, str]]:
    """``(name, kind)`` of the directory's entries that no ignore rule hides, sorted by name;
    kind is ``dir``, ``link`` or ``file`` (anything else: FIFOs, sockets, devices)."""
    kept: list[tuple[str, str]] = []
    with os.scandir(dir_fd) as scan:
        for entry in scan:
            if entry.name == ".git":
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            kind = "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "file"
            if not ignored(specs, (*here, entry.name), kind == "dir"):
                kept.append((entry.name, kind))
    return sorted(kept)


def _open_child(dir_fd: int, name: str) -> int | None:
    try:
        return os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None


#: One entry of the tree: its line (without indentation) and, for a directory that was
#: entered, its own entries.
Node = tuple[str, list["Node"] | None]


def tree_nodes(top_fd: int, parts: tuple[str, ...], specs: Specs, depth: int) -> list[Node]:
    """The entries beneath ``top_fd`` (workspace path ``parts``), ``depth`` levels."""
    count = 0

    def visit(dir_fd: int, here: tuple[str, ...], specs: Specs, level: int) -> list[Node]:
        nonlocal count
        nodes: list[Node] = []
        specs = with_ignore(dir_fd, here, specs)
        for name, kind in _entries(dir_fd, here, specs):
            count += 1
            if count > MAX_ENTRIES:
                raise ToolError(
                    f"the listing has more than {MAX_ENTRIES} entries; list a narrower path or a "
                    "smaller depth"
                )
            shown = shown_path((name,))
            if kind == "link":
                nodes.append((f"{shown}@", None))
                continue
            if kind == "file":
                nodes.append((shown, None))
                continue
            child = _open_child(dir_fd, name)
            if child is None:
                nodes.append((f"{shown}/ (unreadable)", None))
                continue
            try:
                if level + 1 >= depth:
                    inner = with_ignore(child, (*here, name), specs)
                    held = len(_entries(child, (*here, name), inner))
                    plural = "y" if held == 1 else "ies"
                    nodes.append((f"{shown}/ ({held} entr{plural})" if held else f"{shown}/", None))
                else:
                    nodes.append((f"{shown}/", visit(child, (*here, name), specs, level + 1)))
            finally:
                os.close(child)
        return nodes

    return visit(top_fd, parts, specs, 0)


def _fair_shares(sizes: list[int], budget: int) -> list[int]:
    """Split ``budget`` among lists of ``sizes`` entries: each gets at most its size, and no
    list is cut while a smaller share would leave budget unused (water-filling)."""
    shares = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for rank, index in enumerate(order):
        share = min(sizes[index], budget // (len(order) - rank))
        shares[index] = share
        budget -= share
    return shares


def render(nodes: list[Node], cap: int | None = None) -> tuple[list[str], int]:
    """The tree's indented lines, and how many entries they show.

    ``cap``: at most that many entries, chosen breadth-first with fair shares per level (see
    the module docstring); a cut list ends with ``… (N more)``. None: every entry.
    """
    allowed: dict[int, int] = {}
    if cap is not None:
        budget, level = cap, [nodes]
        while level and budget > 0:
            shares = _fair_shares([len(entries) for entries in level], budget)
            budget -= sum(shares)
            following: list[list[Node]] = []
            for entries, share in zip(level, shares, strict=True):
                allowed[id(entries)] = share
                following += [kids for _line, kids in entries[:share] if kids]
            level = following
    lines: list[str] = []
    shown = 0

    def emit(entries: list[Node], depth: int) -> None:
        nonlocal shown
        indent = _INDENT * depth
        keep = len(entries) if cap is None else allowed.get(id(entries), 0)
        for line, kids in entries[:keep]:
            lines.append(f"{indent}{line}")
            shown += 1
            if kids:
                emit(kids, depth + 1)
        if keep < len(entries):
            lines.append(f"{indent}… ({len(entries) - keep} more)")

    emit(nodes, 0)
    return lines, shown


def list_dir_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, spill: SpillArea
) -> ToolDefinition:
    """Build ``list_dir``: the tree of one workspace directory, ignores honoured."""
    holder, workspace = root, root.path
    cap = config.max_search_results

    def list_sync(parts: tuple[str, ...], depth: int, call_id: str, owner: str | None) -> str:
        specs = ancestor_specs(holder.fd(), parts)
        top = open_search_dir(holder, parts)
        try:
            nodes = tree_nodes(top, parts, specs, depth)
        finally:
            os.close(top)
        head = f"{display_parts(parts)}/"
        if not nodes:
            return f"{head}\n{_INDENT}(empty directory)"
        lines, total = render(nodes)
        view, shown = render(nodes, cap)
        tree = [head, *(f"{_INDENT}{line}" for line in lines)]
        footer = capped_footer(
            total,
            shown,
            "entries",
            "list_dir",
            "list a narrower path or a smaller depth",
            lambda: spill.save_text(call_id, "list_dir.txt", "\n".join(tree) + "\n", owner),
        )
        return "\n".join([head, *(f"{_INDENT}{line}" for line in view)]) + footer

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args.get("path", "."), workspace)
        depth = args.get("depth", DEFAULT_DEPTH)
        if not 1 <= depth <= MAX_DEPTH:
            raise ToolError(f"invalid depth: expected 1 to {MAX_DEPTH} levels, got {depth}")
        return await anyio.to_thread.run_sync(
            list_sync, parts, int(depth), exec.call_id, spill_owner(exec)
        )

    return ToolDefinition(
        name="list_dir",
        description=(
            "List a directory of the workspace as an indented tree: directories end with `/`, "
            "symbolic links with `@` (not followed), and a directory at the depth limit shows "
            f"how many entries it holds. Sorted by name, at most {cap} entries, shallow ones "
            "first: a directory whose entries are cut says `… (N more)`. Files ignored by "
            ".gitignore and the .git directory are left out."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Directory to list, relative to the workspace. Defaults to it.",
                },
                "depth": {
                    "type": "integer",
                    "description": (
                        f"Levels to list (1: only the directory's own entries). Defaults to "
                        f"{DEFAULT_DEPTH}, at most {MAX_DEPTH}."
                    ),
                },
            },
        },
        execute=execute,
        output=text_output(),
        is_concurrency_safe=lambda args: True,
        read_only=True,  # D27: a fork ledger or a replay may run it again
    )
