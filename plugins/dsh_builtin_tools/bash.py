"""The ``bash`` tool: one confined ``bash -c`` per call.

Flow of one call (the plugin README's ``bash`` section):

1. validate the arguments (DSH's texts: ``invalid command: expected a
   non-empty string`` ..., then the ``sandbox_permissions`` / ``justification``
   pairing);
2. escalation (:mod:`dsh_host._tools.escalation`), only when the model sent ``sandbox_permissions``:
   the composition guard (a row in ``danger-full-access`` has nothing to
   widen), then :func:`~dsh_host._tools.escalation.approve_escalation` — strict
   widening of the row's mode, an approval service, an agent, and an
   ``allowed-once`` answer, or an error result with the exact DSH text and
   nothing run. The granted mode is *this call's* mode only; nothing is
   stored, so the next call runs under the row's mode again;
3. ``danger-full-access`` (the row's, or granted) → spawn ``["bash", "-c",
   command]`` as is, without consulting the sandbox. Any other mode →
   ``ctx.sandbox.confine(["bash", "-c", command], policy)`` and spawn the
   wrapped argv. No sandbox service, or a provider with no usable backend →
   ``SandboxUnavailableError`` (``SANDBOX_UNAVAILABLE``): nothing runs. There
   is no silent unconfined fallback, not even after a granted escalation;
4. the child gets an allow-listed environment (:data:`DEFAULT_ENV_ALLOW`
   plus the row's ``envAllow``; never an inherited ``DSH_*``) plus
   ``DSH_IDEMPOTENCY_KEY`` — the key to hand an external system so the
   call's effect applies at most once (D11; the same for this call in every
   process that runs it, different for every other call of every session) —,
   ``DSH_CALL_ID`` (the call's id, unique in its session only) and
   ``DSH_SESSION_ID`` when the call belongs to a session; stdin is
   ``/dev/null``; it runs in its own session (process group) with every
   other descriptor closed, because neither bubblewrap nor Landlock re-checks
   an already-open descriptor;
5. on the deadline or on cancellation the whole process group gets SIGTERM,
   then SIGKILL after the grace period, and the child is *awaited* (a started
   body is never abandoned); a cancelled call then raises
   :class:`~dsh_host.errors.AbortError` (``tool call aborted``);
6. runner-failure evidence in stderr → ``SANDBOX_UNAVAILABLE`` (the command
   did not run); otherwise a non-zero exit whose stderr carries the backend's
   denial dialect is marked ``denied``.

The model reads stdout, a ``[stderr]`` section, and markers in this order:
``[sandbox: file access denied under <mode> mode]``, then (only when the
escalation fields are advertised) the same-turn retry hint, ``[timed out
after <N>ms]``, then ``[killed by signal: <SIG>]`` or ``[exit code: <n>]``.
"""

from __future__ import annotations

import codecs
import math
import os
import signal as signals
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio

from dsh_host.sdk import (
    APPROVAL,
    DEFAULT_ENV_ALLOW,
    ESCALATION_TARGETS,
    SANDBOX,
    AbortError,
    CancelToken,
    ConfinedArgv,
    ContentBlock,
    Context,
    FdReceiveStream,
    SandboxEscalationError,
    SandboxMode,
    SandboxUnavailableError,
    SpawnedProcess,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolExecution,
    ToolOutput,
    allowed_environment,
    approve_escalation,
    capped_mode,
    check_escalation_available,
    escalation_hint_marker,
    js_number,
    open_process,
    sandbox_denial_marker,
    validate_escalation_args,
)

from .config import BuiltinToolsConfig
from .policy import tool_policy
from .spill import SPILL_BUDGET_MARKER, SPILL_CAPPED_MARKER, SpillArea, spill_owner

__all__ = [
    "BASH_DESCRIPTION",
    "DEFAULT_ENV_ALLOW",
    "ESCALATION_DESCRIPTION",
    "bash_parameters",
    "bash_tool",
    "denial_marker",
    "render_bash",
]

