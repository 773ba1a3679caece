"""One bounded-output policy for every tool: a private spill area and the head/tail preview.

Follows DSH's split (``spill-local`` stores, ``output-retention`` keeps, ``spill-policy`` decides):

* :class:`SpillArea` is the row's private spill directory, outside every root a confined command
  can write (``spill_base``), created ``mkdtemp`` (0700) on first use; each file is created
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` with mode 0600 relative to the directory's descriptor, under
  a name no other process chooses, so a planted file or symlink makes the spill fail instead of
  being written through. Each file belongs to the session whose call wrote it
  (:func:`spill_owner`) and is deleted when that session leaves the process
  (``session/disposed``: the end of ``dsh run``, of a ``dsh chat``, of each ``dsh serve`` turn);
  the directory is deleted with the row (the end of the run).
* ``bash`` spills each output stream there at acquisition time (it keeps the tail);
  ``glob`` and ``grep`` spill their complete result list when it is capped;
  :func:`bound_results` bounds every other tool's final plain-text result: past
  ``maxInlineBytes`` the full text is saved and the model sees a head/tail preview and DSH's
  notice ``(Omitted N bytes. Full formatted result stored at: <path>. <hint>)``.
* ``read_file`` reads a spill file by its absolute path (:meth:`SpillArea.locate`), opened
  beneath the area's descriptor (one component, no link followed, regular files only): that is
  how the model pages through what was cut.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Final

import anyio.to_thread
from msgspec import UNSET

from dsh_host.sdk import (
    Accept,
    Context,
    PostExecuteContext,
    PostToolDecision,
    SandboxPolicy,
    TextBlock,
    ToolExecution,
    writable_roots,
)

from .config import BuiltinToolsConfig, BuiltinToolsConfigError

__all__ = [
    "RETRIEVAL_HINT",
    "SPILL_BUDGET_MARKER",
    "SPILL_CAPPED_MARKER",
    "SpillArea",
    "bound_results",
    "bound_text",
    "head_tail",
    "spill_base",
    "spill_notice",
    "spill_owner",
    "unsaved_notice",
]

#: Written at the end of a spill file that reached ``maxSpillBytes``.
SPILL_CAPPED_MARKER: Final = (
    "\n[dsh: spill capped at {cap} bytes; the rest of this stream was discarded]\n"
)
#: Written at the end of a spill file cut short because the row's spill budget ran out.
SPILL_BUDGET_MARKER: Final = (
    "\n[dsh: this run's spill budget of {budget} bytes is used up; the rest of this output was "
    "discarded]\n"
)
#: How the model gets at a spilled file (DSH's ``spill-local`` hint, with our tool's name).
RETRIEVAL_HINT: Final = "Use read_file with offset/limit to page through it."
#: The tool whose results are never re-spilled (a read → spill → read loop).
UNBOUNDED_TOOLS: Final = frozenset({"read_file"})


def spill_base(config: BuiltinToolsConfig, workspace: str) -> str | None:
    """The directory a row's private spill area is created in, outside every writable root.

    A confined command may write the workspace and (Landlock) the host's temporary
    directories, so a spill file there could be pre-planted as a symlink (D20). An
    explicit ``spillDir`` inside one of those is a config error; by default the first of
    ``$XDG_RUNTIME_DIR/dsh``, ``$XDG_CACHE_HOME/dsh`` (``~/.cache/dsh``) and ``/var/tmp`` that is
    outside them is used. None: no candidate qualifies, so nothing is spilled.
    """
    roots = writable_roots(SandboxPolicy(mode="workspace-write", workspace_root=workspace))

    def inside(path: str) -> str | None:
        canonical = os.path.realpath(path)
        for root in roots:
            if canonical == root or canonical.startswith(root.rstrip(os.sep) + os.sep):
                return root
        return None

    if config.spill_dir is not None:
        explicit = os.path.abspath(os.path.expanduser(config.spill_dir))
        root = inside(explicit)
        if root is not None:
            raise BuiltinToolsConfigError(
                f"builtin-tools: spillDir {config.spill_dir!r} is inside {root}, which sandboxed "
                "commands can write; choose a directory outside the workspace and the temporary "
                "directories (or leave spillDir unset)"
            )
        return explicit
    candidates = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        candidates.append(os.path.join(runtime, "dsh"))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isabs(cache):
        candidates.append(os.path.join(cache, "dsh"))
    candidates.append("/var/tmp")
    for candidate in candidates:
        if inside(candidate) is None:
            return candidate
    return None


def spill_owner(exec: ToolExecution) -> str | None:
    """The session a call's spill files belong to (its agent's session id), or None for a
    call made outside a session (its files then live as long as the row)."""
    agent = getattr(exec, "agent", None)  # bench/search.py drives the bodies with a stand-in
    session_id = getattr(getattr(agent, "session", None), "id", None) if agent else None
    return session_id if isinstance(session_id, str) else None


class SpillArea:
    """One row's private spill directory (``mkdtemp``, 0700), created on first use.

    Files are created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (0600) relative to the directory's
    descriptor, with names no other process chooses (a per-row counter), so a planted file or
    symlink makes the spill fail instead of being written through. :meth:`dispose` (the row's
    unload: the end of the run) deletes the directory and everything in it. Safe to use from
    the event loop and from worker threads at once (``glob`` and ``grep`` may run in parallel).

    Two bounds: ``cap`` bytes per file (``maxSpillBytes``), and ``budget`` bytes for all the
    files of the row together (``spillBudgetBytes``): every writer takes its bytes through
    :meth:`reserve` first, so a run of noisy calls cannot fill the disk (without it, a dozen
    read-only calls wrote ~350 MiB). What the budget refuses is discarded and the file says so.

    Every file is recorded under its owner (a session id, :func:`spill_owner`); :meth:`release`
    deletes one owner's files and gives their bytes back to the budget. The row calls it on
    ``session/disposed``, the one event every session crosses when it leaves the process, so a
    long-lived row (``dsh serve``) keeps only the files of the sessions it is running.
    """

    def __init__(self, base: str | None, cap: int, budget: int | None = None) -> None:
        self.base = base
        self.cap = cap
        self.budget = budget
        self.spent = 0
        self.path: str | None = None
        self._dir_fd: int | None = None
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        #: owner (a session id; None: no session) -> the names of its files in the directory
        self._owned: dict[str | None, list[str]] = {}

    def reserve(self, size: int) -> int:
        """Take up to ``size`` bytes of the row's spill budget; returns how many were granted
        (``size`` itself, less once the budget runs out, 0 when it has)."""
        with self._lock:
            granted = size if self.budget is None else max(0, min(size, self.budget - self.spent))
            self.spent += granted
            return granted

    def exhausted(self) -> bool:
        """Whether the row's spill budget is used up."""
        with self._lock:
            return self.budget is not None and self.spent >= self.budget

    def open(
        self, call_id: str, label: str, owner: str | None = None
    ) -> tuple[int, str] | None:
        """A new spill file for one output of one call of ``owner``'s session: (descriptor,
        path), or None."""
        if self.base is None:
            return None
        with self._lock:
            if self._dir_fd is None:
                os.makedirs(self.base, mode=0o700, exist_ok=True)
                self.path = tempfile.mkdtemp(prefix="dsh-tool-output-", dir=self.base)
                self._dir_fd = os.open(
                    self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                )
            dir_fd, directory, number = self._dir_fd, self.path or "", next(self._count)
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", call_id)[:100] or "call"
        name = f"{number}-{safe_id}.{label}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        with self._lock:
            if self._dir_fd == dir_fd:
                self._owned.setdefault(owner, []).append(name)
        return fd, os.path.join(directory, name)

    def release(self, owner: str | None) -> int:
        """Delete the files of ``owner`` and give their bytes back to the budget; returns how
        many were deleted. Idempotent; a file already gone is skipped."""
        with self._lock:
            names = self._owned.pop(owner, [])
            dir_fd = self._dir_fd
        if dir_fd is None:
            return 0
        removed = 0
        freed = 0
        for name in names:
            try:
                size = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                continue
            removed += 1
            freed += size
        with self._lock:
            self.spent = max(0, self.spent - freed)
        return removed

    def save_text(
        self, call_id: str, label: str, text: str, owner: str | None = None
    ) -> str | None:
        """Write ``text`` to a new spill file (up to ``maxSpillBytes``, then the capped marker;
        past the row's budget, the budget marker) and return its path; None when nothing could
        be saved (no area, a spent budget, a refused create, a full disk: saving is best-effort,
        the caller keeps its inline text)."""
        if self.exhausted():
            return None
        try:
            opened = self.open(call_id, label, owner)
        except OSError:
            return None
        if opened is None:
            return None
        fd, path = opened
        dir_fd = self._dir_fd
        data = text.encode("utf-8", "replace")
        want = min(len(data), self.cap)
        granted = self.reserve(want)
        if granted < want:
            data = data[:granted] + SPILL_BUDGET_MARKER.format(budget=self.budget).encode()
        elif len(data) > self.cap:
            data = data[: self.cap] + SPILL_CAPPED_MARKER.format(cap=self.cap).encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.basename(path), dir_fd=dir_fd)
            return None
        finally:
            os.close(fd)
        return path

    def locate(self, path: str) -> tuple[int, str] | None:
        """``(directory descriptor, file name)`` when ``path`` names a file of this area (its
        absolute path, as a notice printed it), else None. The caller opens the name relative
        to the descriptor without following it."""
        if self.path is None or self._dir_fd is None or not os.path.isabs(path):
            return None
        head, name = os.path.split(path)  # no normalisation: "area/../area/x" is not taken
        if head != self.path or name in ("", ".", ".."):
            return None
        return self._dir_fd, name

    def dispose(self) -> None:
        """Close the directory and delete it with its files. Idempotent."""
        with self._lock:
            fd, self._dir_fd = self._dir_fd, None
            path, self.path = self.path, None
        if fd is not None:
            os.close(fd)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        with self._lock:
            self.spent = 0
            self._owned.clear()


