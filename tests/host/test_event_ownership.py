"""One declaration per event, owned by the plugin that defines it and undone on unload (issue 17).

The host bus declares nothing itself: each layer's service plugin declares the events it
dispatches, and a plugin's own events go away with it.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dsh_host._bus import EventBus
from dsh_host._loader import Row, open_host
from dsh_host._session.keys import SESSION_EVENT, SESSION_EVENTS
from dsh_host._tools.keys import TOOLS_EVENTS, TOOLS_EXECUTE
from dsh_host.errors import HandlerKindError, UndeclaredEventError

from . import sample_plugins

pytestmark = pytest.mark.anyio


def test_a_bare_bus_declares_nothing() -> None:
    # The host layer no longer names the upper layers' events (CORE_EVENTS is gone).
    assert EventBus().specs() == []


async def test_a_plugins_event_disappears_when_it_is_unloaded() -> None:
    async with open_host([Row(id="owner", name="host.sample_plugins:PingOwner")]) as host:
        assert host.bus.spec("sample/ping") == sample_plugins.PING
        heard: list[str] = []
        host.ctx.on("sample/ping", heard.append)
        host.ctx.emit("sample/ping", "hi")
        assert heard == ["hi"]
        await host.unload("owner")
        assert not host.bus.is_declared("sample/ping")
        with pytest.raises(UndeclaredEventError, match="sample/ping"):
            host.ctx.emit("sample/ping", "again")


async def test_layer_events_are_declared_by_their_service_plugins_and_withdrawn() -> None:
    async with open_host([Row(id="s", name="sessions"), Row(id="t", name="tools")]) as host:
        declared = {spec.name for spec in host.bus.specs()}
        assert {e.name for e in SESSION_EVENTS + TOOLS_EVENTS} <= declared
        await host.unload("t")
        assert not host.bus.is_declared(TOOLS_EXECUTE.name)
        assert host.bus.is_declared(SESSION_EVENT.name)


async def test_a_second_row_keeps_the_declaration_until_both_are_gone() -> None:
    rows = [Row(id="a", name="host.sample_plugins:PingOwner"), Row(id="b", name="host.sample_plugins:PingOwner")]
    async with open_host(rows) as host:
        await host.unload("a")
        assert host.bus.is_declared("sample/ping")
        await host.unload("b")
        assert not host.bus.is_declared("sample/ping")


async def test_a_listener_by_name_waits_for_the_declaration_and_is_checked_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The listener's row comes before its event's owner: it waits, then is checked.
    async with open_host([Row(id="s", name="sessions")]) as host:
        await host.unload("s")
        heard: list[Any] = []

        async def wrong_kind(session: Any, event: Any) -> None:
            return None

        host.ctx.on("session/event", lambda s, e: heard.append(e))
        host.ctx.on("session/event", wrong_kind)  # async on an EMIT event
        with caplog.at_level(logging.ERROR, logger="dsh.bus"):
            host.bus.declare(SESSION_EVENT)
        assert len(host.bus.listeners(SESSION_EVENT)) == 1  # the wrong kind was dropped
        assert "is declared emit" in caplog.text and "wrong_kind" in caplog.text
        host.ctx.emit(SESSION_EVENT, None, "e")  # type: ignore[call-overload]  # wrong on purpose
        assert heard == ["e"]


async def test_a_listener_by_key_is_checked_at_once_without_a_declaration() -> None:
    async with open_host([]) as host:

        async def not_a_waterfall(exec: Any) -> Any:
            return None

        with pytest.raises(HandlerKindError, match="tools/execute"):
            host.ctx.on(TOOLS_EXECUTE, not_a_waterfall)  # type: ignore[arg-type]


async def test_a_waiting_listener_is_checked_before_a_dispatch_by_key_calls_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_host([]) as host:
        heard: list[Any] = []

        async def wrong_kind(session: Any, event: Any) -> None:
            heard.append("never")

        host.ctx.on("session/event", wrong_kind)  # nobody declared it: waits, unchecked
        host.ctx.on("session/event", lambda s, e: heard.append(e))
        with caplog.at_level(logging.ERROR, logger="dsh.bus"):
            host.ctx.emit(SESSION_EVENT, None, "e")  # type: ignore[call-overload]  # wrong on purpose
        assert heard == ["e"]
        assert "wrong_kind" in caplog.text
