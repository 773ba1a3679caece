"""The surface fold: replacements, their validation, and the two projections."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_host._session import (
    InvalidSessionEventError,
    ReplaceOp,
    Session,
    SurfaceTransitionError,
    TextBlock,
    ToolResultBlock,
    derive_messages_from_events,
    fold_surface,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_event,
)

from .builders import assistant, new_session, tool_result, user


def three_messages() -> Session:
    session = new_session()
    session.append("user/message", user("u0"), surface_op="append")  # 0
    session.append(
        "assistant/message", assistant(1, 1, "a1", TextBlock(text="x")), surface_op="append"
    )  # 1
    session.append("turn/start", {"turn": 1})  # 2 (log-only)
    session.append("user/message", user("u3"), surface_op="append")  # 3
    return session


def test_range_replace_shadows_nodes_and_rebuilds_derivation() -> None:
    session = three_messages()
    before = session.derive_messages()
    assert [m.id for m in before] == ["u0", "a1", "u3"]
    summary = session.append(
        "user/message",
        user("sum", "summary"),
        surface_op=ReplaceOp(start=0, end=1),
        source_event_seqs=[0, 1],
    )
    assert session.surface.nodes == (summary.seq, 3)
    assert session.surface.replace_generation == 1
    assert [m.id for m in session.derive_messages()] == ["sum", "u3"]
    assert [m.id for m in before] == ["u0", "a1", "u3"]  # earlier snapshot unchanged
    # Append-origin keeps what the model no longer sees; the replacement is model-only.
    assert [e.seq for e in session.append_origin_events()] == [0, 1, 3]
    assert [m.id for m in session.append_origin_messages()] == ["u0", "a1", "u3"]
    assert is_replacement_surface_event(summary) and is_surface_event(summary)
    assert not is_append_surface_event(summary)


def test_single_node_replace_with_a_mapping_intent() -> None:
    session = three_messages()
    event = session.append(
        "user/message",
        user("r"),
        surface_op={"op": "replace", "start": 3, "end": 3},
        source_event_seqs=[3],
    )
    assert session.surface.nodes == (0, 1, event.seq)


@pytest.mark.parametrize(
    ("op", "sources", "message"),
    [
        ({"start": 7, "end": 1}, [1], "start seq 7 not found in surface"),
        ({"start": 0, "end": 2}, [0, 2], "end seq 2 not found in surface"),
        ({"start": 3, "end": 0}, [0, 3], "start seq 3 (index 2) is after end seq 0 (index 0)"),
        ({"start": 0, "end": 1}, [0], "must include every shadowed surface node; missing 1"),
        ({"start": 0, "end": 3}, [0], "missing 1, 3"),
        ({"start": 0, "end": 1}, [0, 1, 1], "must not contain duplicates"),
        ({"start": 0, "end": 1}, [0, 1, 4], "must reference earlier events: 4 >= current seq 4"),
        ({"start": 0, "end": 1}, [], "must not be empty except on assistant/message"),
    ],
)
def test_replace_errors_leave_the_surface_unchanged(
    op: dict[str, int], sources: list[int], message: str
) -> None:
    session = three_messages()
    with pytest.raises(SurfaceTransitionError) as info:
        session.append(
            "user/message",
            user("bad"),
            surface_op={"op": "replace", **op},
            source_event_seqs=sources,
        )
    assert message in str(info.value)
    assert str(info.value).startswith('session event "user/message" at seq 4')
    assert session.seq == 4
    assert session.surface.nodes == (0, 1, 3)
    assert session.surface.replace_generation == 0


@pytest.mark.parametrize("sources", [[-1], [0.5], ["1"]])
def test_malformed_sources_are_refused(sources: list[Any]) -> None:
    session = three_messages()
    with pytest.raises(InvalidSessionEventError, match="densely contain non-negative safe"):
        session.append("user/message", user("x"), surface_op="append", source_event_seqs=sources)


def test_empty_sources_are_fine_on_an_assistant_message() -> None:
    session = new_session()
    session.append(
        "assistant/message", assistant(1, 1, "a"), surface_op="append", source_event_seqs=[]
    )
    assert session.events[0].source_event_seqs == ()


class TestToolResultRewrite:
    def _session(self) -> Session:
        session = new_session()
        session.append(
            "tool/result",
            tool_result(1, 1, "c1", "long output", meta=[1, {"a": 2}]),
            surface_op="append",
        )  # 0
        session.append("tool/result", tool_result(1, 1, "c2"), surface_op="append")  # 1
        session.append("user/message", user("u"), surface_op="append")  # 2
        return session

    def _pruned(self, call_id: str = "c1", **changes: Any) -> Any:
        data = tool_result(1, 1, call_id, "[pruned]", mid=f"r-{call_id}", meta=[1, {"a": 2}])
        return msgspec.structs.replace(data, **changes) if changes else data

    def test_content_only_rewrite_of_one_result_is_accepted(self) -> None:
        session = self._session()
        session.append(
            "tool/result",
            self._pruned(),
            surface_op=ReplaceOp(start=0, end=0),
            source_event_seqs=[0],
        )
        block = session.derive_messages()[0].content[0]
        assert isinstance(block, ToolResultBlock)
        assert block.content == (TextBlock(text="[pruned]"),)

    @pytest.mark.parametrize(
        ("start", "end", "data_changes", "message"),
        [
            (0, 1, {}, "must rewrite exactly one current node"),
            (2, 2, {}, "must target a current tool/result"),
            (0, 0, {"meta": [1]}, "may change only content"),
            (0, 0, {"step": 2}, "may change only content"),
        ],
    )
    def test_other_rewrites_are_refused(
        self, start: int, end: int, data_changes: dict[str, Any], message: str
    ) -> None:
        session = self._session()
        with pytest.raises(SurfaceTransitionError, match=message):
            session.append(
                "tool/result",
                self._pruned(**data_changes),
                surface_op=ReplaceOp(start=start, end=end),
                source_event_seqs=list(range(start, end + 1)),
            )
        assert session.surface.replace_generation == 0

    def test_changing_is_error_or_the_message_id_is_refused(self) -> None:
        session = self._session()
        pruned = self._pruned()
        block = pruned.message.content[0]
        flipped = msgspec.structs.replace(
            pruned,
            message=msgspec.structs.replace(
                pruned.message,
                content=(ToolResultBlock(tool_call_id="c1", content=block.content, is_error=True),),
            ),
        )
        renamed = msgspec.structs.replace(
            pruned, message=msgspec.structs.replace(pruned.message, id="other")
        )
        for data in (flipped, renamed):
            with pytest.raises(SurfaceTransitionError, match="may change only content"):
                session.append(
                    "tool/result", data, surface_op=ReplaceOp(start=0, end=0), source_event_seqs=[0]
                )


def test_seed_with_an_out_of_range_replace_is_refused() -> None:
    from dsh_host._session import InvalidSeedError, event_to_builtins

    session = three_messages()
    records = [event_to_builtins(e) for e in session.events]
    records.append(
        {
            "type": "user/message",
            "seq": 4,
            "time": 1,
            "data": {"id": "s", "role": "user", "content": [], "source": {"kind": "user"}},
            "surfaceOp": {"op": "replace", "start": 0, "end": 9},
            "sourceEventSeqs": [0],
        }
    )
    with pytest.raises(InvalidSeedError, match=r"invalid seed event at index 4: .*end seq 9 not"):
        Session.create("x", seed=records)


def test_fold_surface_reports_replacements_and_windows() -> None:
    session = three_messages()
    session.append(
        "user/message", user("sum"), surface_op=ReplaceOp(start=1, end=3), source_event_seqs=[1, 3]
    )
    fold = fold_surface(list(session.events))
    assert fold.nodes == (0, 4)
    assert [(r.seq, r.start, r.end, r.shadowed_seqs) for r in fold.replacements] == [
        (4, 1, 3, (1, 3))
    ]
    with pytest.raises(SurfaceTransitionError, match="not found"):
        fold_surface(list(session.events)[2:], base_seq=2)  # the range crosses the window head


# --- property: the incremental fold equals a full refold -----------------------------------

Step = tuple[str, int, int]


@st.composite
def operations(draw: st.DrawFn) -> list[Step]:
    """A random log program: appends, log-only events, and replaces of random ranges."""
    count = draw(st.integers(1, 60))
    return [
        (
            draw(st.sampled_from(["append", "append", "log", "replace", "replace-result"])),
            draw(st.integers(0, 1_000)),
            draw(st.integers(0, 3)),
        )
        for _ in range(count)
    ]


def run_program(program: list[Step], derive_every: int) -> Session:
    session = new_session()
    for index, (kind, pick, width) in enumerate(program):
        nodes = session.surface.nodes
        seq = session.seq
        if kind == "log" or (kind.startswith("replace") and not nodes):
            session.append("turn/start", {"turn": index + 1})
        elif kind == "append":
            if pick % 3 == 0:
                session.append("tool/result", tool_result(1, 1, f"c{seq}"), surface_op="append")
            elif pick % 3 == 1:
                session.append(
                    "assistant/message",
                    assistant(1, 1, f"a{seq}", *([TextBlock(text="t")] * (pick % 2))),
                    surface_op="append",
                )
            else:
                session.append("user/message", user(f"u{seq}"), surface_op="append")
        elif kind == "replace-result":
            results = [n for n in nodes if session.events[n].type == "tool/result"]
            if not results:
                session.append("turn/start", {"turn": index + 1})
                continue
            target = results[pick % len(results)]
            original = session.events[target].data
            call_id = original.message.source.call_id
            session.append(
                "tool/result",
                tool_result(1, 1, call_id, "pruned", mid=original.message.id),
                surface_op=ReplaceOp(start=target, end=target),
                source_event_seqs=[target],
            )
        else:
            start = pick % len(nodes)
            end = min(len(nodes) - 1, start + width)
            shadowed = list(nodes[start : end + 1])
            session.append(
                "user/message",
                user(f"s{seq}"),
                surface_op=ReplaceOp(start=nodes[start], end=nodes[end]),
                source_event_seqs=shadowed,
            )
        if derive_every and index % derive_every == 0:
            session.derive_messages()
    return session


@settings(max_examples=200, deadline=None)
@given(operations(), st.integers(0, 4))
def test_property_incremental_derivation_equals_full_refold(
    program: list[Step], derive_every: int
) -> None:
    session = run_program(program, derive_every)
    incremental = list(session.derive_messages())
    full = derive_messages_from_events(list(session.events))
    assert incremental == full
    assert fold_surface(list(session.events)).nodes == session.surface.nodes
    # Replaying the log as a seed reproduces the same surface and messages.
    replay = Session.create("replay", seed=list(session.events))
    assert list(replay.derive_messages()) == incremental
    # Append-origin is every appended surface event, in log order, whatever was replaced.
    assert [e.seq for e in session.append_origin_events()] == [
        e.seq for e in session.events if e.surface_op == "append"
    ]
