"""Test doubles for plugin authors: a scripted model, an in-memory store, a fake clock, a host.

A plugin is tested the way dsh tests its own: against a real host with real services, where only
the model (and, if you like, the disk and the clock) is replaced by a deterministic double::

    from dsh_host.testing import FakeClock, open_test_host

    async def test_my_plugin_counts_the_call() -> None:
        script = [{"tool_calls": [{"name": "word_count", "arguments": {"text": "a b"}}]},
                  {"text": "two words"}]
        async with open_test_host(MyPlugin, responses=script) as harness:
            agent = harness.new_agent(clock=FakeClock())
            await agent.run_turn("count")
            second = harness.model_requests()[1]   # carries the tool result the model read

(``tests/test_testing.py`` runs complete examples.)

- :func:`scripted_model`: the ``llm-scripted`` row (``plugins/dsh_llm_scripted``; D10 in
  docs/decisions.md): each model request takes the next scripted response and streams it the way a
  real provider's adapter does. The script is validated when the host boots; a mistake fails the
  boot naming the key path.
- :func:`memory_store`: the ``session-persistence-memory`` row, a fresh store per call unless you
  name one (two hosts naming the same store share its sessions, for a resume test).
- :class:`FakeClock`: a deterministic millisecond clock for ``Session.create(id, clock=...)``.
- :func:`plugin_row`: a row for a plugin class (``module:Class``), with its config.
- :func:`open_test_host`: the core rows (sessions, llm, tools, agent), a scripted model, an
  in-memory store with the checkpoint policy that flushes it, and your plugins; yields a
  :class:`ScriptedHost`.
- :func:`recorded_sessions`: the sessions stored in a directory as pytest cases, each checked by
  the harness replay (D32): the build must still derive every recorded request; or replayed with
  another model (``check_model``, D28) on a copy of the directory.

Everything here runs the real code paths: the doubles are plugin rows like any other, so the
bus, the checkpoint barriers and the agent loop are the ones a user gets. See docs/plugins.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ._agent import AGENT, Agent, AgentService
from ._llm import LlmRequest
from ._loader import PluginHost, Row, open_host
from ._plugin import Plugin
from ._session import SESSIONS, Session
from ._session.header import SessionHeader, new_session_id, now_ms
from ._shipped_plugins import FRONT_DOOR_ROWS
from ._tools import TOOLS, ToolRuntime

if TYPE_CHECKING:
    from ._agent.harness import HarnessReport
    from ._agent.replay import ReplayReport

__all__ = [
    "FakeClock",
    "RecordedSession",
    "ScriptedHost",
    "memory_store",
    "open_test_host",
    "plugin_row",
    "recorded_sessions",
    "scripted_model",
]

PluginSpec = type[Plugin] | Row | str
"""A plugin for :func:`open_test_host`: a plugin class, a ready :class:`Row`, or an entry-point
name (``"tool-rules"``) or ``module:Class`` string."""


class FakeClock:
    """A deterministic millisecond clock: ``start``, then ``step`` more on every read.

    Pass it where dsh takes a clock (``Session.create(session_id, clock=FakeClock())``): event
    timestamps become 1000, 1001, 1002, ... so a stored log is the same on every run.
    :meth:`advance` jumps forward (a "later" without sleeping); :attr:`reads` counts the reads.
    """

    def __init__(self, start: int = 1000, step: int = 1) -> None:
        if step < 0:
            raise ValueError(f"FakeClock(step={step}): time never runs back")
        self._next = start
        self._step = step
        self.reads = 0

    def __call__(self) -> int:
        now = self._next
        self._next += self._step
        self.reads += 1
        return now

    def advance(self, ms: int) -> None:
        """Move the clock ``ms`` milliseconds forward."""
        if ms < 0:
            raise ValueError(f"FakeClock.advance({ms}): time never runs back")
        self._next += ms


def scripted_model(
    responses: Sequence[object] = (),
    *,
    provider: str = "scripted",
    model: str = "scripted",
    context_window: int | None = None,
    compaction_responses: Sequence[object] | None = None,
    row_id: str = "model",
) -> Row:
    """The deterministic model as a row: one scripted response per model request.

    A response is a mapping in the script format of ``plugins/dsh_llm_scripted/README.md``
    (``text``, ``reasoning``, ``tool_calls``, ``usage``, ``error``, ``hang``, ...). A request past
    the end of the script fails with ``SCRIPT_EXHAUSTED``, as a real provider's error would.
    """
    config: dict[str, Any] = {
        "responses": _script("responses", responses),
        "provider": provider,
        "model": model,
    }
    if context_window is not None:
        config["context_window"] = context_window
    if compaction_responses is not None:
        config["compaction_responses"] = _script("compaction_responses", compaction_responses)
    return Row(id=row_id, name=FRONT_DOOR_ROWS["scripted-model"].plugin, config=config)


def _script(key: str, responses: Sequence[object]) -> list[dict[str, Any]]:
    if isinstance(responses, str | bytes):
        raise TypeError(f"scripted_model: {key} is a list of response mappings, not a string")
    out: list[dict[str, Any]] = []
    for index, response in enumerate(responses):
        if not isinstance(response, Mapping):
            raise TypeError(
                f"scripted_model: {key}[{index}] is a {type(response).__name__}; give a mapping "
                'such as {"text": "..."} (plugins/dsh_llm_scripted/README.md)'
            )
        out.append(dict(response))
    return out


def memory_store(store: str | None = None) -> Row:
    """Sessions kept in this process's memory (``session-persistence-memory``).

    Every call without ``store`` is a new, empty store, so tests never see each other's
    sessions; name a store to share it between two hosts of one test (crash and resume).
    """
    name = store if store is not None else f"test-{uuid.uuid4().hex}"
    default = FRONT_DOOR_ROWS["memory-store"]
    return Row(id=default.id, name=default.plugin, config={"store": name})


def plugin_row(
    plugin: type[Plugin] | str,
    config: Mapping[str, Any] | msgspec.Struct | None = None,
    *,
    row_id: str | None = None,
) -> Row:
    """A row for ``plugin``: a class (named ``module:Class``) or an entry-point name.

    ``config`` is the row's ``config:`` mapping, or an instance of the plugin's ``Config`` struct
    (encoded to its wire form, so the host validates it like a YAML row).
    """
    if isinstance(plugin, str):
        name = plugin
    else:
        if "<locals>" in plugin.__qualname__:
            raise TypeError(
                f"plugin_row({plugin.__qualname__}): the host imports a plugin by module path; "
                "define the class at module level"
            )
        name = f"{plugin.__module__}:{plugin.__qualname__}"
    if isinstance(config, msgspec.Struct):
        as_mapping: dict[str, Any] | None = msgspec.to_builtins(config)
    else:
        as_mapping = dict(config) if config is not None else None
    return Row(id=row_id, name=name, config=as_mapping)


@dataclass(frozen=True)
class ScriptedHost:
    """A booted host with a scripted model: typed handles on what a plugin test reads."""

    host: PluginHost
    model_row: str = "model"

    @property
    def agents(self) -> AgentService:
        """The agent service: ``agents.create(...)`` makes an agent on a new session."""
        return self.host.ctx.service(AGENT)

    @property
    def tools(self) -> ToolRuntime:
        """The tool runtime: register a tool, or execute a call through the whole pipeline."""
        return self.host.ctx.service(TOOLS)

    def new_session(
        self, session_id: str | None = None, *, clock: Callable[[], int] | None = None
    ) -> Session:
        """A new live session in this host's store; ``clock`` (a :class:`FakeClock`) stamps its
        header and every event, so the log is the same on every run."""
        sid = session_id if session_id is not None else new_session_id()
        stamp = clock if clock is not None else now_ms
        header = SessionHeader(id=sid, created_at=int(stamp()), cwd=os.path.abspath(os.getcwd()))
        session = Session.create(sid, header=header, clock=stamp)
        return self.host.ctx.service(SESSIONS).attach(session)

    def new_agent(
        self,
        *,
        session_id: str | None = None,
        clock: Callable[[], int] | None = None,
        **options: Any,
    ) -> Agent:
        """An agent on a new session, on the scripted model; ``options`` go to
        ``agents.create`` (``max_steps_per_turn``, ``budget``, ...)."""
        session = self.new_session(session_id, clock=clock)
        return self.agents.create(session=session, **options)

    def model_requests(self) -> list[LlmRequest]:
        """Every request the scripted model received, in order (what the model was shown)."""
        for fiber in self.host.fibers:
            if fiber.id == self.model_row:
                adapter = getattr(fiber.instance, "adapter", None)
                requests = getattr(adapter, "requests", None)
                if not isinstance(requests, list):
                    raise TypeError(f"row {self.model_row!r} is not an llm-scripted row")
                return list(requests)
        raise KeyError(f"no row {self.model_row!r} in this host")


def _storage_rows(store: Row | bool) -> list[Row]:
    """The store and, with one, the checkpoint policy that flushes it (as configs/default.yml)."""
    if store is False:
        return []
    default = FRONT_DOOR_ROWS["checkpoints"]
    policy = Row(id=default.id, name=default.plugin)
    return [memory_store() if store is True else store, policy]


@asynccontextmanager
async def open_test_host(
    *plugins: PluginSpec,
    responses: Sequence[object] = (),
    model: Row | None = None,
    store: Row | bool = True,
    agent: Mapping[str, Any] | None = None,
) -> AsyncIterator[ScriptedHost]:
    """Boot sessions, llm, tools, a scripted model, an in-memory store, the agent and ``plugins``.

    ``responses`` script the model (or pass a whole ``model`` row from :func:`scripted_model`);
    ``store``: True (a fresh in-memory store), False (no persistence row: sessions live only as
    objects), or any persistence row (a named :func:`memory_store`, a JSONL root); ``agent`` is the
    agent row's
    config (``max_steps_per_turn``, ...). A row that does not activate fails the boot with
    :class:`~dsh_host.errors.BootError` naming it. Everything is disposed on exit.
    """
    model_row = model if model is not None else scripted_model(responses)
    if model is not None and responses:
        raise TypeError("open_test_host: pass responses or a model row, not both")
    config = model_row.config or {}
    agent_config = {
        "provider": config.get("provider", "scripted"),
        "model": config.get("model", "scripted"),
        **(agent or {}),
    }
    rows = [
        Row(name="sessions"),
        Row(name="llm"),
        Row(name="tools"),
        model_row,
        *_storage_rows(store),
        Row(name="agent", config=agent_config),
        *(p if isinstance(p, Row) else plugin_row(p) for p in plugins),
    ]
    async with open_host(rows) as host:
        yield ScriptedHost(host, model_row.id or "model")


@dataclass(frozen=True, slots=True)
class RecordedSession:
    """One stored session of a directory, as a pytest case (see :func:`recorded_sessions`)."""

    session_id: str
    root: str
    config: str | None = None

    def __str__(self) -> str:  # the case's id in pytest's report (``ids=str``)
        return self.session_id

    def harness(self) -> HarnessReport:
        """The harness replay (D32): every request derived again under the composition, as
        ``dsh replay ID --same-model --config CONFIG --root ROOT`` does it (no model call)."""
        from ._cli.replay_cmd import harness_report

        args = argparse.Namespace(
            session_id=self.session_id, config=self.config, root=self.root, model=None
        )
        return harness_report(args)

    def check(self) -> HarnessReport:
        """:meth:`harness`, failing the test with the whole report on any difference."""
        report = self.harness()
        if not report.identical:
            raise AssertionError(f"recorded session {self.session_id} is derived differently "
                                 f"by this build:\n{report.render()}")  # fmt: skip
        return report

    def replay(self, model: str) -> ReplayReport:
        """The model replay (D28, ``dsh replay ID --model MODEL``): each recorded prompt run
        with ``model``, no effect executed. It runs on a copy of the directory (the replay is a
        new session, and the recorded directory stays as it is)."""
        from ._cli.replay_cmd import replay_report

        with tempfile.TemporaryDirectory(prefix="dsh-replay-") as scratch:
            copy = os.path.join(scratch, "root")
            shutil.copytree(self.root, copy)
            args = argparse.Namespace(
                session_id=self.session_id, config=self.config, root=copy, model=model,
                from_turn=1, child_id=None,
            )  # fmt: skip
            return replay_report(args)

    def check_model(self, model: str) -> ReplayReport:
        """:meth:`replay`, failing the test naming each turn that diverged."""
        report = self.replay(model)
        if report.diverged:
            turns = [f"turn {row['turn']}: {row['divergence']}" for row in report.turns
                     if row["divergence"] is not None]  # fmt: skip
            raise AssertionError(f"recorded session {self.session_id} diverges with {model}:\n"
                                 + "\n".join(turns))  # fmt: skip
        return report


def recorded_sessions(
    root: str | os.PathLike[str], *, config: str | os.PathLike[str] | None = None
) -> list[RecordedSession]:
    """Every session stored under ``root`` (the store ``config`` composes, default the one
    ``dsh`` uses here, with its root set to ``root``), by id, as pytest cases::

        CASES = recorded_sessions("tests/recorded", config="dsh.yml")

        @pytest.mark.parametrize("case", CASES, ids=str)
        def test_the_build_still_asks_what_was_recorded(case: RecordedSession) -> None:
            case.check()

    Each case's :meth:`~RecordedSession.check` runs the harness replay (D32) and fails naming
    the step and part that differ. Listing boots the store only; nothing is written.
    """
    from ._cli.common import load_composition, persistence_rows, run_with_host
    from ._persistence.keys import SESSION_PERSISTENCE

    root_text = os.fspath(root)
    config_text = os.fspath(config) if config is not None else None
    args = argparse.Namespace(config=config_text, root=root_text)

    async def listed(host: PluginHost) -> list[str]:
        listings = await host.ctx.service(SESSION_PERSISTENCE).list()
        return sorted(listing.header.id for listing in listings)

    ids = run_with_host(persistence_rows(load_composition(args)[1]), listed)
    return [RecordedSession(i, root_text, config_text) for i in ids]
