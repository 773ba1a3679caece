"""The built-in tools against real processes, a real sandbox and real files."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host import CancelToken, Row, open_host
from dsh_host._loader import PluginHost
from dsh_host._tools import ToolErrorInfo, ToolExecutionResult, ToolRuntime
from dsh_host._tools.types import STOPPED_OUTCOME_UNKNOWN_TEXT

from .tools_helpers import call, text_of

# both backends: subprocesses (bash) and worker threads
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SANDBOX_TEXT = (
    'sandbox mode "{mode}" is requested but no sandbox backend is usable on this host; refusing '
    "to run the command unconfined. Install bubblewrap or run a Landlock-enforcing kernel "
    "(Linux), ensure sandbox-exec is usable (macOS), or ensure the ACL restricted-token runner "
    "can start (Windows) — otherwise switch the consumer to danger-full-access."
)

Boot = Callable[..., AbstractAsyncContextManager[PluginHost]]


@pytest.fixture
def boot(tmp_path: Path) -> Boot:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)

    @asynccontextmanager
    async def booted(*, with_sandbox: bool = True, **config: Any) -> AsyncIterator[PluginHost]:
        rows = [Row(name="tools")]
        if with_sandbox:
            rows.append(Row(name="sandbox-local", config={"network": "deny"}))
        settings = {"workspace": str(workspace), **config}
        rows.append(Row(name="builtin-tools", config=settings))
        async with open_host(rows) as host:
            yield host

    return booted


def real(path: Path) -> str:
    return os.path.realpath(path)


def read_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def modes(spill: Path) -> tuple[int, int]:
    """Permission bits of a spill file and of its directory."""
    return spill.stat().st_mode & 0o777, spill.parent.stat().st_mode & 0o777


def area_gone(spill: Path) -> bool:
    return not spill.parent.exists()


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {"command": command, "description": "run a test command", **extra}


async def run(host: PluginHost, arguments: Any, **options: Any) -> ToolExecutionResult:
    tools: ToolRuntime = host.ctx.tools
    name = options.pop("name", "bash")
    return await tools.execute(call(name=name, arguments=arguments, **options))


# --------------------------------------------------------------------------- bash


async def test_bash_exports_the_call_id(boot: Boot) -> None:
    async with boot() as host:
        result = await run(host, bash('echo "id=$DSH_CALL_ID"'), call_id="call-xyz")
    assert not result.is_error, text_of(result)
    assert text_of(result) == "id=call-xyz\n"
    assert result.value["sandbox"]["mode"] == "workspace-write"
    assert result.value["sandbox"]["enforcement"] in ("full", "partial")


async def test_bash_output_format_and_exit_marker(boot: Boot) -> None:
    async with boot(with_sandbox=False, sandbox="danger-full-access") as host:
        result = await run(host, bash("echo out; echo err >&2; exit 3"))
        empty = await run(host, bash("true"))
    assert text_of(result) == "out\n[stderr]\nerr\n[exit code: 3]"
    assert not result.is_error  # a failing command is a result the model reads, not an error
    assert result.value["sandbox"] == {"mode": "danger-full-access", "denied": False}
    assert text_of(empty) == "(no output)"


async def test_bash_without_a_sandbox_refuses_and_runs_nothing(boot: Boot, tmp_path: Path) -> None:
    marker = tmp_path / "ws" / "ran"
    async with boot(with_sandbox=False) as host:
        result = await run(host, bash(f"touch {marker}"))
    assert result.is_error
    assert text_of(result) == "Error: " + SANDBOX_TEXT.format(mode="workspace-write")
    assert result.error is not None
    assert result.error.info == ToolErrorInfo("SandboxUnavailableError", "SANDBOX_UNAVAILABLE")
    assert not marker.exists()


async def test_danger_full_access_needs_no_sandbox(boot: Boot, tmp_path: Path) -> None:
    marker = tmp_path / "ws" / "ran"
    async with boot(with_sandbox=False, sandbox="danger-full-access") as host:
        result = await run(host, bash(f"touch {marker}"))
    assert not result.is_error
    assert marker.exists()


async def test_read_only_denial_marker(boot: Boot, tmp_path: Path) -> None:
    target = tmp_path / "ws" / "blocked.txt"
    async with boot(sandbox="read-only") as host:
        result = await run(host, bash(f"echo x > {target}"))
    text = text_of(result)
    assert "[sandbox: file access denied under read-only mode]" in text
    assert text.endswith("[exit code: 1]")
    assert result.value["sandbox"]["denied"] is True
    assert not target.exists()


async def test_workspace_write_writes_inside_the_workspace(boot: Boot, tmp_path: Path) -> None:
    target = tmp_path / "ws" / "sub" / "ok.txt"
    async with boot() as host:
        result = await run(host, bash("mkdir -p sub && echo hello > sub/ok.txt"))
    assert not result.is_error, text_of(result)
    assert target.read_text() == "hello\n"


async def test_relative_workdir_resolves_against_the_workspace(boot: Boot, tmp_path: Path) -> None:
    (tmp_path / "ws" / "d").mkdir()
    async with boot(sandbox="danger-full-access") as host:
        result = await run(host, bash("pwd", workdir="d"))
    assert text_of(result).strip() == real(tmp_path / "ws" / "d")


async def test_timeout_kills_and_reports(boot: Boot) -> None:
    async with boot(sandbox="danger-full-access") as host:
        result = await run(host, bash("echo started; exec sleep 30", timeoutMs=300))
    text = text_of(result)
    assert text.startswith("started\n")
    assert "[timed out after 300ms]" in text
    assert text.endswith("[killed by signal: SIGTERM]")


async def test_timeout_under_the_sandbox(boot: Boot) -> None:
    async with boot() as host:
        result = await run(host, bash("sleep 30", timeoutMs=300))
    assert "[timed out after 300ms]" in text_of(result)


@pytest.mark.parametrize("mode", ["danger-full-access", "workspace-write"])
async def test_cancel_during_the_body_terminates_and_awaits_the_child(
    boot: Boot, tmp_path: Path, mode: str
) -> None:
    pid_file = tmp_path / "ws" / "pid"
    token = CancelToken()
    results: list[ToolExecutionResult] = []
    async with boot(sandbox=mode) as host:
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                results.append(
                    await run(host, bash(f"echo $$ > {pid_file}; exec sleep 60"), signal=token)
                )

            tg.start_soon(go)
            # The child is another process: nothing to wait on but the file it writes.
            while not read_text(pid_file).strip():  # noqa: ASYNC110
                await anyio.sleep(0.02)
            token.abort("user")
    [result] = results
    # D18: the body had started, so its outcome is unknown (never "aborted" as if nothing ran)
    assert text_of(result) == STOPPED_OUTCOME_UNKNOWN_TEXT
    assert result.error is not None
    assert result.error.info == ToolErrorInfo("ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN")
    pid = int(pid_file.read_text())
    if mode == "danger-full-access":  # inside bwrap the pid is namespaced
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_environment_is_an_allow_list(boot: Boot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", "secret-value")
    monkeypatch.setenv("DSH_INHERITED", "leak")
    monkeypatch.setenv("HARMLESS_VAR", "not-listed")
    monkeypatch.setenv("LC_DSH_TEST", "c-locale")
    async with boot(sandbox="danger-full-access") as host:
        result = await run(host, bash("env"))
    text = text_of(result)
    assert "secret-value" not in text
    assert "DSH_INHERITED" not in text
    assert "HARMLESS_VAR" not in text
    assert "LC_DSH_TEST=c-locale" in text  # LC_* is on the default list
    assert f"PATH={os.environ['PATH']}" in text
    assert "DSH_SHELL=1" in text
    assert "DSH_CALL_ID=call-1" in text
    assert "DSH_IDEMPOTENCY_KEY=dsh-" in text  # the key of a call outside a session, too
    assert "TERM=dumb" in text


async def test_env_allow_adds_names_and_prefixes(
    boot: Boot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARMLESS_VAR", "listed")
    monkeypatch.setenv("MYAPP_ONE", "1")
    monkeypatch.setenv("DSH_INHERITED", "leak")
    async with boot(
        sandbox="danger-full-access", envAllow=["HARMLESS_VAR", "MYAPP_*", "DSH_*"]
    ) as host:
        result = await run(host, bash("env"))
    text = text_of(result)
    assert "HARMLESS_VAR=listed" in text
    assert "MYAPP_ONE=1" in text
    assert "DSH_INHERITED" not in text  # inherited DSH_* never pass


@pytest.mark.parametrize("entry", ["", "A=B", "*X", "A*B*"])
async def test_env_allow_rejects_malformed_entries(boot: Boot, entry: str) -> None:
    with pytest.raises(Exception, match="envAllow entry"):
        async with boot(envAllow=[entry]):
            pass


async def test_long_output_keeps_head_and_tail_and_spills(boot: Boot) -> None:
    async with boot(sandbox="danger-full-access", maxOutputBytes=1000) as host:
        result = await run(host, bash("seq 1 5000"))
        stdout = result.value["stdout"]
        spill = Path(stdout["spillPath"])
        spilled = read_text(spill)
        mode = modes(spill)
        # the model pages the spilled stream with read_file on the path it was shown
        paged = await host.ctx.tools.execute(
            call(name="read_file", arguments={"path": stdout["spillPath"], "limit": 2})
        )
    text = text_of(result)
    assert text_of(paged) == (
        f"<path>{stdout['spillPath']}</path>\n<type>file</type>\n<content>\n1: 1\n2: 2\n\n"
        "(Showing lines 1-2 of 5000, 4998 more lines. Use offset=3 to continue.)\n</content>"
    )
    assert stdout["truncated"] is True
    assert text.splitlines()[-1] == f"[output truncated; full output: {stdout['spillPath']}]"
    assert stdout["text"].endswith("4999\n5000\n")  # the tail
    assert stdout["text"].startswith("1\n2\n3\n")  # and the head (issue 42)
    head, omitted, tail = stdout["text"].partition(f"\n[... {stdout['omittedBytes']} bytes omitted")
    assert omitted and len((head + tail).encode()) <= 1000 + 40
    assert spilled == "".join(f"{n}\n" for n in range(1, 5001))
    assert mode == (0o600, 0o700)
    # The spill area is private to the row and deleted when the row unloads (end of the run).
    assert read_text(spill) == "" and area_gone(spill)


async def test_spill_is_capped_with_a_marker(boot: Boot) -> None:
    async with boot(sandbox="danger-full-access", maxOutputBytes=1000, maxSpillBytes=5000) as host:
        result = await run(host, bash("seq 1 100000"))
        spilled = read_text(Path(result.value["stdout"]["spillPath"]))
    stdout = result.value["stdout"]
    assert stdout["spillCapped"] is True
    assert "99999\n100000\n" in stdout["text"]  # the model still gets the tail
    assert text_of(result).endswith(
        f"[output truncated; the output up to the spill cap is saved: {stdout['spillPath']}]"
    )
    full = "".join(f"{n}\n" for n in range(1, 100001))
    marker = "\n[dsh: spill capped at 5000 bytes; the rest of this stream was discarded]\n"
    assert spilled == full[:5000] + marker


async def test_spill_dir_inside_a_writable_root_is_refused(boot: Boot, tmp_path: Path) -> None:
    from dsh_host.errors import BootError

    with pytest.raises(BootError) as refused:
        async with boot(spillDir=str(tmp_path / "ws" / "spill")):
            pass
    assert "spillDir" in str(refused.value) and "sandboxed commands can write" in str(refused.value)


async def test_invalid_bash_arguments(boot: Boot) -> None:
    async with boot(sandbox="danger-full-access") as host:
        blank = await run(host, bash("   "))
        no_description = await run(host, {"command": "echo ran without a description"})
        bad_timeout = await run(host, bash("ls", timeoutMs=-5))
    assert text_of(blank) == "Error: invalid command: expected a non-empty string"
    # `description` only labels the call for people: a call without one runs.
    assert text_of(no_description).startswith("ran without a description"), text_of(no_description)
    assert text_of(bad_timeout) == "Error: invalid timeoutMs: expected a positive number, got -5"


# --------------------------------------------------------------------------- files


async def test_write_then_read(boot: Boot, tmp_path: Path) -> None:
    async with boot() as host:
        args = {"path": "notes/a.txt", "content": "one\ntwo\nthree\n", "create_parents": True}
        wrote = await run(host, args, name="write_file")
        whole = await run(host, {"path": "notes/a.txt"}, name="read_file")
        part = await run(host, {"path": "notes/a.txt", "offset": 2, "limit": 1}, name="read_file")
    assert text_of(wrote) == "Wrote 14 bytes to notes/a.txt"
    assert (tmp_path / "ws" / "notes" / "a.txt").read_text() == "one\ntwo\nthree\n"
    assert text_of(whole) == (
        "<path>notes/a.txt</path>\n<type>file</type>\n<content>\n"
        "1: one\n2: two\n3: three\n\n(End of file - total 3 lines)\n</content>"
    )
    assert text_of(part) == (
        "<path>notes/a.txt</path>\n<type>file</type>\n<content>\n"
        "2: two\n\n(Showing lines 2-2 of 3, 1 more line. Use offset=3 to continue.)\n</content>"
    )
    assert not [p for p in (tmp_path / "ws" / "notes").iterdir() if p.name.endswith(".tmp")]


async def test_file_tools_are_fenced(boot: Boot, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("private")
    (tmp_path / "ws" / "link").symlink_to(outside)
    (tmp_path / "ws" / "dirlink").symlink_to(tmp_path)
    async with boot() as host:
        results = [
            await run(host, {"path": "../outside.txt"}, name="read_file"),
            await run(host, {"path": str(outside)}, name="read_file"),
            await run(host, {"path": "link"}, name="read_file"),
            await run(host, {"path": "dirlink/outside.txt", "content": "x"}, name="write_file"),
            await run(host, {"path": "link", "content": "overwrite"}, name="write_file"),
        ]
    for result in results:
        assert result.is_error
        assert "outside the workspace" in text_of(result)
        assert result.error is not None and result.error.info is not None
        assert result.error.info.code == "FS_OUTSIDE_WORKSPACE"
    assert outside.read_text() == "private"


async def test_write_file_respects_read_only_mode(boot: Boot, tmp_path: Path) -> None:
    async with boot(sandbox="read-only") as host:
        result = await run(host, {"path": "x.txt", "content": "x"}, name="write_file")
    assert "[sandbox: file access denied under read-only mode]" in text_of(result)
    assert not (tmp_path / "ws" / "x.txt").exists()


async def test_read_file_errors(boot: Boot, tmp_path: Path) -> None:
    (tmp_path / "ws" / "bin").write_bytes(b"\0\1\2")
    async with boot() as host:
        missing = await run(host, {"path": "nope.txt"}, name="read_file")
        binary = await run(host, {"path": "bin"}, name="read_file")
        directory = await run(host, {"path": "."}, name="read_file")
    assert text_of(missing) == 'Error: file "nope.txt" does not exist'
    assert "binary" in text_of(binary)
    assert directory.is_error


async def test_read_file_is_parallel_safe(boot: Boot) -> None:
    async with boot() as host:
        tools: ToolRuntime = host.ctx.tools
        assert tools.execution_mode(call(name="read_file", arguments={"path": "a"})) == "parallel"
        assert tools.execution_mode(call(name="write_file", arguments={"path": "a"})) == "exclusive"
        assert tools.execution_mode(call(name="bash", arguments=bash("ls"))) == "exclusive"
        assert tools.execution_mode(call(name="edit_file", arguments={"path": "a"})) == "exclusive"
        for name in ("glob", "grep", "list_dir"):
            assert tools.execution_mode(call(name=name, arguments={"pattern": "x"})) == "parallel"
        assert tools.names() == [
            "bash",
            "edit_file",
            "glob",
            "grep",
            "list_dir",
            "read_file",
            "write_file",
        ]
