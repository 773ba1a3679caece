"""One policy for every effect (issue 43, class 3): the file tools honour the protected paths.

``write_file`` and ``edit_file`` used to write ``.git/config`` (``core.fsmonitor``) and a
virtualenv's ``.pth`` that ``bash`` gets read-only, and nested virtualenvs were not protected at
all. Each attack here goes through each writing tool and is judged on the host's files; each has
its control: an unprotected sibling is writable, and the very same call succeeds when the row
protects nothing (so it is the policy that blocks it, not some other refusal). The tricks
(symlinks, ``..``, letter case, compatibility characters, a hard link) are tried too, and
``bash`` is checked on both sandbox backends with the same policy view (a nested virtualenv).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._sandbox import (
    SandboxPolicy,
    call_policy,
    find_virtualenvs,
    read_only_cover,
)
from dsh_host._tools import ToolExecutionResult

from .tools_helpers import call, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

GUARD_S = 60  # hang guard only
ORIGINAL = "[core]\n\tbare = false\n"

#: (what, the protected file, an unprotected sibling the same call may write)
KINDS = [
    ("git config", ".git/config", "gitx/config"),
    ("git hook", ".git/hooks/pre-commit", "hooks/pre-commit"),
    ("harness state", ".dsh/state.json", "dsh/state.json"),
    ("composition", "dsh.yml", "dsh.yml.bak"),
    ("venv .pth", ".venv/lib/python3.11/site-packages/evil.pth", "lib/evil.pth"),
    ("nested venv", "backend/.venv/lib/site-packages/evil.pth", "backend/lib/evil.pth"),
    ("deep venv", "a/b/c/env/bin/activate", "a/b/c/other/bin/activate"),
]


def make_tree(ws: Path) -> None:
    for _what, protected, sibling in KINDS:
        for name in (protected, sibling):
            (ws / name).parent.mkdir(parents=True, exist_ok=True)
            (ws / name).write_text(ORIGINAL)
    for venv in (".venv", "backend/.venv", "a/b/c/env"):
        (ws / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")


@pytest.fixture
def tree(ws: Path) -> Path:
    make_tree(ws)
    return ws


@contextlib.asynccontextmanager
async def booted(ws: Path, **config: Any) -> AsyncIterator[PluginHost]:
    rows = [Row(name="tools"), Row(name="builtin-tools", config={"workspace": str(ws), **config})]
    async with open_host(rows) as host:
        yield host


async def run(host: PluginHost, name: str, arguments: Any) -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(name=name, arguments=arguments)
        )
    return result


def attempts(path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every writing tool's way at ``path``: replace, create anew (parents made), edit."""
    return [
        ("write_file", {"path": path, "content": "[core]\n\tfsmonitor = evil\n"}),
        ("edit_file", {"path": path, "old_string": "bare = false", "new_string": "fsmonitor=x"}),
    ]


def code_of(result: ToolExecutionResult) -> str | None:
    assert result.is_error, text_of(result)
    assert result.error is not None and result.error.info is not None
    return result.error.info.code


@pytest.mark.parametrize(("what", "protected", "sibling"), KINDS, ids=[k[0] for k in KINDS])
async def test_each_writing_tool_is_refused_inside_each_protected_kind(
    tree: Path, what: str, protected: str, sibling: str
) -> None:
    async with booted(tree) as host:
        for name, arguments in attempts(protected):
            refused = await run(host, name, arguments)
            assert code_of(refused) == "FS_PROTECTED_PATH", (name, text_of(refused))
            assert f'may not write "{protected}"' in text_of(refused)
            assert "protected path" in text_of(refused)
        # a new file in a protected directory is a write too (dsh.yml is a file: its control
        # is dsh.yml.d/, beside it and not protected)
        inside = "/" in protected
        new = f"{os.path.dirname(protected)}/new.py" if inside else f"{protected}.d/new.py"
        created = await run(
            host, "write_file", {"path": new, "content": "x", "create_parents": True}
        )
        if inside:
            assert code_of(created) == "FS_PROTECTED_PATH", text_of(created)
            assert not (tree / new).exists()
        else:
            assert not created.is_error, text_of(created)
        # control: the unprotected sibling takes the same writes
        for name, arguments in attempts(sibling):
            if name == "edit_file":
                (tree / sibling).write_text(ORIGINAL)
            done = await run(host, name, arguments)
            assert not done.is_error, (name, text_of(done))
    assert (tree / protected).read_text() == ORIGINAL
    assert (tree / sibling).read_text() != ORIGINAL


