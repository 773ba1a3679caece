"""A real host for the checkpoint-policy tests, plus the probes that watch it.

Everything here is a real part: the ``sessions`` store, the JSONL backend
writing to a temp directory, the LLM and tools runtimes, and the policy row.
The probes are ordinary listeners and adapters registered on that host:

* :class:`Journal` -- what happened, in order (``flush:start``, ``flush:end``,
  ``downstream``, ``adapter``, ``body``...);
* :meth:`Probe.flush_listener` -- a ``session/flush`` listener that can hold a
  flush open (a gate) or reject it; it runs *in parallel* with the JSONL
  backend's own listener, so ``flush:end`` alone does not prove the disk write
  finished -- the tests also read the log back from disk at the moment the
  adapter or the tool body gets control;
* :class:`ProbeAdapter` -- a model adapter that records when it is constructed
  and what was durable at that moment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from dsh_llm_scripted import ScriptedResponse, response_chunks
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from dsh_host import Row, open_host
from dsh_host._llm import LlmAdapter, LlmRequest
from dsh_host._loader import PluginHost
from dsh_host._session import StreamChunk
from dsh_host._session.events import SessionEvent
from dsh_host.errors import DshError

POLICY_ROW = "session-checkpoints"


class DiskUnavailableError(DshError):
    """The failure a rejecting flush probe raises (an example text)."""

    code = "DISK_UNAVAILABLE"


def rows(
    root: Path, *, policy: bool = True, extra: Sequence[Row] = (), compression: str = "zstd"
) -> list[Row]:
    """The composition under test, in DSH's recommended order (policy right after persistence)."""
    out = [
        Row(name="sessions"),
        Row(
            id="session-persistence",
            name="session-persistence-jsonl",
            config={"root": str(root), "compression": compression},
        ),
    ]
    if policy:
        out.append(Row(id=POLICY_ROW, name="session-checkpoint-policy"))
    out += [Row(name="llm"), Row(name="tools"), *extra]
    return out


@dataclass
class Journal:
    entries: list[str] = field(default_factory=list)

    def add(self, entry: str) -> None:
        self.entries.append(entry)

    def count(self, entry: str) -> int:
        return self.entries.count(entry)


async def durable_events(root: Path, session_id: str) -> tuple[SessionEvent, ...]:
    """What a separate reader finds on disk right now (an empty tuple before publication)."""
    from dsh_host._persistence.persistence import SessionNotFoundError

    reader = JsonlSessionPersistence(str(root))
    try:
        handle = await reader.open(session_id, "read")
    except SessionNotFoundError:
        return ()
    load = await handle.read()
    return tuple(load.events)


class Probe:
    """Listeners and counters on one host (see the module docstring)."""

    def __init__(self, host: PluginHost, root: Path) -> None:
        self.host = host
        self.root = root
        self.journal = Journal()
        self.flushes = 0
        #: set to hold every flush open until the event is set
        self.gate: anyio.Event | None = None
        #: set to make every flush fail with this error
        self.reject: BaseException | None = None
        #: decides per flush whether to reject (overrides ``reject`` when set)
        self.reject_when: Callable[[Any], BaseException | None] | None = None
        self.flush_started = anyio.Event()

    def install_flush_listener(self) -> None:
        self.host.ctx.on("session/flush", self._on_flush)

    async def _on_flush(self, session: Any) -> None:
        self.flushes += 1
        self.journal.add("flush:start")
        self.flush_started.set()
        if self.gate is not None:
            await self.gate.wait()
        error = self.reject_when(session) if self.reject_when is not None else self.reject
        if error is not None:
            self.journal.add("flush:rejected")
            raise error
        self.journal.add("flush:end")

    def install_downstream_probe(self) -> None:
        """An ``llm/stream`` listener *inside* the policy: called only when it calls ``next()``."""

        def inner(
            request: LlmRequest, next_: Callable[[], AsyncIterator[StreamChunk]]
        ) -> AsyncIterator[StreamChunk]:
            self.journal.add("downstream")
            return next_()

        self.host.ctx.on("llm/stream", inner)


class ProbeAdapter(LlmAdapter):
    """Streams scripted responses; records construction and the durable log length then."""

    def __init__(
        self,
        journal: Journal,
        responses: Sequence[ScriptedResponse],
        *,
        root: Path | None = None,
    ) -> None:
        self.journal = journal
        self.responses = list(responses)
        self.root = root
        self.requests: list[LlmRequest] = []
        #: (live log length, durable log length) when each stream started
        self.seen: list[tuple[int, int]] = []

    def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        # Construction is the moment a real adapter would send the request.
        self.journal.add("adapter")
        self.requests.append(request)
        return self._run(request, len(self.requests))

    async def _run(self, request: LlmRequest, number: int) -> AsyncIterator[StreamChunk]:
        if self.root is not None and request.session is not None:
            durable = await durable_events(self.root, request.session.id)
            self.seen.append((len(request.session.events), len(durable)))
        response = self.responses[min(number, len(self.responses)) - 1]
        opening, closing = response_chunks(response, number)
        for chunk in (*opening, *closing):
            yield chunk


@asynccontextmanager
async def booted(
    root: Path, *, policy: bool = True, extra: Sequence[Row] = ()
) -> AsyncIterator[tuple[PluginHost, Probe]]:
    async with open_host(rows(root, policy=policy, extra=extra)) as host:
        yield host, Probe(host, root)