_FIXED_ENV: Final = {"NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat"}
_READ_CHUNK: Final = 65536
#: How long a finished command's inherited pipes may stay open (a background grandchild).
_DRAIN_AFTER_EXIT_S: Final = 1.0

BASH_DESCRIPTION: Final = (
    "Execute a bash command (`bash -c`) and return its stdout/stderr. Each call runs in a fresh "
    "shell: no state (cwd, variables, functions) persists between calls — pass `workdir` instead "
    "of using `cd`. Non-zero exits are reported as `[exit code: N]`. This call's idempotency key "
    "is exported as `$DSH_IDEMPOTENCY_KEY`: pass it to external systems that accept one. "
    "Commands may run under a file sandbox; a blocked file operation is reported as "
    "`[sandbox: file access denied under <mode> mode]` — a policy denial, not a bug in the "
    "command; do not retry another way. Long output keeps its first and its last lines with "
    "`[... N bytes omitted ...]` between them; the full output is saved to a file whose path is "
    "reported when available (page through it with read_file)."
)

#: Appended to the description only when the escalation fields are advertised (the row
#: confines). Our wording of DSH's guidance: attempt first, escalate only after a real denial,
#: the exact same command once, the narrowest mode, and a rejection is final.
ESCALATION_DESCRIPTION: Final = (
    " Running a command the sandbox may deny is safe and expected: run it and read the marker "
    "instead of assuming a denial. When a command was denied and a wider mode would let it "
    "succeed, retry the exact same command once, in the same turn, with `sandbox_permissions` "
    "(the narrowest wider mode that suffices) and a one-sentence `justification` — the only "
    "sanctioned exception to a denial. Do not ask for permission in chat first: the approval "
    "prompt raised by that retry is how the user consents. If the session says approval "
    "prompts are disabled, a denial is final: do not set `sandbox_permissions`. Never escalate "
    "speculatively; ground the request in a real denial (normally the one this command just "
    "hit). A rejected escalation is final for that command — stop and explain, do not work "
    "around it — but it does not forbid other commands or later escalations."
)

PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to execute."},
        "description": {
            "type": "string",
            "description": (
                "Clear, concise description of what this command does in active voice, "
                '5-10 words (shown in the UI). Examples: "ls" → "List files in current '
                'directory"; "git status" → "Show working tree status".'
            ),
        },
        "timeoutMs": {
            "type": "number",
            "description": (
                "Timeout in milliseconds. The tool applies its configured default and cap, and "
                "kills the command on expiry."
            ),
        },
        "workdir": {
            "type": "string",
            "description": (
                "Working directory for this command: the workspace (the default) or a directory "
                "beneath it; a relative path is resolved against the workspace. A directory "
                "outside the workspace is refused."
            ),
        },
    },
    # `description` is optional: it only labels the call for people (the transcript's status
    # line, the approval prompt), so a call without one runs; refusing it cost a model a
    # whole round trip for a UI string.
    "required": ["command"],
}

#: The two escalation properties, advertised only when the row's mode confines.
ESCALATION_PARAMETERS: Final = {
    "sandbox_permissions": {
        "type": "string",
        "enum": list(ESCALATION_TARGETS),
        "description": (
            "The wider sandbox mode this command needs. Only valid as a one-shot retry of a "
            "command the sandbox just denied; requires justification and user approval."
        ),
    },
    "justification": {
        "type": "string",
        "description": (
            "Required with sandbox_permissions: one sentence for the user explaining why this "
            "exact command needs the wider access."
        ),
    },
}


def bash_parameters(escalation: bool) -> dict[str, Any]:
    """The ``bash`` parameters schema, with the escalation fields when ``escalation``.

    The enum is always the full target vocabulary, never cut down to the row's
    mode: strict widening is checked per call at execution.
    """
    if not escalation:
        return PARAMETERS
    return {**PARAMETERS, "properties": {**PARAMETERS["properties"], **ESCALATION_PARAMETERS}}