async def test_control_with_nothing_protected_the_same_writes_land(tree: Path) -> None:
    """The refusals above are the policy's: with an empty list the same calls succeed."""
    async with booted(tree, protectedPaths=[], protectVirtualenvs=False) as host:
        for _what, protected, _sibling in KINDS:
            for name, arguments in attempts(protected):
                (tree / protected).write_text(ORIGINAL)
                done = await run(host, name, arguments)
                assert not done.is_error, (protected, name, text_of(done))
                assert (tree / protected).read_text() != ORIGINAL


async def test_a_protected_name_that_does_not_exist_yet_cannot_be_created(ws: Path) -> None:
    async with booted(ws) as host:
        refused = [
            await run(host, "write_file", {"path": path, "content": "x", "create_parents": True})
            for path in (".git/config", ".git/HEAD", "dsh.yml", ".dsh/trust.json")
        ]
        control = await run(
            host, "write_file", {"path": "src/x.py", "content": "x", "create_parents": True}
        )
    assert [code_of(r) for r in refused] == ["FS_PROTECTED_PATH"] * 4
    assert not (ws / ".git").exists() and not (ws / "dsh.yml").exists()
    assert not control.is_error and (ws / "src/x.py").read_text() == "x"


@pytest.mark.parametrize(
    "path",
    [
        ".GIT/config",  # a case-folding filesystem maps it to .git
        ".Git/hooks/pre-commit",
        "DSH.YML",
        ".VENV/lib/python3.11/site-packages/evil.pth",
        "Backend/.Venv/lib/site-packages/evil.pth",
        "\uff0egit/config",  # FULLWIDTH FULL STOP: NFKC folds it to "."
        "./.git//config",
        "backend/./.venv/x.pth",
    ],
)
async def test_case_and_spelling_tricks_are_refused(tree: Path, path: str) -> None:
    async with booted(tree) as host:
        result = await run(
            host, "write_file", {"path": path, "content": "evil\n", "create_parents": True}
        )
    assert code_of(result) == "FS_PROTECTED_PATH", text_of(result)
    assert (tree / ".git/config").read_text() == ORIGINAL


async def test_absolute_dotdot_and_symlink_routes_are_refused(tree: Path) -> None:
    (tree / "gitlink").symlink_to(tree / ".git")
    (tree / "venvlink").symlink_to(tree / "backend" / ".venv")
    (tree / "sub").mkdir()
    async with booted(tree) as host:
        absolute = await run(
            host, "write_file", {"path": str(tree / ".git/config"), "content": "x"}
        )
        dotdot = await run(host, "write_file", {"path": "sub/../.git/config", "content": "x"})
        linked = await run(host, "write_file", {"path": "gitlink/config", "content": "x"})
        venv_linked = await run(
            host, "edit_file",
            {"path": "venvlink/lib/site-packages/evil.pth", "old_string": "bare", "new_string": "y"},
        )  # fmt: skip
        replace_link = await run(host, "write_file", {"path": "gitlink", "content": "x"})
    assert code_of(absolute) == "FS_PROTECTED_PATH"
    assert code_of(dotdot) == "FS_OUTSIDE_WORKSPACE" and '".."' in text_of(dotdot)
    assert code_of(linked) == "FS_OUTSIDE_WORKSPACE" and "symbolic link" in text_of(linked)
    assert code_of(venv_linked) == "FS_OUTSIDE_WORKSPACE"
    assert code_of(replace_link) == "FS_OUTSIDE_WORKSPACE"
    assert (tree / ".git/config").read_text() == ORIGINAL
    assert (tree / "backend/.venv/lib/site-packages/evil.pth").read_text() == ORIGINAL
    # control: the links do lead into the protected trees
    assert (tree / "gitlink" / "config").read_text() == ORIGINAL
    assert (tree / "venvlink" / "lib/site-packages/evil.pth").read_text() == ORIGINAL


