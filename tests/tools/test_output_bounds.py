"""One output bound for every tool (issue 23): a result past ``maxInlineBytes`` is saved to the
row's private spill area and the model sees a head/tail preview and DSH's notice, then pages the
saved file with ``read_file``; the area is private (0700, files 0600, outside the workspace),
``read_file`` reads only its own files there (no link followed), and ``read_file`` results are
never re-spilled.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host._loader import PluginHost
from dsh_host._tools import ToolExecution, ToolExecutionResult

from .tools_helpers import Boot, call, echo_tool, text_of

pytestmark = pytest.mark.anyio

GUARD_S = 60  # hang guard only
#: 6000 numbered lines, 66 000 bytes.
BIG = "".join(f"line {n:05d}\n" for n in range(1, 6001))
NOTICE = re.compile(
    r"\(Omitted (\d+) bytes\. Full formatted result stored at: (\S+)\. Use read_file with "
    r"offset/limit to page through it\.\)$"
)


@pytest.fixture
def boot(boot: Boot) -> Boot:
    """The builtin-tools row, plus a tool of another plugin (``big``) that returns ``BIG``."""

    @asynccontextmanager
    async def booted(**config: Any) -> AsyncIterator[PluginHost]:
        async with boot(**config) as host:

            async def big(args: Any, exec: ToolExecution) -> Any:
                return BIG

            host.ctx.tools.register(echo_tool("big", big), owner=host.ctx)
            yield host

    return booted


async def run(host: PluginHost, name: str, arguments: Any) -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(name=name, arguments=arguments)
        )
        return result


def spill_facts(spill: Path, ws: Path) -> tuple[str, int, int, bool]:
    """A spill file's content, its mode, its directory's mode, and whether it is in ``ws``."""
    inside = spill.resolve().is_relative_to(ws.resolve())
    return (
        spill.read_text(),
        spill.stat().st_mode & 0o777,
        spill.parent.stat().st_mode & 0o777,
        inside,
    )


async def test_a_large_result_of_any_tool_is_bounded_and_paged_with_read_file(
    boot: Boot, ws: Path
) -> None:
    async with boot(maxInlineBytes=2000) as host:
        result = await run(host, "big", {})
        shown = text_of(result)
        found = NOTICE.search(shown)
        assert found is not None, shown
        omitted, locator = int(found.group(1)), found.group(2)
        spill = Path(locator)
        saved, file_mode, dir_mode, inside = spill_facts(spill, ws)
        paged = await run(host, "read_file", {"path": locator, "offset": 3000, "limit": 2})
    preview = shown[: found.start()].removesuffix("\n\n")
    assert len(shown.encode()) <= 2000
    assert saved == BIG
    assert omitted == len(BIG) - len(preview)
    head_size = len(preview) - len(preview) // 2
    assert BIG.startswith(preview[:head_size]) and BIG.endswith(preview[head_size:])
    assert (file_mode, dir_mode) == (0o600, 0o700)
    assert not inside
    assert text_of(paged) == (
        f"<path>{locator}</path>\n<type>file</type>\n<content>\n"
        "3000: line 03000\n3001: line 03001\n\n"
        "(Showing lines 3000-3001 of 6000, 2999 more lines. Use offset=3002 to continue.)\n"
        "</content>"
    )
    assert not spill.parent.exists(), "the spill area outlived the row"


async def test_small_results_read_file_and_a_notice_that_cannot_fit_stay_inline(
    boot: Boot, ws: Path
) -> None:
    (ws / "big.txt").write_text(BIG)
    async with boot(maxInlineBytes=2000, readLimit=300) as host:
        small = await run(host, "glob", {"pattern": "*.txt"})
        read = await run(host, "read_file", {"path": "big.txt"})
    async with boot(maxInlineBytes=50) as host:
        unfit = await run(host, "big", {})
    async with boot(maxInlineBytes=None) as host:
        off = await run(host, "big", {})
    assert text_of(small) == "big.txt"
    assert len(text_of(read).encode()) > 2000  # read_file has its own window caps
    assert text_of(read).endswith("Use offset=301 to continue.)\n</content>")
    assert text_of(unfit) == BIG  # no within-cap replacement exists: the original stays
    assert text_of(off) == BIG


async def test_read_file_reaches_only_the_area_s_own_files(
    boot: Boot, ws: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    async with boot(maxInlineBytes=2000) as host:
        found = NOTICE.search(text_of(await run(host, "big", {})))
        assert found is not None
        area = Path(found.group(2)).parent
        (area / "planted").symlink_to(secret)  # as root, we can plant into the private area
        control = (area / "planted").read_text()  # a plain open follows the planted link
        planted = await run(host, "read_file", {"path": str(area / "planted")})
        dotdot = await run(host, "read_file", {"path": f"{area}/../{area.name}/x"})
        beside = await run(host, "read_file", {"path": str(area.parent / "other")})
    assert control == "secret\n"
    assert planted.is_error and "symbolic link" in text_of(planted), text_of(planted)
    for refused in (dotdot, beside):
        assert refused.is_error and "outside the workspace" in text_of(refused), text_of(refused)


async def test_a_spent_spill_budget_still_bounds_results(boot: Boot, ws: Path) -> None:
    """Issue 43: the run's spill budget (here 100 000 bytes: one BIG and a half) ends saving,
    not bounding: the next result is still cut to its head and tail, and says the middle is
    gone (it used to stay whole when it could not be saved)."""
    async with boot(maxInlineBytes=2000, spillBudgetBytes=100_000) as host:
        results = [await run(host, "big", {}) for _ in range(3)]
    first, second, third = (text_of(r) for r in results)
    assert NOTICE.search(first) is not None
    assert NOTICE.search(second) is not None  # saved, cut short by the budget (its marker says)
    assert len(third.encode()) <= 2000
    assert third.startswith("line 00001\n") and third.rstrip(")").endswith(
        "The full result was not saved: this run's spill budget of 100000 bytes is used up."
    )
    head = third.split("\n\n(Omitted")[0]
    assert head.endswith("line 06000\n")  # the tail is kept too