_STREAM_SCHEMA: Final = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "text": {"type": "string"},
        "truncated": {"type": "boolean"},
        "spillPath": {"type": "string"},
        "spillCapped": {"type": "boolean"},
        "omittedBytes": {"type": "integer"},
        "spillBudgetSpent": {"type": "boolean"},
    },
    "required": ["text", "truncated"],
}

OUTPUT_SCHEMA: Final = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "kind": {"type": "string", "const": "foreground"},
        "exitCode": {"oneOf": [{"type": "integer"}, {"type": "null"}]},
        "signal": {"oneOf": [{"type": "string"}, {"type": "null"}]},
        "timedOut": {"type": "boolean"},
        "aborted": {"type": "boolean"},
        "timeoutMs": {"type": "number"},
        "stdout": _STREAM_SCHEMA,
        "stderr": _STREAM_SCHEMA,
        "sandbox": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mode": {"type": "string"},
                "denied": {"type": "boolean"},
                "enforcement": {"type": "string"},
            },
            "required": ["mode", "denied"],
        },
    },
    "required": [
        "kind",
        "exitCode",
        "signal",
        "timedOut",
        "aborted",
        "timeoutMs",
        "stdout",
        "stderr",
    ],
}


def denial_marker(mode: str) -> str:
    """The model-visible marker of a file effect the sandbox blocked (shared with fs tools)."""
    return sandbox_denial_marker(mode)


def _stream_text(stream: Mapping[str, Any]) -> str:
    text = str(stream["text"])
    if not stream["truncated"]:
        return text
    path = stream.get("spillPath", "(unavailable)")
    if stream.get("spillBudgetSpent"):
        if "spillPath" not in stream:
            return f"{text}\n[output truncated; not saved: this run's spill budget is used up]"
        return (
            f"{text}\n[output truncated; this run's spill budget ran out, only the output up "
            f"to that point is saved: {path}]"
        )
    if stream.get("spillCapped"):
        return f"{text}\n[output truncated; the output up to the spill cap is saved: {path}]"
    return f"{text}\n[output truncated; full output: {path}]"


def render_bash(_args: Any, value: Any, *, escalation: bool = False) -> list[ContentBlock]:
    """The text the model reads for one finished run (DSH's ``renderResult``).

    ``escalation``: the tool advertises ``sandbox_permissions``, so a denial
    also carries the same-turn retry hint (at the decision point, so the
    sanctioned retry does not depend on the model recalling the description).
    """
    out = _stream_text(value["stdout"])
    err = _stream_text(value["stderr"])
    body = out
    if err:
        if body and not body.endswith("\n"):
            body += "\n"
        body += f"[stderr]\n{err}"
    if not body:
        body = "(no output)"
    markers: list[str] = []
    sandbox = value.get("sandbox")
    if sandbox is not None and sandbox["denied"]:
        markers.append(denial_marker(str(sandbox["mode"])))
        if escalation:
            markers.append(escalation_hint_marker("command"))
    if value["timedOut"]:
        markers.append(f"[timed out after {js_number(value['timeoutMs'])}ms]")
    if value["signal"] is not None:
        markers.append(f"[killed by signal: {value['signal']}]")
    elif value["exitCode"] != 0:
        markers.append(f"[exit code: {value['exitCode']}]")
    if markers:
        if not body.endswith("\n"):
            body += "\n"
        body += "\n".join(markers)
    return [TextBlock(text=body)]


# --------------------------------------------------------------------------- output capture


