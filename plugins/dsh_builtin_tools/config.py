"""Configuration of the ``builtin-tools`` row."""

from __future__ import annotations

import os

import msgspec

from dsh_host.sdk import DEFAULT_PROTECTED_NAMES, ConfigError, SandboxMode

__all__ = ["BuiltinToolsConfig", "BuiltinToolsConfigError", "canonical_workspace"]


class BuiltinToolsConfigError(ConfigError, ValueError):
    """Invalid ``builtin-tools`` config (a ``ValueError`` too, so msgspec reports it at load)."""

    code = "BUILTIN_TOOLS_CONFIG"


class BuiltinToolsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Config of the ``builtin-tools`` row (snake_case keys; DSH's camelCase accepted, D21).

    ``workspace``: the root the file tools are fenced to and the default
    working directory of ``bash`` (relative to the process's working directory
    at load; canonicalized). ``sandbox``: the file-effect mode every ``bash``
    call runs under (``danger-full-access`` runs unconfined, on purpose).
    ``timeoutMs`` / ``maxTimeoutMs``: the default and the cap of a ``bash``
    call's deadline. ``maxOutputBytes``: how much of each output stream the
    model sees (its head and its tail, half each; the whole stream is spilled to a file;
    never more than fits ``maxInlineBytes`` with the other stream). ``killGraceMs``:
    SIGTERM-to-SIGKILL grace. ``maxReadBytes``: the byte cap on the lines one
    ``read_file`` call returns (past it the window ends with a truncation notice).
    ``readLimit``: the default and the most lines one ``read_file`` call returns.
    ``readMaxLineLength``: characters kept per returned line. ``maxScanBytes``: the most bytes
    one ``read_file`` call reads (to reach ``offset``, fill its window and count the lines after
    it); past it the footer says the count stopped there. ``maxEditBytes``:
    the largest file ``edit_file`` edits (it reads the whole file).
    ``maxSearchResults``: most paths ``glob`` lists and matching lines ``grep`` shows.
    ``ripgrep``: let ``glob``/``grep`` list files with the packaged ``rg`` (the ``ripgrep``
    wheel) when it is installed and a sandbox can confine it; off, or without either, a
    pure-Python walk gives the same list. ``searchTimeoutMs``: ripgrep's deadline for one
    listing (its whole process group is killed then, and the walk lists instead).
    ``spillDir``: where the row's private spill directory is created (default:
    outside every writable root, see ``spill.spill_base``).
    ``maxSpillBytes``: the most one stream spills; past it the file ends with a
    capped marker and the rest is discarded. ``spillBudgetBytes``: the most all of the row's
    spill files hold together (the run's budget; ``null``: none); past it an output is cut with
    a note saying so.
    ``maxInlineBytes``: the most UTF-8 bytes of any tool's plain-text result the model
    sees (every tool in the composition but ``read_file``); a larger result is saved to the
    spill directory and replaced by a head/tail preview and a notice naming the file
    (``null`` turns this off).
    ``envAllow``: inherited environment variables a ``bash`` child
    may see beyond the default allow-list (exact names, or ``PREFIX*``).
    ``protectedPaths`` (workspace-relative, existing or not) and, with
    ``protectVirtualenvs``, every virtualenv of the workspace at any depth stay
    read-only under ``workspace-write`` for every tool: confined ``bash`` calls
    and ``write_file`` / ``edit_file`` alike (one policy per call).
    """

    workspace: str = "."
    sandbox: SandboxMode = "workspace-write"
    timeout_ms: int = 120_000
    max_timeout_ms: int = 600_000
    max_output_bytes: int = 64_000
    kill_grace_ms: int = 3_000
    max_read_bytes: int = 51_200
    read_limit: int = 2_000
    read_max_line_length: int = 2_000
    max_edit_bytes: int = 8_000_000
    max_search_results: int = 200
    spill_dir: str | None = None
    max_spill_bytes: int = 16_000_000
    spill_budget_bytes: int | None = 256_000_000
    max_scan_bytes: int = 64_000_000
    max_inline_bytes: int | None = 50_000
    ripgrep: bool = True
    search_timeout_ms: int = 20_000
    env_allow: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_NAMES
    protect_virtualenvs: bool = True

    def __post_init__(self) -> None:
        for field in (
            "timeout_ms",
            "max_timeout_ms",
            "max_output_bytes",
            "kill_grace_ms",
            "max_read_bytes",
            "read_limit",
            "read_max_line_length",
            "max_edit_bytes",
            "max_search_results",
            "search_timeout_ms",
            "max_spill_bytes",
            "spill_budget_bytes",
            "max_scan_bytes",
            "max_inline_bytes",
        ):
            value = getattr(self, field)
            if value is not None and value <= 0:
                camel = field.split("_")[0] + "".join(p.title() for p in field.split("_")[1:])
                raise BuiltinToolsConfigError(
                    f"builtin-tools: {camel} must be a positive integer, got {value}"
                )
        if self.timeout_ms > self.max_timeout_ms:
            raise BuiltinToolsConfigError(
                f"builtin-tools: timeoutMs ({self.timeout_ms}) exceeds maxTimeoutMs "
                f"({self.max_timeout_ms})"
            )
        for entry in self.env_allow:
            if not entry or "=" in entry or "\0" in entry or "*" in entry[:-1]:
                raise BuiltinToolsConfigError(
                    f"builtin-tools: envAllow entry {entry!r} must be a variable name, or a "
                    "prefix followed by a single trailing '*'"
                )
        for entry in self.protected_paths:
            parts = entry.replace("\\", "/").split("/")
            if not entry or os.path.isabs(entry) or "\0" in entry or ".." in parts:
                raise BuiltinToolsConfigError(
                    f"builtin-tools: protectedPaths entry {entry!r} must be a path relative to "
                    "the workspace, without '..'"
                )
        if not self.workspace or "\0" in self.workspace:
            raise BuiltinToolsConfigError("builtin-tools: workspace must be a non-empty path")


def canonical_workspace(path: str) -> str:
    """The filesystem identity of the workspace: realpath first, then absolute.

    Realpath before any lexical normalisation, so ``link/..`` lands where
    ``chdir`` would (the sandbox policy resolves roots the same way).
    """
    return os.path.abspath(os.path.realpath(os.path.expanduser(path)))
