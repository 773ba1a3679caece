"""The terminal approval answerer: ``allow once? [y/N]`` on an interactive TTY.

The ``user-approval`` plugin ships no answerer (D8); a front end
supplies one. This is the ``dsh`` command line's: an ``approval/request``
listener that shows the person at the terminal what is being asked — tool
name, call id, reason, and the call's arguments *as the session logged them*
in its ``tool/call`` event (the request object deliberately carries no
arguments, so what is shown is exactly what is audited) — and reads one line:

- ``y`` / ``yes`` (any case) → ``allowed-once``;
- anything else, including an empty line or end-of-file → ``rejected``;
- Ctrl-C while the prompt is open → ``cancelled``; ``dsh run`` also cancels
  the turn then (``on_interrupt``, D18), as Ctrl-C does anywhere else in a
  run. Without ``on_interrupt`` only the question is withdrawn.

With no interactive TTY on stdin (a pipe, ``/dev/null``, a closed descriptor)
:func:`install_terminal_answerer` registers nothing, so every ask resolves
``unavailable`` and fails closed — a headless ``dsh run`` never hangs on a
prompt nobody can see.

Everything printed that came from the model or the log (arguments, reason,
even the tool name) is escaped (:func:`~dsh_host._cli.render.terminal_safe`) so
control characters, ANSI escape sequences and bidi overrides cannot redraw or
disguise the prompt. On a terminal the prompt starts by resetting the scroll
region and the character attributes (``ESC [r``, ``ESC [0m``, the cursor saved and
restored around the first, which would move it home), in case anything printed before it left
them changed. The arguments are shown in full; when
they are longer than :data:`MAX_SHOWN_ARGUMENTS` characters the prompt says how
many are hidden and the call is **rejected without asking** (nobody can
approve what they cannot see; the full arguments are in the session log).

Prompts are serialised: two concurrent asks (parallel tool calls) are shown
one after the other, never interleaved. If the request is withdrawn while the
prompt is open (its token aborts), the approval service cancels this listener;
the prompt is closed with a ``(withdrawn)`` line and nothing is read for it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any, Final, TextIO

import anyio

from dsh_host._tools.keys import APPROVAL_REQUEST

from .._context import Context
from .output import status_line
from .render import terminal_safe

__all__ = [
    "PROMPT",
    "TERMINAL_RESET",
    "TerminalAnswerer",
    "hidden_characters",
    "install_terminal_answerer",
    "is_interactive",
    "render_request",
]

#: The question, exactly (D8).
PROMPT: Final = "allow once? [y/N] "
#: At most this many characters of the arguments are shown; a longer call is refused unasked.
MAX_SHOWN_ARGUMENTS: Final = 4000
#: Written before the prompt on a terminal: reset the scroll region, then all attributes.
#: Resetting the region (DECSTBM, ``ESC [r``) also moves the cursor home, which put the prompt
#: over older output at the top of the screen and let the rest of the turn overwrite it, so the
#: cursor is saved first and restored after (DECSC ``ESC 7`` / DECRC ``ESC 8``): the prompt
#: appears where the transcript stopped.
TERMINAL_RESET: Final = "\x1b7\x1b[r\x1b8\x1b[0m"

_YES: Final = frozenset({"y", "yes"})


def is_interactive(fd: int = 0) -> bool:
    """True when ``fd`` is an open descriptor on a terminal (False for pipes, files, closed)."""
    try:
        return os.isatty(fd)
    except (OSError, ValueError):
        return False


def install_terminal_answerer(
    ctx: Context,
    *,
    input_fd: int = 0,
    output: TextIO | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> Callable[[], Any] | None:
    """Register a :class:`TerminalAnswerer` on ``approval/request`` if ``input_fd`` is a TTY.

    Returns the listener's disposer, or None when nothing was registered (no
    TTY: every ask then resolves ``unavailable``). ``dsh run`` calls this on
    its root context before starting the agent, with ``on_interrupt`` set so
    that Ctrl-C at the prompt cancels the whole turn (D18).
    """
    if not is_interactive(input_fd):
        return None
    answerer = TerminalAnswerer(input_fd=input_fd, output=output, on_interrupt=on_interrupt)
    return ctx.on(APPROVAL_REQUEST, answerer)


# --------------------------------------------------------------------------- rendering


def _escape(text: str, *, keep_newlines: bool = False) -> str:
    return terminal_safe(text, multiline=keep_newlines)


def _field(data: Any, name: str, wire: str) -> Any:
    if isinstance(data, Mapping):
        return data.get(wire)
    return getattr(data, name, None)


def _logged_arguments(events: Sequence[Any], call_id: str) -> str | None:
    """The raw arguments of this turn's ``tool/call`` with ``call_id`` (None if not logged)."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type == "turn/start":
            return None
        if event.type == "tool/call" and _field(event.data, "call_id", "callId") == call_id:
            raw = _field(event.data, "arguments", "arguments")
            return raw if isinstance(raw, str) else None
    return None