async def test_a_hard_link_to_a_protected_file_is_replaced_not_written_through(
    tree: Path,
) -> None:
    os.link(tree / ".git/config", tree / "alias")
    async with booted(tree) as host:
        wrote = await run(host, "write_file", {"path": "alias", "content": "[core]\n\tx = 1\n"})
        edited = await run(
            host, "edit_file", {"path": "alias", "old_string": "x = 1", "new_string": "x = 2"}
        )
    assert not wrote.is_error and not edited.is_error
    assert (tree / "alias").read_text() == "[core]\n\tx = 2\n"
    assert (tree / ".git/config").read_text() == ORIGINAL
    # control: an in-place write through the same link does reach the protected file
    os.link(tree / ".git/config", tree / "alias2")
    fd = os.open(tree / "alias2", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"\tfsmonitor = evil\n")
    os.close(fd)
    assert "fsmonitor" in (tree / ".git/config").read_text()


async def test_read_only_mode_still_refuses_every_write(tree: Path) -> None:
    async with booted(tree, sandbox="read-only") as host:
        result = await run(host, "write_file", {"path": "free.txt", "content": "x"})
    assert code_of(result) == "FS_SANDBOX_DENIED"
    assert not (tree / "free.txt").exists()


# --------------------------------------------------------------------------- the policy itself


def test_virtualenvs_are_found_at_any_depth_within_the_bounds(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for venv in (".venv", "backend/.venv", "a/b/c/d/e/venv", "node_modules/x/.venv", ".git/v"):
        (ws / venv).mkdir(parents=True)
        (ws / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (ws / "plain").mkdir()
    (ws / "fake").mkdir()
    (ws / "fake" / "pyvenv.cfg").mkdir()  # a directory named so is no virtualenv
    (ws / "linked").symlink_to(ws / "backend")
    found = find_virtualenvs(str(ws))
    assert found == (str(ws / ".venv"), str(ws / "backend/.venv"), str(ws / "a/b/c/d/e/venv"))
    # the bounds: depth, and the number of directories opened
    assert find_virtualenvs(str(ws), max_depth=2) == found[:2]
    assert find_virtualenvs(str(ws), max_dirs=1) == (str(ws / ".venv"),)


def test_call_policy_lists_protected_paths_only_where_writes_happen(tmp_path: Path) -> None:
    ws = str(tmp_path)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "pyvenv.cfg").write_text("")
    policy = call_policy("workspace-write", ws, protected_names=(".git", "tools/hooks"))
    assert policy.read_only_paths == (f"{ws}/.git", f"{ws}/tools/hooks", f"{ws}/v")
    assert call_policy("read-only", ws).read_only_paths == ()
    assert call_policy("danger-full-access", ws).read_only_paths == ()
    cover = SandboxPolicy(
        mode="workspace-write", workspace_root=ws, read_only_paths=(f"{ws}/.git",)
    )
    assert read_only_cover(cover, f"{ws}/.git/hooks/x") == f"{ws}/.git"
    assert read_only_cover(cover, f"{ws}/.GIT") == f"{ws}/.git"
    assert read_only_cover(cover, f"{ws}/.gitignore") is None
    assert read_only_cover(cover, f"{ws}/src/.git") is None


# --------------------------------------------------------------------------- bash, same view


@contextlib.contextmanager
def persistent_workspace() -> Iterator[Path]:
    """A workspace off /tmp: Landlock grants all of host /tmp under workspace-write, so a
    target there would prove nothing."""
    base = Path(tempfile.mkdtemp(prefix="dsh-protected-", dir="/var/tmp")).resolve()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
async def test_bash_gets_a_nested_virtualenv_read_only_on_both_backends(backend: str) -> None:
    with persistent_workspace() as ws:
        make_tree(ws)
        pth = ws / "backend/.venv/lib/site-packages/evil.pth"
        free = ws / "backend/lib/evil.pth"
        command = f"echo evil >> {pth}; echo ok >> {free}"
        rows = [
            Row(name="tools"),
            Row(name="sandbox-local", config={"backend": backend}),
            Row(name="builtin-tools", config={"workspace": str(ws)}),
        ]
        async with open_host(rows) as host:
            result = await run(
                host, "bash", {"command": command, "description": "write into a nested venv"}
            )
        assert result.value is not None, text_of(result)
        assert pth.read_text() == ORIGINAL, text_of(result)
        assert free.read_text() == ORIGINAL + "ok\n"  # control: the sibling is writable
        # control: with virtualenvs unprotected the same command lands
        rows[-1] = Row(
            name="builtin-tools", config={"workspace": str(ws), "protectVirtualenvs": False}
        )
        async with open_host(rows) as host:
            await run(host, "bash", {"command": command, "description": "write into a venv"})
        assert pth.read_text() == ORIGINAL + "evil\n"