def _cut_to_line(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """Trim ``head`` after its last newline and ``tail`` before its first one, so the model
    sees whole lines on both sides of the cut. A side without a newline (one huge line) keeps
    its bytes as cut; decoding then replaces a split UTF-8 sequence with U+FFFD."""
    end = head.rfind(b"\n")
    if end >= 0:
        head = head[: end + 1]
    start = tail.find(b"\n")
    if 0 <= start < len(tail) - 1:
        tail = tail[start + 1 :]
    return head, tail


@dataclass
class _Capture:
    """Keeps the head and the tail of one output stream (``limit`` bytes together, half each)
    and spills the whole stream to a file once it overflows.

    The head carries what a command says first (its own errors, a header), the tail how it
    ended; the middle is in the spill file, which holds every byte (up to ``maxSpillBytes`` and
    the row's spill budget). This is the only cut a ``bash`` stream gets: the row sizes
    ``limit`` so that both streams and the markers fit ``maxInlineBytes``, and the generic bound
    then has nothing left to cut.
    """

    limit: int
    area: SpillArea | None
    call_id: str
    stream: str
    #: the session the spill file belongs to (:func:`~.spill.spill_owner`)
    owner: str | None = None
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0
    truncated: bool = False
    spill_fd: int | None = None
    spill_path: str | None = None
    spilled: int = 0
    capped: bool = False
    budget_spent: bool = False
    spill_failed: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if not self.truncated and len(self.head) + len(data) <= self.limit:
            self.head.extend(data)
            return
        if not self.truncated:
            self.truncated = True
            self._open_spill()
            self._write_spill(bytes(self.head))
            self._write_spill(data)
            merged = self.head + data
            keep = self.limit - self.limit // 2
            self.head, self.tail = merged[:keep], merged[keep:]
        else:
            self._write_spill(data)
            self.tail.extend(data)
        room = self.limit // 2
        if len(self.tail) > room:
            del self.tail[: len(self.tail) - room]

    def _open_spill(self) -> None:
        if self.area is None:
            self.spill_failed = True
            return
        if self.area.exhausted():
            self.budget_spent = True
            return
        try:
            opened = self.area.open(self.call_id, self.stream, self.owner)
        except OSError:
            opened = None
        if opened is None:
            self.spill_failed = True
            return
        self.spill_fd, self.spill_path = opened

    def _write_spill(self, data: bytes) -> None:
        if self.spill_fd is None or self.capped or self.area is None:
            return
        want = min(len(data), self.area.cap - self.spilled)
        granted = self.area.reserve(want)
        chunk = data[:granted]
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self.spill_fd, view) :]
            self.spilled += len(chunk)
            if granted < want:
                self.capped = self.budget_spent = True
                marker = SPILL_BUDGET_MARKER.format(budget=self.area.budget)
                os.write(self.spill_fd, marker.encode())
            elif len(data) > want:
                self.capped = True
                os.write(self.spill_fd, SPILL_CAPPED_MARKER.format(cap=self.area.cap).encode())
        except OSError:
            self.spill_failed = True
            self.close()

    def close(self) -> None:
        fd, self.spill_fd = self.spill_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                self.spill_failed = True

    def result(self) -> dict[str, Any]:
        if not self.truncated:
            return {"text": bytes(self.head).decode("utf-8", "replace"), "truncated": False}
        head, tail = _cut_to_line(bytes(self.head), bytes(self.tail))
        omitted = self.total - len(head) - len(tail)
        text = (
            head.decode("utf-8", "replace").removesuffix("\n")
            + f"\n[... {omitted} bytes omitted ...]\n"
            + tail.decode("utf-8", "replace")
        )
        out: dict[str, Any] = {"text": text, "truncated": True, "omittedBytes": omitted}
        if self.budget_spent:
            out["spillBudgetSpent"] = True
        if not self.spill_failed and self.spill_path is not None:
            out["spillPath"] = self.spill_path
            if self.capped:
                out["spillCapped"] = True
        return out


