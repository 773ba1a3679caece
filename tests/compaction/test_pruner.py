"""``compaction-tool-result-pruner`` (issue 22): the bounds and idempotence of a prune (property
tests), and a pass over a real session: the oversized result is replaced on the surface by head +
DSH's marker + tail, the original stays in the log and the transcript, a second pass emits
nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from dsh_compaction_tool_result_pruner import (
    PRUNE_MARKER,
    ToolResultPruneConfig,
    ToolResultPruner,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host import Row
from dsh_host._session.events import CompletedReason, ReplaceOp, ToolResultData, TurnEnd, TurnStart
from dsh_host._session.messages import ImageBlock, TextBlock, ToolResultBlock
from dsh_host.errors import ConfigError

from .compaction_helpers import call, host_with, new_agent, register_echo, rows

BLOCKS = st.lists(
    st.one_of(
        st.text(max_size=300).map(lambda t: TextBlock(text=t)),
        st.just(ImageBlock(attachment={"id": "img"})),
    ),
    max_size=6,
)


@st.composite
def configs(draw: Any) -> ToolResultPruneConfig:
    head = draw(st.integers(0, 120))
    tail = draw(st.integers(0, 120))
    slack = draw(st.integers(0, 80))
    return ToolResultPruneConfig(
        threshold_chars=head + tail + len(PRUNE_MARKER) + slack, head_chars=head, tail_chars=tail
    )


def text_of(blocks: Any) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


@settings(max_examples=300, deadline=None)
@given(configs(), BLOCKS)
def test_prune_is_bounded_smaller_and_idempotent(config: ToolResultPruneConfig, blocks: Any) -> None:
    pruner = ToolResultPruner(config)
    total = len(text_of(blocks))
    out = pruner.prune_content(blocks)
    if total <= config.threshold_chars:
        assert out is None
        return
    assert out is not None
    kept = text_of(out)
    # Exactly head + marker + tail, within the threshold, strictly smaller than the input.
    assert len(kept) == config.head_chars + len(PRUNE_MARKER) + config.tail_chars
    assert len(kept) <= config.threshold_chars < total
    original = text_of(blocks)
    assert kept.startswith(original[: config.head_chars] + PRUNE_MARKER)
    assert kept.endswith(original[len(original) - config.tail_chars :] if config.tail_chars else "")
    # Rich blocks keep their order; a second pass has nothing to do.
    assert [b for b in out if not isinstance(b, TextBlock)] == [
        b for b in blocks if not isinstance(b, TextBlock)
    ]
    assert pruner.prune_content(out) is None


def test_code_points_are_never_split() -> None:
    pruner = ToolResultPruner(ToolResultPruneConfig(threshold_chars=60, head_chars=5, tail_chars=5))
    out = pruner.prune_content([TextBlock(text="😀" * 100)])
    assert out is not None
    assert text_of(out) == "😀" * 5 + PRUNE_MARKER + "😀" * 5


@pytest.mark.anyio
@pytest.mark.parametrize(
    "config",
    [
        {"thresholdChars": 0},
        {"headChars": -1},
        {"thresholdChars": 100, "headChars": 50, "tailChars": 20},  # 50+40+20 > 100
        {"threshold": 10},
    ],
)
async def test_bad_config_fails_at_load(config: dict[str, Any]) -> None:
    row = Row(name="compaction-tool-result-pruner", config=config)
    with pytest.raises(ConfigError):
        async with host_with(rows([{"text": "x"}]), Row(name="token-meter"), row):
            pass


def pruner_row() -> Row:
    """The pruner with a 1,000-character threshold (a 2,000-line result is over it)."""
    return Row(
        name="compaction-tool-result-pruner",
        config={"thresholdChars": 1000, "headChars": 300, "tailChars": 100},
    )


@pytest.mark.anyio
async def test_a_pass_replaces_the_oversized_result_and_keeps_the_original() -> None:
    big = "".join(f"line {i}\n" for i in range(2000))
    script = [call(big), call("small"), {"text": "done"}]
    async with host_with(rows(script), Row(name="token-meter"), pruner_row()) as host:
        register_echo(host)
        agent = new_agent(host)
        await agent.run_turn("go")
        session = agent.session
        [original] = [
            e
            for e in session.events
            if e.type == "tool/result" and text_of(e.data.message.content[0].content) == big
        ]
        # A tool/result replacement needs an open turn (compaction prunes inside one).
        session.append("turn/start", TurnStart(turn=2))
        result = host.ctx.toolResultPruner.prune_session(session)
        assert [p.original_seq for p in result.pruned] == [original.seq]
        [entry] = result.pruned
        assert entry.chars_before == len(big) and entry.chars_after == 300 + len(PRUNE_MARKER) + 100
        prune_event = session.events[entry.replacement_seq - 1]
        assert prune_event.type == "compaction/prune"
        assert list(prune_event.data["shadowedSeqs"]) == [original.seq]
        assert prune_event.data["shadowedRange"] == {"start": original.seq, "end": original.seq}
        assert prune_event.data["shadowedTokenCount"] > 3000
        replacement = session.events[entry.replacement_seq]
        assert replacement.surface_op == ReplaceOp(start=original.seq, end=original.seq)
        assert replacement.source_event_seqs == (original.seq,)
        assert isinstance(replacement.data, ToolResultData)
        # Same call, same message id, same turn/step: only the content changed.
        assert replacement.data.message.id == original.data.message.id
        assert (replacement.data.turn, replacement.data.step) == (
            original.data.turn,
            original.data.step,
        )
        [block] = replacement.data.message.content
        assert isinstance(block, ToolResultBlock)
        assert text_of(block.content) == big[:300] + PRUNE_MARKER + big[-100:]
        # The model's surface holds the replacement; the log and the transcript the original.
        assert original.seq not in session.surface.nodes
        assert entry.replacement_seq in session.surface.nodes
        assert original in session.append_origin_events()
        assert replacement not in session.append_origin_events()
        # A second pass emits nothing.
        count = session.seq
        assert host.ctx.toolResultPruner.prune_session(session).pruned == ()
        assert session.seq == count
        session.append("turn/end", TurnEnd(turn=2, reason=CompletedReason()))


@pytest.mark.anyio
async def test_a_pass_reads_only_the_results_no_earlier_pass_examined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events never change, so a result an earlier pass examined (and left, or replaced by a
    new node) is not read again: a pass costs the surface's new nodes, not the whole log
    (docs/decisions.md D49). A new oversized result is still pruned; a new config re-reads."""
    big = "".join(f"line {i}\n" for i in range(2000))
    script = [call("a"), call("b"), call("c"), {"text": "done"}, call(big), {"text": "done"}]
    async with host_with(rows(script), Row(name="token-meter"), pruner_row()) as host:
        register_echo(host)
        agent = new_agent(host)
        pruner = host.ctx.toolResultPruner
        examined: list[str] = []
        real = pruner.prune_content

        def counting(blocks: Any) -> Any:
            examined.append(text_of(blocks))
            return real(blocks)

        monkeypatch.setattr(pruner, "prune_content", counting)
        await agent.run_turn("three small")
        session = agent.session
        session.append("turn/start", TurnStart(turn=2))
        assert pruner.prune_session(session).pruned == ()
        assert examined == ["a", "b", "c"]
        session.append("turn/end", TurnEnd(turn=2, reason=CompletedReason()))
        await agent.run_turn("one big")
        session.append("turn/start", TurnStart(turn=4))
        examined.clear()
        [entry] = pruner.prune_session(session).pruned
        assert examined == [big]  # the three small ones are not read again
        examined.clear()
        assert pruner.prune_session(session).pruned == ()
        assert len(examined) == 1  # the replacement, once
        pruner.config = msgspec.structs.replace(pruner.config, threshold_chars=1001)
        examined.clear()
        assert pruner.prune_session(session).pruned == ()
        assert len(examined) == 4  # a new config: every result on the surface again
        assert entry.replacement_seq in session.surface.nodes
        session.append("turn/end", TurnEnd(turn=4, reason=CompletedReason()))
