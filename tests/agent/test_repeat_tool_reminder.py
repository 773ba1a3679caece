"""The ``repeat-tool-reminder`` row (issue 14 item 4, DSH ``guard/repeat-tool-reminder``):
runs of identical calls draw DSH's reminders as plugin notices the model reads in its next
request, through a real agent loop and a scripted model."""

from __future__ import annotations

from typing import Any

import pytest
from dsh_repeat_tool_reminder import GENTLE_REMINDER, detailed_reminder

from dsh_host import CancelToken, Row
from dsh_host._session.messages import PluginSource, TextBlock, ToolResultMessage, UserMessage
from dsh_host._session.session import Session
from dsh_host._tools import Block, Deny, ToolExecution, ToolExecutionInput
from dsh_host.errors import ConfigError

from .agent_helpers import agent_service, model_requests, register_tool, scripted_host

pytestmark = pytest.mark.anyio


def calls(*specs: tuple[str, dict[str, Any]], then: str = "done") -> list[dict[str, Any]]:
    """One model response per call, then a text answer."""
    out: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": args}]} for name, args in specs
    ]
    return [*out, {"text": then}]


def same(count: int, name: str = "probe", args: dict[str, Any] | None = None) -> list[Any]:
    return [(name, {"q": "same"} if args is None else args)] * count


async def ok(args: Any, exec: ToolExecution) -> Any:
    return "ok"


def reminders(session: Session) -> list[tuple[str, PluginSource]]:
    """The guard's notices in the log: (text, source)."""
    out = []
    for event in session.events:
        message = event.data
        if (
            event.type == "user/message"
            and isinstance(message, UserMessage)
            and isinstance(message.source, PluginSource)
            and message.source.plugin == "repeat-tool-reminder"
        ):
            [block] = message.content
            assert isinstance(block, TextBlock)
            out.append((block.text, message.source))
    return out


def source(tool: str, count: int) -> PluginSource:
    return PluginSource(plugin="repeat-tool-reminder", form="notice", summary=f"{tool} × {count}")


async def run(responses: list[Any], *extra: Row, **config: Any) -> tuple[Session, list[Any]]:
    row = Row(name="repeat-tool-reminder", config=config)
    async with scripted_host(responses, row, *extra) as host:
        register_tool(host, "probe", ok)
        register_tool(host, "other", ok)
        agent = agent_service(host).create()
        await agent.run_turn("go")
        return agent.session, model_requests(host)


def texts_seen(messages: Any) -> list[str]:
    """The user-role texts of a message list (prompts and notices), in order."""
    return [
        block.text
        for message in messages
        if isinstance(message, UserMessage)
        for block in message.content
        if isinstance(block, TextBlock)
    ]


async def test_gentle_at_the_third_identical_call_detailed_at_the_fifth() -> None:
    session, requests = await run(calls(*same(5)))
    found = reminders(session)
    assert found == [
        (GENTLE_REMINDER, source("probe", 3)),
        (detailed_reminder("probe", 5, '{"q":"same"}'), source("probe", 5)),
    ]
    # what the model saw: nothing after two calls, the reminder right after the third result
    assert GENTLE_REMINDER not in texts_seen(requests[2].messages)
    fourth = requests[3].messages
    assert isinstance(fourth[-2], ToolResultMessage)
    assert isinstance(fourth[-1], UserMessage) and fourth[-1].content == (
        TextBlock(text=GENTLE_REMINDER),
    )
    assert session.derive_messages()[-1].content == (TextBlock(text="done"),)
    assert GENTLE_REMINDER in texts_seen(session.derive_messages())


async def test_the_gentle_text_follows_the_first_threshold_not_the_number_3() -> None:
    session, _ = await run(calls(*same(4, args={})), thresholds=[4, 2])
    found = [text for text, _ in reminders(session)]
    assert found == [GENTLE_REMINDER, detailed_reminder("probe", 4, "{}")]


async def test_the_detailed_arguments_are_capped_but_detection_uses_all_of_them() -> None:
    big = {"body": "x" * 400}
    session, _ = await run(calls(*same(3, args=big)), thresholds=[2, 3], argumentsPreviewChars=24)
    [(gentle, _), (detailed, _)] = reminders(session)
    assert gentle == GENTLE_REMINDER
    assert "- arguments: " + '{"body":"' + "x" * 15 + "… (+387 more chars)\n" in detailed
    assert "x" * 400 not in detailed


async def test_a_different_tracked_call_resets_the_run() -> None:
    specs = [*same(2, args={"q": 1}), ("other", {}), *same(3, args={"q": 1})]
    session, _ = await run(calls(*specs))
    assert len(reminders(session)) == 1


async def test_excluded_calls_neither_count_nor_reset() -> None:
    specs = [
        ("probe", {"q": 1}),
        ("other", {}),
        ("probe", {"q": 1}),
        ("other", {}),
        ("probe", {"q": 1}),
    ]
    session, _ = await run(calls(*specs), exclude=["other"])
    assert [text for text, _ in reminders(session)] == [GENTLE_REMINDER]


async def test_include_wildcards_track_only_matching_tools() -> None:
    specs = [*same(3, "other", {}), *same(3, "probe", {})]
    session, _ = await run(calls(*specs), include=["pro*"])
    assert [s.summary for _, s in reminders(session)] == ["probe × 3"]