async def _pump(
    stream: FdReceiveStream | None,
    capture: _Capture,
    report: Callable[[str, Literal["stdout", "stderr"]], None] | None = None,
) -> None:
    """Read one stream to its end into ``capture``; each piece is also ``report``ed as text
    for a person watching (decoded incrementally: a character split across reads is whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        while stream is not None:
            try:
                data = await stream.receive(_READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            capture.feed(data)
            if report is not None:
                report(decoder.decode(data), "stderr" if capture.stream == "stderr" else "stdout")
    finally:
        capture.close()
        capture.done.set()


# --------------------------------------------------------------------------- process control


#: Room kept in ``maxInlineBytes`` for what ``bash`` adds around the two streams: the omission
#: lines, ``[stderr]``, the truncation notes with their spill paths, and the markers.
RENDER_RESERVE: Final = 2048


def stream_budget(config: BuiltinToolsConfig) -> int:
    """The bytes of each stream the model sees (head + tail): ``maxOutputBytes``, and never more
    than lets both streams and :data:`RENDER_RESERVE` fit ``maxInlineBytes``, so the generic
    bound never cuts a ``bash`` result a second time (it would cut the head of the tail)."""
    if config.max_inline_bytes is None:
        return config.max_output_bytes
    return max(256, min(config.max_output_bytes, (config.max_inline_bytes - RENDER_RESERVE) // 2))


def _signal_group(pid: int, sig: signals.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


async def _terminate(process: SpawnedProcess, grace_s: float) -> None:
    """SIGTERM the group, SIGKILL it after ``grace_s``, and wait for the child either way."""
    _signal_group(process.pid, signals.SIGTERM)
    with anyio.move_on_after(grace_s):
        await process.wait()
    if process.returncode is None:
        _signal_group(process.pid, signals.SIGKILL)
        await process.wait()


@dataclass(frozen=True)
class _RunOutcome:
    returncode: int
    timed_out: bool
    aborted: bool
    stdout: dict[str, Any]
    stderr: dict[str, Any]
    stderr_text: str


async def _run(
    argv: list[str] | tuple[str, ...],
    *,
    cwd: str,
    env: dict[str, str],
    timeout_s: float,
    grace_s: float,
    token: CancelToken,
    capture_limit: int,
    spill: SpillArea | None,
    call_id: str,
    report: Callable[[str, Literal["stdout", "stderr"]], None] | None = None,
    owner: str | None = None,
) -> _RunOutcome:
    # Spawned from the one long-lived spawner thread: the sandbox's parent-death signal is tied
    # to the forking thread, so a retired worker thread must never be the parent (issue 14).
    process = await open_process(argv, cwd=cwd, env=env)
    stdout = _Capture(capture_limit, spill, call_id, "stdout", owner)
    stderr = _Capture(capture_limit, spill, call_id, "stderr", owner)
    timed_out = False
    try:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump, process.stdout, stdout, report)
            pumps.start_soon(_pump, process.stderr, stderr, report)
            with anyio.move_on_after(timeout_s) as deadline, token.linked_scope():
                await process.wait()
            if process.returncode is None:
                timed_out = deadline.cancelled_caught and not token.aborted
                await _terminate(process, grace_s)
            # A grandchild that kept our pipes open must not hold the call forever.
            with anyio.move_on_after(_DRAIN_AFTER_EXIT_S) as drained:
                await stdout.done.wait()
                await stderr.done.wait()
            if drained.cancelled_caught:
                _signal_group(process.pid, signals.SIGKILL)
                pumps.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            with anyio.CancelScope(shield=True):
                await _terminate(process, grace_s)
        with anyio.CancelScope(shield=True):
            await process.aclose()
        stdout.close()
        stderr.close()
    returncode = process.returncode
    assert returncode is not None
    err = stderr.result()
    return _RunOutcome(
        returncode=returncode,
        timed_out=timed_out,
        aborted=token.aborted,
        stdout=stdout.result(),
        stderr=err,
        stderr_text=str(err["text"]),
    )


# --------------------------------------------------------------------------- the tool


def _environment(exec: ToolExecution, allow: tuple[str, ...]) -> dict[str, str]:
    """The child's environment: allow-listed inherited names, then the managed values.

    Inherited ``DSH_*`` never pass (the managed values below are the only ``DSH_*`` a tool
    sees), whatever the allow-list says.
    """
    env = allowed_environment(allow)
    env.update(_FIXED_ENV)
    env["DSH_SHELL"] = "1"
    env["DSH_CALL_ID"] = exec.call_id
    env["DSH_IDEMPOTENCY_KEY"] = exec.idempotency_key
    session = getattr(exec.agent, "session", None) if exec.agent is not None else None
    session_id = getattr(session, "id", None)
    if isinstance(session_id, str):
        env["DSH_SESSION_ID"] = session_id
    return env


def _validate(args: Mapping[str, Any]) -> None:
    if not str(args["command"]).strip():
        raise ValueError("invalid command: expected a non-empty string")
    timeout = args.get("timeoutMs")
    if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"invalid timeoutMs: expected a positive number, got {timeout!r}")
    validate_escalation_args(args.get("sandbox_permissions"), args.get("justification"))


def _runner_attributable(error: OSError, runner: str, workdir: str) -> bool:
    """A spawn failure that names the sandbox runner, with a usable workdir.

    A missing or non-executable runner means the sandbox cannot run, which is
    ``SANDBOX_UNAVAILABLE``; a bad workdir raises the same errno and stays an
    ordinary failure.
    """
    return error.filename == runner and os.path.isdir(workdir) and os.access(workdir, os.X_OK)


class WorkdirError(ToolError):
    """``workdir`` does not name a directory inside the workspace (``BASH_WORKDIR``)."""

    code = "BASH_WORKDIR"


def resolve_workdir(requested: Any, workspace: str) -> str:
    """The directory a call runs in: ``requested`` (relative to the workspace, or absolute),
    resolved through every symbolic link, and only if that lands inside the workspace.

    A command inherits its working directory from the spawn, and a directory the sandbox's
    private mounts never cover (``/run/postgresql``, the host's ``/tmp``) would stay the host's
    own: a relative path there reaches host sockets and files the mounts hide. So the one place
    a command may start is the workspace or a directory beneath it.
    """
    if requested is None or requested == "":
        return workspace
    if not isinstance(requested, str) or "\0" in requested:
        raise WorkdirError("invalid workdir: expected a directory path without NUL bytes")
    joined = requested if os.path.isabs(requested) else os.path.join(workspace, requested)
    resolved = os.path.realpath(joined)
    if resolved != workspace and not resolved.startswith(workspace.rstrip(os.sep) + os.sep):
        raise WorkdirError(
            f'invalid workdir "{requested}": it resolves to {resolved}, which is outside the '
            f"workspace {workspace}; commands run in the workspace or a directory beneath it "
            "(pass a path relative to the workspace, and read other places by absolute path in "
            "the command instead)"
        )
    if not os.path.isdir(resolved):
        raise WorkdirError(
            f'invalid workdir "{requested}": {resolved} is not an existing directory of the '
            "workspace"
        )
    return resolved


def bash_tool(
    ctx: Context, config: BuiltinToolsConfig, workspace: str, spill: SpillArea
) -> ToolDefinition:
    """Build the ``bash`` tool for one ``builtin-tools`` row.

    The row's ``sandbox`` mode is every call's standing mode. When it confines,
    the schema advertises ``sandbox_permissions`` + ``justification`` and a
    denial carries the retry hint; under ``danger-full-access`` there is
    nothing to widen, so neither is shown (and a call that sends the fields
    anyway is refused by the composition guard).
    """
    mode = config.sandbox
    escalation = mode != "danger-full-access"
    grace_s = config.kill_grace_ms / 1000
    env_allow = DEFAULT_ENV_ALLOW + config.env_allow
    stream_limit = stream_budget(config)

    async def confine(
        argv: list[str], call_mode: SandboxMode, exec: ToolExecution
    ) -> ConfinedArgv | None:
        if call_mode == "danger-full-access":
            return None
        sandbox = ctx.get(SANDBOX)
        if sandbox is None:
            raise SandboxUnavailableError(call_mode)
        policy = await tool_policy(config, workspace, call_mode, exec)
        confined: ConfinedArgv = sandbox.confine(argv, policy)
        return confined

    async def call_mode_of(args: Any, exec: ToolExecution) -> SandboxMode:
        """The mode this one call runs under: the row's (at most the calling sub-agent's
        ceiling, D24), or an approved wider one (escalation, never past that ceiling)."""
        standing = capped_mode(mode, exec.agent)
        requested = args.get("sandbox_permissions")
        if requested is None:
            return standing
        check_escalation_available(escalation)
        if capped_mode(str(requested), exec.agent) != requested:  # type: ignore[arg-type]
            raise SandboxEscalationError(
                f'sandbox escalation to "{requested}" is wider than this sub-agent\'s ceiling '
                f'"{standing}": a sub-agent never runs wider than its parent allowed',
                "not-wider",
            )
        return await approve_escalation(
            ctx.get(APPROVAL),
            requested_mode=str(requested),
            justification=str(args["justification"]),
            effective_mode=standing,
            agent=exec.agent,
            call_id=exec.call_id,
            tool_name="bash",
            subject="command",
            signal=exec.signal,
        )

    def render(args: Any, value: Any) -> list[ContentBlock]:
        return render_bash(args, value, escalation=escalation)

    async def execute(args: Any, exec: ToolExecution) -> Any:
        _validate(args)
        call_mode = await call_mode_of(args, exec)
        command = str(args["command"])
        requested = args.get("timeoutMs")
        timeout_ms: float = min(
            float(requested) if requested is not None else float(config.timeout_ms),
            float(config.max_timeout_ms),
        )
        workdir = await anyio.to_thread.run_sync(resolve_workdir, args.get("workdir"), workspace)
        argv = ["bash", "-c", command]
        confined = await confine(argv, call_mode, exec)
        spawn = list(confined.argv) if confined is not None else argv
        if exec.signal.aborted:
            raise AbortError()
        try:
            outcome = await _run(
                spawn,
                cwd=workdir,
                env=_environment(exec, env_allow),
                timeout_s=timeout_ms / 1000,
                grace_s=grace_s,
                token=exec.signal,
                capture_limit=stream_limit,
                spill=spill,
                call_id=exec.call_id,
                report=exec.report_progress if exec.reports_progress else None,
                owner=spill_owner(exec),
            )
        except (FileNotFoundError, PermissionError) as exc:
            if exec.signal.aborted:
                raise AbortError() from exc
            if confined is not None and _runner_attributable(exc, spawn[0], workdir):
                raise SandboxUnavailableError(call_mode, str(exc)) from exc
            raise
        if outcome.aborted:
            raise AbortError()
        exit_code: int | None = outcome.returncode if outcome.returncode >= 0 else None
        signal_name: str | None = None
        if outcome.returncode < 0:
            try:
                signal_name = signals.Signals(-outcome.returncode).name
            except ValueError:
                signal_name = f"SIG{-outcome.returncode}"
        value: dict[str, Any] = {
            "kind": "foreground",
            "exitCode": exit_code,
            "signal": signal_name,
            "timedOut": outcome.timed_out,
            "aborted": False,
            "timeoutMs": int(timeout_ms) if timeout_ms.is_integer() else timeout_ms,
            "stdout": outcome.stdout,
            "stderr": outcome.stderr,
        }
        if confined is None:
            value["sandbox"] = {"mode": "danger-full-access", "denied": False}
        else:
            failure = confined.runner_failure(exit_code, outcome.stderr_text)
            if failure is not None:
                raise SandboxUnavailableError(call_mode, failure)
            value["sandbox"] = {
                "mode": call_mode,
                "denied": confined.is_denial(exit_code, outcome.stderr_text),
                "enforcement": confined.enforcement,
            }
        return value

    return ToolDefinition(
        name="bash",
        description=BASH_DESCRIPTION + (ESCALATION_DESCRIPTION if escalation else ""),
        parameters=bash_parameters(escalation),
        execute=execute,
        output=ToolOutput(schema=OUTPUT_SCHEMA, render=render),
    )