def _cut_head(data: bytes, size: int) -> bytes:
    """The first ``size`` bytes of UTF-8 ``data``, without a partial code point at the cut."""
    head = data[:size]
    return head.decode("utf-8", "ignore").encode("utf-8") if size < len(data) else head


def head_tail(text: str, budget: int) -> tuple[str, int]:
    """Keep the first ``ceil(budget/2)`` and the last ``floor(budget/2)`` UTF-8 bytes of
    ``text`` (whole code points only); return the kept text and how many bytes were omitted."""
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text, 0
    head = _cut_head(data, (budget + 1) // 2)
    tail_size = budget // 2
    tail = data[len(data) - tail_size :] if tail_size else b""
    tail = tail.decode("utf-8", "ignore").encode("utf-8")  # drops a split code point's bytes
    return (head + tail).decode("utf-8"), len(data) - len(head) - len(tail)


def spill_notice(omitted: int, locator: str) -> str:
    """DSH's spill notice (``spill-policy``), with our retrieval hint."""
    return (
        f"(Omitted {omitted} bytes. Full formatted result stored at: {locator}. {RETRIEVAL_HINT})"
    )


def unsaved_notice(omitted: int, budget: int | None) -> str:
    """The notice of a bounded result that could not be saved because the run's spill budget is
    used up: the model still gets the head and the tail, and knows the middle is gone."""
    return (
        f"(Omitted {omitted} bytes. The full result was not saved: this run's spill budget of "
        f"{budget} bytes is used up.)"
    )


def bound_text(
    text: str,
    cap: int,
    save: Callable[[str], str | None],
    unsaved: Callable[[int], str] | None = None,
) -> str | None:
    """The bounded replacement of ``text`` (preview, blank line, notice; at most ``cap`` bytes),
    or None to keep ``text`` as it is: it fits, ``save`` could not store it (and ``unsaved``,
    which words the notice of a result cut without a copy, is None), or not even the notice fits
    the cap (then the notice would break the advertised bound)."""
    size = len(text.encode("utf-8"))
    if size <= cap:
        return None
    locator = save(text)
    if locator is not None:
        notice_for: Callable[[int], str] = functools.partial(spill_notice, locator=locator)
    elif unsaved is not None:
        notice_for = unsaved
    else:
        return None
    # Reserve the notice priced at the largest omission (all bytes): its digits bound the real
    # count's, so the final replacement never exceeds the cap.
    reserve = len(notice_for(size).encode("utf-8")) + 2
    preview, omitted = head_tail(text, max(0, cap - reserve))
    notice = notice_for(omitted)
    replaced = f"{preview}\n\n{notice}" if preview else notice
    return replaced if len(replaced.encode("utf-8")) <= cap else None


def bound_results(ctx: Context, area: SpillArea, cap: int) -> None:
    """Register the ``tools/post-execute`` listener that bounds every tool's final plain-text
    result to ``cap`` bytes (DSH's ``spill-policy``): ``read_file`` (its own window caps it, and
    re-spilling a read would loop), nested calls and results with a non-text block pass."""

    async def after_execute(
        post: PostExecuteContext, next_: Callable[[], Awaitable[PostToolDecision]]
    ) -> PostToolDecision:
        decision = await next_()
        execution = post.exec
        if (
            not isinstance(decision, Accept)
            or decision.value is not UNSET
            or execution.parent is not None
            or execution.name in UNBOUNDED_TOOLS
        ):
            return decision
        content = decision.content if decision.content is not None else post.result.content
        if not all(isinstance(block, TextBlock) for block in content):
            return decision
        text = "".join(block.text for block in content if isinstance(block, TextBlock))
        if len(text) <= cap // 4 or len(text.encode("utf-8")) <= cap:
            return decision  # fits (a UTF-8 character is at most 4 bytes): nothing to save

        def save(full: str) -> str | None:
            return area.save_text(execution.call_id, "result.txt", full, spill_owner(execution))

        def unsaved(omitted: int) -> str:
            return unsaved_notice(omitted, area.budget)

        # A spent budget still bounds the result (head and tail, and a notice saying the middle
        # is gone); any other failure to save keeps the original, as before.
        cut = unsaved if area.exhausted() else None
        # The save writes up to maxSpillBytes: on a worker thread, not the event loop.
        replaced = await anyio.to_thread.run_sync(bound_text, text, cap, save, cut)
        if replaced is None:
            return decision
        return Accept(
            content=(TextBlock(text=replaced),),
            additional_contexts=decision.additional_contexts,
        )

    ctx.on("tools/post-execute", after_execute)