async def test_patterns_are_wildcards_not_regular_expressions() -> None:
    session, _ = await run(calls(*same(3, args={})), exclude=["pr.be"])
    assert len(reminders(session)) == 1


async def test_argument_key_order_does_not_matter_deeply() -> None:
    specs = [
        ("probe", {"a": 1, "nested": {"x": [1, 2], "y": None}}),
        ("probe", {"nested": {"y": None, "x": [1, 2]}, "a": 1}),
        ("probe", {"a": 1, "nested": {"x": [1, 2], "y": None}}),
    ]
    session, _ = await run(calls(*specs))
    assert len(reminders(session)) == 1


async def test_arguments_with_a_lone_surrogate_stay_invalid_args_and_are_counted() -> None:
    raw = '{"path": "\\udcff"}'  # the model's JSON text: an escaped lone surrogate
    responses = [{"tool_calls": [{"name": "probe", "arguments": raw}]}] * 3 + [{"text": "ok"}]
    async with scripted_host(responses, Row(name="repeat-tool-reminder")) as host:
        register_tool(
            host,
            "probe",
            ok,
            parameters={"type": "object", "properties": {"path": {"type": "string"}}},
        )
        agent = agent_service(host).create()
        await agent.run_turn("go")
    codes = [e.data.error.code for e in agent.session.events if e.type == "tool/result"]
    assert codes == ["INVALID_ARGS"] * 3
    assert [text for text, _ in reminders(agent.session)] == [GENTLE_REMINDER]


async def test_two_agents_keep_separate_runs() -> None:
    responses = calls(*same(2), then="a done") + calls(*same(3), then="b done")
    dsh_row = Row(name="@deepseek-ai/dsh-repeat-tool-reminder")  # DSH's spelling loads too
    async with scripted_host(responses, dsh_row) as host:
        register_tool(host, "probe", ok)
        a = agent_service(host).create()
        b = agent_service(host).create()
        await a.run_turn("go")
        # b's first call would be a's third if runs were shared
        await b.run_turn("go")
    assert reminders(a.session) == []
    assert [s.summary for _, s in reminders(b.session)] == ["probe × 3"]


async def test_a_new_user_prompt_resets_the_run() -> None:
    responses = calls(*same(2), then="turn one") + calls(*same(1), then="turn two")
    async with scripted_host(responses, Row(name="repeat-tool-reminder")) as host:
        register_tool(host, "probe", ok)
        agent = agent_service(host).create()
        await agent.run_turn("go")
        await agent.run_turn("again")
    assert reminders(agent.session) == []


async def test_denied_calls_count() -> None:
    async with scripted_host(
        calls(*same(2)), Row(name="repeat-tool-reminder", config={"thresholds": [2]})
    ) as host:
        register_tool(host, "probe", ok)

        async def deny(exec: ToolExecution, next_: Any) -> Any:
            return Deny("sealed")

        host.ctx.on("tools/pre-execute", deny)
        agent = agent_service(host).create()
        await agent.run_turn("go")
    assert [text for text, _ in reminders(agent.session)] == [GENTLE_REMINDER]


async def test_calls_without_an_agent_are_ignored() -> None:
    row = Row(name="repeat-tool-reminder", config={"thresholds": [2]})
    async with scripted_host(calls(*same(1)), row) as host:
        register_tool(host, "probe", ok)
        for n in range(3):
            await host.ctx.tools.execute(
                ToolExecutionInput(
                    call_id=f"d{n}", name="probe", arguments={"q": "same"}, signal=CancelToken()
                )
            )
        agent = agent_service(host).create()
        await agent.run_turn("go")
    assert reminders(agent.session) == []


async def test_the_reminder_rides_a_downstream_block_and_keeps_its_contexts() -> None:
    row = Row(name="repeat-tool-reminder", config={"thresholds": [2]})
    theirs = UserMessage(
        id="theirs", content=(TextBlock(text="downstream"),), source=PluginSource(plugin="test")
    )
    async with scripted_host(calls(*same(2)), row) as host:
        register_tool(host, "probe", ok)

        async def block(post: Any, next_: Any) -> Any:  # registered after the row: inner
            return Block((TextBlock(text="nope"),), (theirs,))

        host.ctx.on("tools/post-execute", block)
        agent = agent_service(host).create()
        await agent.run_turn("go")
    notices = [
        e.data.content[0].text
        for e in agent.session.events
        if e.type == "user/message" and isinstance(e.data.source, PluginSource)
    ]
    assert notices == ["downstream", GENTLE_REMINDER, "downstream"]
    results = [e.data for e in agent.session.events if e.type == "tool/result"]
    assert all(r.message.content[0].content == (TextBlock(text="nope"),) for r in results)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"thresholds": []}, "config: thresholds must not be empty"),
        (
            {"thresholds": [1, 3]},
            "repeat-tool-reminder.*invalid threshold 1 — every threshold must be an integer >= 2",
        ),
        ({"thresholds": [2.5]}, "config.thresholds"),
        ({"thresholds": [3, 3]}, "thresholds must not contain duplicates"),
        ({"argumentsPreviewChars": 0}, "invalid arguments_preview_chars 0"),
        ({"limit": 3}, "limit"),
    ],
)
async def test_bad_config_fails_at_load(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        async with scripted_host([{"text": "x"}], Row(name="repeat-tool-reminder", config=config)):
            pass
