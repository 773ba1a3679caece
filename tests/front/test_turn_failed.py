"""A turn that ends ``error`` raises :class:`TurnFailedError` from the front door (it returned
an empty ``output`` before, so a missing API key looked like an empty answer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_host import Agent, TurnFailedError
from dsh_host._session.events import ErrorReason

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


async def test_a_missing_api_key_raises_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    async with Agent(model="anthropic:claude-sonnet-4-5", store=str(tmp_path / "s")) as agent:
        with pytest.raises(TurnFailedError) as raised:
            await agent.run("hi")
        error = raised.value
        assert error.failure_code == "MISSING_CREDENTIAL"
        assert "ANTHROPIC_API_KEY" in str(error) and error.result.session_id in str(error)
        assert isinstance(error.result.turn_end, ErrorReason) and error.result.output == ""
    # The log holds the turn's end (flushed before the raise): a later agent reads it back.
    async with Agent(model="anthropic:claude-sonnet-4-5", store=str(tmp_path / "s")) as again:
        await again.resume(error.result.session_id)
        ends = [e for e in again.core.session.events if e.type == "turn/end"]
        assert len(ends) == 1 and isinstance(ends[0].data.reason, ErrorReason)


def test_run_sync_raises_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    agent = Agent(model="anthropic:claude-sonnet-4-5", store=None)
    with pytest.raises(TurnFailedError, match="MISSING_CREDENTIAL"):
        agent.run_sync("hi")


async def test_stream_raises_after_the_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    async with Agent(model="anthropic:claude-sonnet-4-5", store=None) as agent:
        seen: list[str] = []
        with pytest.raises(TurnFailedError):
            async for event in agent.stream("hi"):
                seen.append(type(event).__name__)
        assert "TurnEnd" in seen
