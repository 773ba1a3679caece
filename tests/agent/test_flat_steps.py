"""A step of the shipped default composition does the same work at step 200 as at step 20,
and keeps about as much memory.

Issue 36: with ``configs/default.yml`` a step's cost grew with the session (the approval
plugin scanned the whole log every step for a policy switch; compaction scanned back to the
turn's start for its lock). Time is not asserted (tests never time): the test *counts* what a
step reads of the log and of the derived messages -- every item a :class:`LogView` hands out,
by index, slice or iteration, and every event a :class:`LogFold` folds in -- and requires the
steps at the end of a 200-step turn to read no more than the steps at its start. A scan of
the log per step reads ~5 more events a step for every step before it (a 180-step gap: ~900
more), so any such scan fails it by a wide margin. Memory is measured the same way, with
``tracemalloc`` over 20 early and the 20 last steps: the bytes still allocated per step.

The composition is the shipped file, row for row (approval, sandbox, compaction, token meter,
pruner, repeat-tool reminder, agent instructions, JSONL persistence with real fsyncs and the
checkpoint policy), with a scripted model that reads one file per step and declares a context
window large enough that the compaction check runs every step without compacting (a
compaction step reads the surface, bounded by the window, not by the log).
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_host import Row, open_host
from dsh_host._compositions import shipped_config_dir
from dsh_host._loader import load_rows
from dsh_host._session import folds
from dsh_host._session.events import CompletedReason
from dsh_host._session.session import LogView

pytestmark = [pytest.mark.anyio]

STEPS = 200
#: Steps per compared window (the first window starts at step 11: the turn's first steps
#: create the session, publish the log and warm the per-session folds).
WINDOW = 20


def default_rows(root: Path, workspace: Path, steps: int) -> list[Row]:
    """``configs/default.yml`` with the session root, the workspace, a scripted model and the
    per-turn step limit lifted to ``steps``."""
    responses: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: reading the notes again.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
            "usage": {"input_tokens": 2000 + 10 * i, "output_tokens": 20},
        }
        for i in range(1, steps + 1)
    ]
    responses.append({"text": "Done.", "usage": {"input_tokens": 9, "output_tokens": 2}})
    model = Row(
        id="model",
        name="llm-scripted",
        config={"responses": responses, "context_window": 10_000_000},
    )
    rows = [model]
    for located in load_rows(shipped_config_dir() / "default.yml"):
        row = located.row
        config = dict(row.config or {})
        if row.name == "session-persistence-jsonl":
            config["root"] = str(root)
        elif row.name == "builtin-tools":
            config["workspace"] = str(workspace)
        elif row.name == "agent":
            config.update(provider="scripted", model="scripted", maxStepsPerTurn=steps + 1)
        rows.append(Row(id=row.id, name=row.name, config=config or None))
    return rows


class ReadCounter:
    """Counts the items read through every :class:`LogView` and every :class:`LogFold`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.items = 0
        getitem, iterate = LogView.__getitem__, LogView.__iter__
        fold_value = folds.LogFold.value
        counter = self

        def counted_getitem(view: LogView[Any], index: Any) -> Any:
            got = getitem(view, index)
            counter.items += len(got) if isinstance(index, slice) else 1
            return got

        def counted_iter(view: LogView[Any]) -> Iterator[Any]:
            for item in iterate(view):
                counter.items += 1
                yield item

        def counted_value(fold: folds.LogFold[Any], session: Any) -> Any:
            step = fold._step

            def counted_step(state: Any, event: Any) -> Any:
                counter.items += 1
                return step(state, event)

            fold._step = counted_step
            try:
                return fold_value(fold, session)
            finally:
                fold._step = step

        monkeypatch.setattr(LogView, "__getitem__", counted_getitem)
        monkeypatch.setattr(LogView, "__iter__", counted_iter)
        monkeypatch.setattr(folds.LogFold, "value", counted_value)


async def test_a_late_step_reads_no_more_of_the_log_than_an_early_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("a line of notes\n" * 20)
    counter = ReadCounter(monkeypatch)
    marks: list[int] = []  # items read before each step started
    kept: list[float] = []  # bytes still allocated a step, from steps 12.. and the last WINDOW
    async with open_host(default_rows(tmp_path / "sessions", workspace, STEPS)) as host:
        [model] = [f for f in host.fibers if f.id == "model"]
        requests = model.instance.adapter.requests

        def on_step_start(_event: Any) -> None:
            requests.clear()  # the scripted adapter keeps every request for tests
            marks.append(counter.items)
            step = len(marks)
            if step in (12, STEPS + 1 - WINDOW):  # trace what the next WINDOW steps keep
                gc.collect()
                tracemalloc.start()
            elif step in (12 + WINDOW, STEPS + 1):
                gc.collect()  # only what is still referenced
                kept.append(tracemalloc.get_traced_memory()[0] / WINDOW)
                tracemalloc.stop()

        host.ctx.on("agent/step-start", on_step_start)
        agent = host.ctx.agent.create(session_id="flat", cwd=str(workspace))
        assert await agent.run_turn("Read the notes, once a step.") == CompletedReason()
        events = agent.session.events
        await agent.aclose()
    tool_results = [e for e in events if e.type == "tool/result"]
    assert len(tool_results) == STEPS
    assert "a line of notes" in str(tool_results[-1].data.message.content)
    assert len(marks) == STEPS + 1
    per_step = [after - before for before, after in itertools.pairwise(marks)]
    early = per_step[10 : 10 + WINDOW]
    late = per_step[-WINDOW:]
    assert min(early) > 0, "the counter sees nothing: the test would pass whatever a step read"
    assert max(late) <= max(early), (
        f"a step reads more of the log late in the turn than early: items read per step "
        f"{early} (steps 12..{11 + WINDOW}) against {late} (the last {WINDOW})"
    )
    # The log and its projections grow by the same few events a step: memory a step is
    # bounded when the last steps keep not much more a step than the early ones. (Not
    # exactly as much: a list that grows reallocates its whole buffer now and then, which
    # the trace counts as new: ~6.8 KB a step early, ~8.0 late. A projection copied per step,
    # or a per-step cache of the log, keeps twice as much by step 200 and grows from there.)
    early_bytes, late_bytes = kept
    assert 0 < late_bytes <= 1.5 * early_bytes, (
        f"bytes kept per step: {early_bytes:.0f} in steps 12..{11 + WINDOW}, {late_bytes:.0f} "
        f"in the last {WINDOW}"
    )
