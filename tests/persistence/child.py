"""A separate OS process that writes through a persistence backend, for lock and crash tests.

Usage: ``python child.py <command> <session-id> [args]`` with the environment
variable ``DSH_TEST_BACKEND`` holding Python source that defines
``make_backend(spawn)``. Commands:

* ``hold``: open the session for writing, print ``locked``, then wait forever
  (the parent SIGKILLs it).
* ``race <go-file>``: wait until ``go-file`` exists (so racers start together), try
  to open the session for writing; print ``won`` and wait forever, or print
  ``owned`` (``SessionAlreadyOwnedError``) and exit.
* ``step <name>``: write through the numbered protocol of docs/format.md §4 and
  SIGKILL ourselves at step ``<name>`` (see ``FAILPOINTS``); prints nothing.
* ``write <batch> [create]``: (create or) open the session and loop forever:
  append ``batch`` events of a deterministic log, flush, print
  ``flushed <next_seq>`` — so the parent knows what was durable when it kills us.

Every line is flushed at once; the parent reads them as they come.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from persistence.helpers import header, log, turn


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _path_of(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _is_temp(fd: int) -> bool:
    return _path_of(fd).endswith(".tmp")


def _is_log(fd: int) -> bool:
    return re.match(r"session\.v[0-9]+\.jsonl", os.path.basename(_path_of(fd))) is not None


def arm_failpoint(step: str) -> None:
    """Replace ``os`` functions so that the process dies at ``step`` (docs/format.md §4)."""
    real_write, real_fsync, real_link = os.write, os.fsync, os.link
    real_unlink, real_ftruncate = os.unlink, os.ftruncate
    state = {"truncated": False}

    def half_then_die(fd: int, data: Any) -> int:
        view = memoryview(data)
        real_write(fd, view[: max(1, len(view) // 2)])
        _kill()
        raise AssertionError("unreachable")

    def write(fd: int, data: Any) -> int:
        if step in ("P4", "G2") and _is_temp(fd):
            half_then_die(fd, data)
        if (step == "W3" or (step == "R2" and state["truncated"])) and _is_log(fd):
            half_then_die(fd, data)
        return real_write(fd, data)

    def fsync(fd: Any) -> None:
        if step == "P5" and _is_temp(fd):
            _kill()
        if step == "W4-before" and _is_log(fd):
            _kill()
        real_fsync(fd)
        if step == "W4-after" and _is_log(fd):
            _kill()
        if step == "R1" and state["truncated"] and _is_log(fd):
            _kill()

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        if step in ("P6-before", "G5-before"):
            _kill()
        real_link(src, dst, **kwargs)
        if step in ("P6-after", "G5-after"):
            _kill()

    def unlink(path: Any, **kwargs: Any) -> None:
        if step == "P8" and str(path).endswith(".tmp"):
            _kill()
        real_unlink(path, **kwargs)

    def ftruncate(fd: int, length: int) -> None:
        real_ftruncate(fd, length)
        state["truncated"] = True

    os.write, os.fsync, os.link, os.unlink, os.ftruncate = (
        write,
        fsync,
        link,
        unlink,
        ftruncate,
    )


def _backend(spawn: Any) -> Any:
    namespace: dict[str, Any] = {}
    exec(os.environ["DSH_TEST_BACKEND"], namespace)
    return namespace["make_backend"](spawn)


def deterministic_events(count: int) -> list[dict[str, Any]]:
    """The same event stream on every call: turns with a tool call each, padded with text."""
    events: list[dict[str, Any]] = []
    turn_no = 0
    while len(events) < count:
        turn_no += 1
        events += turn(len(events), turn_no, tools=2)
    return events[:count]


async def main(argv: list[str]) -> None:
    command, session_id = argv[0], argv[1]
    async with anyio.create_task_group() as tg:
        backend = _backend(tg.start_soon)
        if command == "hold":
            await backend.open(session_id, "write")
            print("locked", flush=True)
            await anyio.sleep_forever()
        elif command == "race":
            from dsh_host._persistence.persistence import SessionAlreadyOwnedError

            go = anyio.Path(argv[2])
            while not await go.exists():  # noqa: ASYNC110 - another process creates it
                await anyio.sleep(0.001)
            try:
                await backend.open(session_id, "write")
            except SessionAlreadyOwnedError:
                print("owned", flush=True)
                return
            print("won", flush=True)
            await anyio.sleep_forever()
        elif command == "step":
            step = argv[2]
            events = log(2)
            if step[0] == "P":  # first publication of a created session
                handle = await backend.create(header(session_id))
                handle.append(events[:6])
                arm_failpoint(step)
                await handle.flush()
            elif step[0] == "W":  # a later batch
                handle = await backend.create(header(session_id))
                handle.append(events[:6])
                await handle.flush()
                handle.append(events[6:])
                arm_failpoint(step)
                await handle.flush()
            else:  # R (the parent tore the tail) and G (the parent wrote a v0 log)
                arm_failpoint(step)
                handle = await backend.open(session_id, "write")
                await handle.flush()
            print("survived", flush=True)
        elif command == "write":
            batch = int(argv[2])
            if len(argv) > 3 and argv[3] == "create":
                handle = await backend.create(header(session_id))
                await handle.flush()
            else:
                handle = await backend.open(session_id, "write")
            stream = deterministic_events(5_000)
            while True:
                start = handle.next_seq
                handle.append(stream[start : start + batch])
                await handle.flush()
                print(f"flushed {handle.next_seq}", flush=True)
        else:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
