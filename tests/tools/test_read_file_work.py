"""``read_file`` resolves a path (``realpath``: an ``lstat`` per component) only when its open
was refused, to say where the path leads; a read that opened resolves nothing
(docs/decisions.md D49). The answers are those of :func:`workspace_parts`' resolve-first order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host._tools import ToolExecutionResult

from .tools_helpers import Boot, call, text_of

pytestmark = pytest.mark.anyio


def real(path: Path) -> str:
    return os.path.realpath(path)


async def run(host: Any, arguments: Any) -> ToolExecutionResult:
    with anyio.fail_after(60):  # hang guard only
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(name="read_file", arguments=arguments)
        )
        return result


async def test_a_read_that_opens_resolves_nothing(
    boot: Boot, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "sub").mkdir()
    (ws / "sub" / "notes.txt").write_text("one\ntwo\n")
    resolved: list[str] = []
    real = os.path.realpath

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        resolved.append(str(path))
        return real(path, *args, **kwargs)

    async with boot() as host:
        monkeypatch.setattr(os.path, "realpath", counting)
        results = [await run(host, {"path": "sub/notes.txt"}) for _ in range(5)]
    assert all(not r.is_error and "2: two" in text_of(r) for r in results)
    assert resolved == []


async def test_refused_reads_still_say_where_the_path_leads(
    boot: Boot, ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    (ws / "inside.txt").write_text("inside\n")
    (ws / "out.txt").symlink_to(outside)
    (ws / "in.txt").symlink_to(ws / "inside.txt")
    (ws / "dirlink").symlink_to(tmp_path)
    async with boot() as host:
        out = await run(host, {"path": "out.txt"})
        through = await run(host, {"path": "dirlink/outside.txt"})
        dangling = await run(host, {"path": "dirlink/missing.txt"})
        inside_link = await run(host, {"path": "in.txt"})
        missing = await run(host, {"path": "nope.txt"})
    real_ws = real(ws)
    cases = [(out, "out.txt", outside), (through, "dirlink/outside.txt", outside)]
    cases.append((dangling, "dirlink/missing.txt", tmp_path / "missing.txt"))
    for result, path, target in cases:
        assert text_of(result) == (
            f'Error: path "{path}" resolves to {real(target)}, which is outside '
            f"the workspace {real_ws}; the file tools only reach files inside the workspace"
        )
    assert text_of(inside_link) == (
        'Error: path "in.txt" goes through a symbolic link; the file tools do not follow '
        f"links (a link can lead outside the workspace {real_ws})"
    )
    assert text_of(missing) == 'Error: file "nope.txt" does not exist'
    assert "secret" not in "".join(text_of(r) for r in (out, through, dangling))

