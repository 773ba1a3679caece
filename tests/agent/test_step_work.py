"""Work a durable step of the shipped composition no longer repeats (docs/decisions.md D49).

Each test counts what one cut removed (a library loaded, a price computed, ...) over several
calls or steps; none times anything.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest

from dsh_host._tools import beneath


def test_libc_is_loaded_once_for_every_open_beneath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``openat2`` goes through libc's ``syscall``; loading libc (``ctypes.CDLL``) at every open
    cost more than the open (it ran at every ``read_file`` of a step)."""
    if not beneath.openat2_available():
        pytest.skip("this kernel has no openat2: the walk opens without libc")
    (tmp_path / "notes.txt").write_text("a line\n")
    loads: list[Any] = []
    real = ctypes.CDLL

    class CountingCDLL(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            loads.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", CountingCDLL)
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(5):
            fd = beneath.open_beneath(root, ("notes.txt",), os.O_RDONLY)
            assert os.read(fd, 7) == b"a line\n"
            os.close(fd)
    finally:
        os.close(root)
    assert len(loads) <= 1  # at most the first open of the process loads it


def test_a_model_the_catalogue_lacks_is_not_priced_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply of a route the price catalogue does not know (a scripted or local model) is
    priced at every step; once both of its lookups missed, nothing is built for the next."""
    import genai_prices

    from dsh_host._session.messages import TokenUsage
    from dsh_host._session.prices import PriceTable

    built: list[int] = []
    real = genai_prices.Usage

    class CountingUsage(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(genai_prices, "Usage", CountingUsage)
    table = PriceTable()
    usage = TokenUsage(input_tokens=100, output_tokens=20)
    route = ("no-such-route-d49", "no-such-model-d49")
    assert table.cost(*route, usage) is None  # both lookups miss: remembered
    built.clear()
    for _ in range(5):
        assert table.cost(*route, usage) is None
    assert built == []
    # A known model is still priced, every time.
    assert table.cost("openai", "gpt-4o", usage) is not None
    assert table.cost("openai", "gpt-4o", usage) is not None
    assert len(built) == 2


@pytest.mark.anyio
async def test_stream_chunks_are_dispatched_only_to_a_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``agent/chunk`` is emitted for every chunk of the model's stream; with nobody listening
    (a headless run, the shipped composition) no payload is built and nothing dispatched."""
    from dsh_host._agent import AGENT_CHUNK, ChunkReceived
    from dsh_host._bus import EventBus

    from .agent_helpers import agent_service, scripted_host

    dispatched: list[str] = []
    real_emit = EventBus.emit

    def counting_emit(self: EventBus, event: Any, *args: Any) -> None:
        name = event if isinstance(event, str) else event.name
        if name == AGENT_CHUNK.name:
            dispatched.append(name)
        real_emit(self, event, *args)

    monkeypatch.setattr(EventBus, "emit", counting_emit)
    responses = [{"text": "one two three"}, {"text": "four five six"}]
    async with scripted_host(responses) as host:
        agent = agent_service(host).create()
        await agent.run_turn("first")
        assert dispatched == []
        received: list[ChunkReceived] = []
        host.ctx.on(AGENT_CHUNK, received.append)
        await agent.run_turn("second")
    assert received and len(dispatched) == len(received)
    assert {r.turn for r in received} == {2}
    text = "".join(getattr(r.chunk, "text", "") for r in received)
    assert "four five six" in text


@pytest.mark.anyio
async def test_an_unchanged_system_prompt_is_rendered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sections are interpolated again only when a section or a variable changed; the
    request of every step still carries the prompt, and a change is rendered at its step."""
    from dsh_host._agent import prompt

    from .agent_helpers import agent_service, model_requests, register_tool, scripted_host

    interpolated: list[str] = []
    real = prompt._interpolate

    def counting(name: str, text: str, variables: Any, kind: str) -> str:
        if kind == "section":
            interpolated.append(name)
        return real(name, text, variables, kind)

    monkeypatch.setattr(prompt, "_interpolate", counting)
    call = {"text": "again", "tool_calls": [{"name": "noop", "arguments": {}}]}
    responses = [call, call, call, {"text": "done"}, {"text": "changed"}]

    async def noop(_args: Any, _execution: Any) -> str:
        return "ok"

    async with scripted_host(responses) as host:
        register_tool(host, "noop", noop)
        service = agent_service(host)
        service.system_prompt.variable("mood", lambda _context: mood[0])
        service.system_prompt.section("test:mood", 50, "Be {{mood}}.")
        mood = ["calm"]
        agent = service.create()
        await agent.run_turn("four steps")  # three tool steps and a closing one
        rendered_once = len(interpolated)
        mood[0] = "brief"
        await agent.run_turn("one step")
        systems = [
            e.data.message.content[0].text
            for e in agent.session.events
            if e.type == "system/message"
        ]
        requests = len(model_requests(host))
    sections = rendered_once  # every section, once
    assert sections >= 2 and interpolated[:sections].count("test:mood") == 1
    assert len(interpolated) == 2 * sections  # the changed variable: rendered again, once
    assert requests == 5
    assert len(systems) == 2  # logged at the first step, and again at the change
    assert systems[0].endswith("Be calm.") and systems[1].endswith("Be brief.")


@pytest.mark.anyio
async def test_the_compaction_policy_of_a_target_is_resolved_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compaction-basic's check before every step asks for the routed target's policy; it is
    resolved once per target (and again for a replaced config), not at every step."""
    import dsh_compaction_basic
    from dsh_compaction_basic import BasicCompactionConfig
    from dsh_compaction_basic.config import resolve_target_policy as real

    from dsh_host import Row

    from .agent_helpers import scripted_host

    resolved: list[tuple[str, str]] = []

    def counting(config: Any, provider: str, model: str) -> Any:
        resolved.append((provider, model))
        return real(config, provider, model)

    monkeypatch.setattr(dsh_compaction_basic, "resolve_target_policy", counting)
    rows = [Row(name="token-meter"), Row(name="compaction-basic", config={"threshold_ratio": 0.5})]
    async with scripted_host([], *rows) as host:
        engine = host.ctx.compaction
        first = [engine.policy_for("p", "m") for _ in range(5)]
        other = engine.policy_for("p", "n")
        assert resolved == [("p", "m"), ("p", "n")]
        assert all(policy is first[0] for policy in first)
        assert first[0].threshold_ratio == 0.5 and other.model == "n"
        engine.config = BasicCompactionConfig(threshold_ratio=0.6)
        assert engine.policy_for("p", "m").threshold_ratio == 0.6
        assert resolved[-1] == ("p", "m") and len(resolved) == 3


@pytest.mark.anyio
async def test_a_lone_call_is_not_classified_for_a_parallel_group() -> None:
    """A step's calls are grouped by ``is_concurrency_safe`` (its arguments checked against
    the schema first); the last call of a step is a group of one either way, so a step with
    one call (the usual step) runs no classifier. Several calls are still grouped."""
    from dsh_host._tools import ToolDefinition, text_output

    from .agent_helpers import agent_service, scripted_host, tools_of

    classified: list[Any] = []

    def concurrency_safe(args: Any) -> bool:
        classified.append(args)
        return True

    async def echo(args: Any, _execution: Any) -> str:
        return str(args.get("n"))

    one = {"text": "one", "tool_calls": [{"name": "echo", "arguments": {"n": 1}}]}
    two = {
        "text": "two",
        "tool_calls": [
            {"name": "echo", "arguments": {"n": 2}},
            {"name": "echo", "arguments": {"n": 3}},
        ],
    }
    async with scripted_host([one, one, one, {"text": "done"}, two, {"text": "done"}]) as host:
        tools_of(host).register(
            ToolDefinition(
                name="echo",
                description="echoes n",
                parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
                execute=echo,
                output=text_output(),
                is_concurrency_safe=concurrency_safe,
            )
        )
        agent = agent_service(host).create()
        await agent.run_turn("three lone calls")
        assert classified == []
        await agent.run_turn("two calls")
        results = [e for e in agent.session.events if e.type == "tool/result"]
    assert classified[:1] == [{"n": 2}]  # the first of two is classified: a parallel group
    assert len(results) == 5