def _pretty(raw: str) -> str:
    """Indented JSON when ``raw`` parses, else ``raw`` itself (what the tool will see)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(value, indent=2, ensure_ascii=False)


def hidden_characters(req: Any) -> int:
    """How many characters of the logged arguments :func:`render_request` leaves out."""
    raw = _request_arguments(req)
    return 0 if raw is None else max(0, len(_pretty(raw)) - MAX_SHOWN_ARGUMENTS)


def _request_arguments(req: Any) -> str | None:
    call_id = getattr(req, "call_id", None)
    if call_id is None:
        return None
    try:
        return _logged_arguments(req.agent.session.events, call_id)
    except AttributeError:
        return None


def render_request(req: Any) -> str:
    """The text shown above the prompt (pure; untrusted parts escaped)."""
    lines = ["", "dsh: approval needed"]
    lines.append(f"  tool:      {_escape(str(req.tool_name))}")
    call_id = getattr(req, "call_id", None)
    lines.append(f"  call id:   {_escape(call_id) if call_id is not None else '(none)'}")
    reason = getattr(req, "reason", None)
    lines.append(f"  reason:    {_escape(reason) if reason is not None else '(none given)'}")
    raw = _request_arguments(req)
    if raw is None:
        lines.append("  arguments: (no tool/call logged for this call id)")
    else:
        shown = _pretty(raw)
        suffix = ""
        if len(shown) > MAX_SHOWN_ARGUMENTS:
            hidden = len(shown) - MAX_SHOWN_ARGUMENTS
            shown = shown[:MAX_SHOWN_ARGUMENTS]
            suffix = (
                f"\n  … {hidden} more characters not shown (the full arguments are in the "
                "session log's tool/call event); a call that cannot be shown in full is "
                "rejected"
            )
        body = _escape(shown, keep_newlines=True).replace("\n", "\n    ")
        lines.append(f"  arguments:\n    {body}{suffix}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- answering


class _Interrupted(Exception):
    """Ctrl-C arrived while the prompt was open."""


class TerminalAnswerer:
    """An ``approval/request`` listener answering from a terminal (see the module docstring).

    ``input_fd`` must be a TTY in canonical (line) mode, as a shell leaves it.
    Ctrl-C is caught only while a prompt is open and only when running in the
    main thread (where signal handlers can be installed); elsewhere it keeps
    its usual meaning.
    """

    def __init__(
        self,
        *,
        input_fd: int = 0,
        output: TextIO | None = None,
        on_interrupt: Callable[[], None] | None = None,
    ) -> None:
        self._fd = input_fd
        self._output = output
        self._on_interrupt = on_interrupt
        self._lock = anyio.Lock()

    @property
    def output(self) -> TextIO:
        return self._output if self._output is not None else sys.stderr

    async def __call__(self, req: Any, next_: Callable[[], Awaitable[str]]) -> str:
        async with self._lock:
            with status_line().paused():  # the live status line never draws over a question
                return await self._ask(req)

    def _write(self, text: str) -> None:
        out = self.output
        out.write(text)
        out.flush()

    def _reset_terminal(self) -> None:
        """Undo a scroll region or attributes left by earlier output (only on a terminal)."""
        try:
            interactive = self.output.isatty()
        except (OSError, ValueError):
            interactive = False
        if interactive:
            self._write(TERMINAL_RESET)

    async def _ask(self, req: Any) -> str:
        self._reset_terminal()
        if hidden_characters(req):
            self._write(render_request(req) + "(rejected: too long to show in full)\n")
            return "rejected"
        with ExitStack() as stack:
            signals = _sigint_receiver(stack)
            self._write(render_request(req) + PROMPT)
            try:
                line = await self._read_answer(signals)
            except _Interrupted:
                self._write("^C\n(cancelled)\n")
                if self._on_interrupt is not None:
                    self._on_interrupt()  # the command cancels the turn, not only this ask
                return "cancelled"
            except anyio.get_cancelled_exc_class():
                self._write("\n(withdrawn)\n")  # the request's token aborted
                raise
        if line is None:  # end of file
            self._write("\n(rejected)\n")
            return "rejected"
        if line.strip().lower() in _YES:
            self._write("(allowed once)\n")
            return "allowed-once"
        self._write("(rejected)\n")
        return "rejected"

    async def _read_answer(self, signals: Any | None) -> str | None:
        """One line from the TTY, None at end of file; raises :class:`_Interrupted` on Ctrl-C."""
        if signals is None:
            return await self._read_line()
        outcome: list[str | None] = []
        interrupted = False
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                outcome.append(await self._read_line())
                tg.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(read)
            tg.start_soon(watch)
        if interrupted and not outcome:
            raise _Interrupted()
        return outcome[0] if outcome else None

    async def _read_line(self) -> str | None:
        """Wait (cancellably) until the terminal has a line, then read it.

        The descriptor is left blocking on purpose: ``O_NONBLOCK`` lives on the
        terminal's open file description, shared with the user's shell, and a
        process killed mid-prompt would leave the shell's stdin non-blocking.
        In canonical mode "readable" means a whole line (or end of file) is
        waiting, so the read does not block the event loop.
        """
        fd = self._fd
        buffer = b""
        while True:
            await anyio.wait_readable(fd)
            chunk = os.read(fd, 4096)
            if not chunk:
                return buffer.decode("utf-8", "replace") if buffer else None
            buffer += chunk
            if b"\n" in buffer:
                return buffer.split(b"\n", 1)[0].decode("utf-8", "replace")


def _sigint_receiver(stack: ExitStack) -> Any | None:
    """An anyio SIGINT receiver entered on ``stack``, or None where none can be installed."""
    try:
        receiver: AbstractContextManager[Any] = anyio.open_signal_receiver(signal.SIGINT)
        return stack.enter_context(receiver)
    except (RuntimeError, ValueError, NotImplementedError):
        return None
