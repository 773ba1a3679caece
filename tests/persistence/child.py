"""A separate OS process that writes through a persistence backend, for lock and crash tests.

Usage: ``python child.py <command> <session-id> [args]`` with the environment
variable ``DSH_TEST_BACKEND`` holding Python source that defines
``make_backend(spawn)``. Commands:

* ``hold``: open the session for writing, print ``locked``, then wait forever
  (the parent SIGKILLs it).
* ``race <go-file>``: wait until ``go-file`` exists (so racers start together), try
  to open the session for writing; print ``won`` and wait forever, or print
  ``owned`` (``SessionAlreadyOwnedError``) and exit.
* ``write <batch> [create]``: (create or) open the session and loop forever:
  append ``batch`` events of a deterministic log, flush, print
  ``flushed <next_seq>`` — so the parent knows what was durable when it kills us.

Every line is flushed at once; the parent reads them as they come.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import header, turn


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
            from dsh_host.session.persistence import SessionAlreadyOwnedError

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
