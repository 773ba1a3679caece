"""``tools/progress``: a running ``bash`` call's output reaches watchers live, labelled by
stream, whole characters, never logged; a watcher that fails changes nothing of the call."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from dsh_host import Row, open_host
from dsh_host._tools import TOOLS_PROGRESS, ToolExecutionResult, ToolProgress

from .tools_helpers import call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

#: "é" split across two writes (0xC3 then 0xA9), with a pause between them.
COMMAND = (
    "printf 'one\\n'; printf 'err\\n' >&2; printf '\\303'; sleep 0.2; printf '\\251\\n'; "
    "while [ ! -e go ]; do sleep 0.05; done; echo two"
)


@pytest.mark.parametrize("backend", [None, "bubblewrap", "landlock"])
async def test_bash_output_is_reported_while_the_call_runs(
    tmp_path: Path, backend: str | None
) -> None:
    rows = [Row(name="tools")]
    if backend is not None:
        rows.append(Row(name="sandbox-local", config={"backend": backend}))
    mode = "danger-full-access" if backend is None else "workspace-write"
    rows.append(Row(name="builtin-tools", config={"workspace": str(tmp_path), "sandbox": mode}))
    seen: list[ToolProgress] = []
    before_go: list[str] = []

    ready = anyio.Event()  # the first lines arrived (or the call ended without them)

    def watch(progress: ToolProgress) -> None:
        seen.append(progress)
        if "é\n" in "".join(p.text for p in seen if p.stream == "stdout"):
            ready.set()

    def fail(progress: ToolProgress) -> None:
        raise BrokenPipeError("a watcher whose pipe closed")

    async with open_host(rows) as host:
        host.ctx.on(TOOLS_PROGRESS, watch)
        host.ctx.on(TOOLS_PROGRESS, fail)
        result: ToolExecutionResult | None = None

        async def run() -> None:
            nonlocal result
            try:
                result = await host.ctx.tools.execute(call(
                    name="bash", arguments={"command": COMMAND, "description": "talk"},
                    call_id="call-live"))  # fmt: skip
            finally:
                ready.set()

        with anyio.fail_after(120):  # a hang guard, not a timing assertion
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await ready.wait()
                before_go.extend(p.text for p in seen)
                (tmp_path / "go").touch()
    assert result is not None and not result.is_error, result
    # Live: the first lines arrived before the command could finish (it waited for `go`).
    assert "two" not in "".join(before_go)
    out = "".join(p.text for p in seen if p.stream == "stdout")
    err = "".join(p.text for p in seen if p.stream == "stderr")
    assert (out, err) == ("one\né\ntwo\n", "err\n")
    assert "\ufffd" not in out  # the split character arrived whole
    assert {p.exec.call_id for p in seen} == {"call-live"}
    # The failing watcher changed nothing: the result is the whole output.
    assert "one\né\ntwo" in text_of(result) and "err" in text_of(result)
