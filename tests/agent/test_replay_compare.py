"""``dsh replay``'s comparison (D28) over recorded logs: every divergence kind is named where it
is planted and nowhere else. The logs are real: written by the agent loop with a scripted model
through a real host, then folded by ``turn_records`` and compared."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_host._agent.replay import compare, turn_records
from dsh_host._session.events import SessionEvent

from .agent_helpers import scripted_host

pytestmark = pytest.mark.anyio

CALL = {"tool_calls": [{"name": "missing_tool", "arguments": {"a": 1}, "id": "c1"}]}
OTHER_ARGS = {"tool_calls": [{"name": "missing_tool", "arguments": {"a": 2}, "id": "c1"}]}
OTHER_TOOL = {"tool_calls": [{"name": "other_tool", "arguments": {"a": 1}, "id": "c1"}]}


async def recorded(responses: list[Any], prompts: list[str]) -> list[SessionEvent]:
    async with scripted_host(responses) as host:
        agent = host.ctx.agent.create()
        for prompt in prompts:
            await agent.run_turn(prompt)
        events = list(agent.session.events)
        await agent.aclose()
    return events


@pytest.mark.parametrize(
    ("replayed", "kind"),
    [
        ([CALL, {"text": "done"}, {"text": "two"}], None),
        ([OTHER_ARGS, {"text": "done"}, {"text": "two"}], "different-arguments"),
        ([OTHER_TOOL, {"text": "done"}, {"text": "two"}], "different-tool"),
        ([{"text": "done"}, {"text": "two"}], "missing-call"),
        ([CALL, CALL, {"text": "done"}, {"text": "two"}], "extra-call"),
        ([CALL, {"text": "done differently"}, {"text": "two"}], "different-final-text"),
    ],
)
async def test_each_divergence_is_named_where_planted(
    replayed: list[Any], kind: str | None
) -> None:
    prompts = ["one", "two"]
    source = turn_records(await recorded([CALL, {"text": "done"}, {"text": "two"}], prompts))
    again = turn_records(await recorded(replayed, prompts))
    assert [t.prompt for t in source] == prompts
    assert source[0].calls == [("missing_tool", '{"a":1}')]
    report = compare("src", source, "rep", again)
    first = report.first_divergence
    assert (first["kind"] if first else None) == kind
    if kind is not None:
        assert first is not None and first["turn"] == 1
        assert report.turns[1]["divergence"] is None  # turn 2 did the same
    if kind == "different-final-text":
        assert report.turns[0]["finalTextDiff"].splitlines()[-2:] == ["-done",
                                                                     "+done differently"]


async def test_a_turn_the_replay_never_ran_is_missing() -> None:
    source = turn_records(await recorded([{"text": "a"}, {"text": "b"}], ["one", "two"]))
    again = turn_records(await recorded([{"text": "a"}], ["one"]))
    report = compare("src", source, "rep", again)
    assert report.first_divergence == {
        "turn": 2, "kind": "missing-turn", "detail": "the replay has no such turn",
    }  # fmt: skip


async def test_a_request_is_derived_again_only_on_a_detached_copy() -> None:
    """``Agent.derive_request`` appends what a live step appends: on a published session it
    would write into the real log, so it is refused there (the harness replay uses copies)."""
    from dsh_host._agent.errors import AgentConfigError
    from dsh_host._cancel import CancelToken
    from dsh_host._session.session import Session

    async with scripted_host([{"text": "done"}]) as host:
        agent = host.ctx.agent.create()
        await agent.run_turn("one")
        before = len(agent.session.events)
        with pytest.raises(AgentConfigError, match="live in the store"):
            await agent.derive_request(2, 1, [], None, CancelToken())
        assert len(agent.session.events) == before
        copy = Session.restore(agent.session.header, list(agent.session.events))
        request = await host.ctx.agent.detached(copy).derive_request(
            2, 1, [], agent.session.request_header(), CancelToken()
        )
        assert [m.role for m in request.messages] == [m.role for m in agent.session.derive_messages()]
        await agent.aclose()
