"""``read_file`` windows, ``write_file`` / ``edit_file`` against real files (issue 23).

Golden model views, the caps, the refusals (zero or ambiguous match, binary, FIFO, symlink out of
the workspace, read-only mode) and atomicity: a real child process running the real tool is
SIGKILLed between the write of the temporary file and the rename, and the host finds the old or
the new content, never a torn file (the control shows an in-place write killed the same way
leaves one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from dsh_host._llm.attachments import MAX_IMAGE_BYTES
from dsh_host._loader import PluginHost
from dsh_host._session import ImageBlock, TextBlock
from dsh_host._tools import ToolExecutionResult

from .tools_helpers import Boot, call, text_of

# both backends: worker threads
pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

#: Hang guard for one child process; nothing here asserts a duration.
GUARD_S = 60


async def run(host: PluginHost, name: str, arguments: Any) -> ToolExecutionResult:
    with anyio.fail_after(GUARD_S):  # hang guard only
        result: ToolExecutionResult = await host.ctx.tools.execute(
            call(name=name, arguments=arguments)
        )
        return result


def code_of(result: ToolExecutionResult) -> str | None:
    assert result.is_error, text_of(result)
    assert result.error is not None and result.error.info is not None
    return result.error.info.code


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def real(path: Path) -> str:
    return os.path.realpath(path)


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def envelope(path: str, body: str, footer: str) -> str:
    return f"<path>{path}</path>\n<type>file</type>\n<content>\n{body}\n{footer}\n</content>"


# --------------------------------------------------------------------------- read_file


async def test_read_file_windows_and_footers(boot: Boot, ws: Path) -> None:
    (ws / "five.txt").write_text("".join(f"line {n}\n" for n in range(1, 6)))
    (ws / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    (ws / "empty.txt").write_text("")
    (ws / "no-newline.txt").write_text("x\ny")
    async with boot(readLimit=3) as host:
        first = await run(host, "read_file", {"path": "five.txt"})
        rest = await run(host, "read_file", {"path": "five.txt", "offset": 4})
        crlf = await run(host, "read_file", {"path": "crlf.txt"})
        empty = await run(host, "read_file", {"path": "empty.txt"})
        tail = await run(host, "read_file", {"path": "no-newline.txt"})
        past = await run(host, "read_file", {"path": "five.txt", "offset": 9})
        too_many = await run(host, "read_file", {"path": "five.txt", "limit": 4})
        schema = host.ctx.tools.get("read_file")
    assert text_of(first) == envelope(
        "five.txt",
        "1: line 1\n2: line 2\n3: line 3\n",
        "(Showing lines 1-3 of 5, 2 more lines. Use offset=4 to continue.)",
    )
    assert text_of(rest) == envelope(
        "five.txt", "4: line 4\n5: line 5\n", "(End of file - total 5 lines)"
    )
    assert text_of(crlf) == envelope("crlf.txt", "1: a\n2: b\n", "(End of file - total 2 lines)")
    assert text_of(empty) == envelope("empty.txt", "", "(End of file - total 0 lines)")
    assert text_of(tail) == envelope(
        "no-newline.txt", "1: x\n2: y\n", "(End of file - total 2 lines)"
    )
    assert text_of(past) == 'Error: offset 9 is out of range for "five.txt" (5 lines)'
    assert text_of(too_many) == "Error: limit must be less than or equal to 3"
    assert schema is not None
    assert "at most) 3" in schema.parameters["properties"]["limit"]["description"]


async def test_read_file_byte_cap_and_long_lines(boot: Boot, ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"{n:04d} " + "x" * 95 + "\n" for n in range(1, 1001)))
    (ws / "wide.txt").write_text("y" * 50_000 + "\nshort\n")
    async with boot(maxReadBytes=1000, readMaxLineLength=20) as host:
        big = await run(host, "read_file", {"path": "big.txt"})
        wide = await run(host, "read_file", {"path": "wide.txt"})
    lines = text_of(big).splitlines()
    # 20 characters kept per line + the suffix + newline: 53 bytes a line, 18 fit in 1000 bytes
    # (the line-number prefix is not counted).
    assert lines[3] == "1: 0001 xxxxxxxxxxxxxxx... (line truncated to 20 chars)"
    assert lines[20] == "18: 0018 xxxxxxxxxxxxxxx... (line truncated to 20 chars)"
    assert lines[-2] == (
        "(Output truncated at 1000 bytes: showing lines 1-18 of 1000, 982 more lines. "
        "Use offset=19 to continue.)"
    )
    assert text_of(wide) == envelope(
        "wide.txt",
        "1: " + "y" * 20 + "... (line truncated to 20 chars)\n2: short\n",
        "(End of file - total 2 lines)",
    )


async def test_read_file_refuses_binary_files_with_the_reason(boot: Boot, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"PK\x03\x04" + b"\0" * 10 + b"rest")
    (ws / "late.bin").write_bytes(b"a" * 9000 + b"\0")  # past the sniffed prefix: text
    async with boot() as host:
        blob = await run(host, "read_file", {"path": "blob.bin"})
        late = await run(host, "read_file", {"path": "late.bin"})
    assert text_of(blob) == (
        'Error: "blob.bin" looks like a binary file (a NUL byte at offset 4); read_file only '
        "handles text files (use bash, e.g. `file` or `xxd`, to inspect it)"
    )
    assert not late.is_error


def tiny_png() -> bytes:
    """A real 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return len(data).to_bytes(4, "big") + kind + data + crc.to_bytes(4, "big")

    header = (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00\x00\xff\x00")) + chunk(b"IEND", b""))


async def test_read_file_returns_an_image_as_an_image(boot: Boot, ws: Path) -> None:
    """A PNG (recognised by its bytes, whatever its name) comes back as DSH's envelope and an
    image block with its bytes in the record (D31); one over the limit is refused, saying
    what to do."""
    picture = tiny_png()
    (ws / "shot.dat").write_bytes(picture)
    (ws / "huge.png").write_bytes(picture + b"\0" * MAX_IMAGE_BYTES)
    async with boot() as host:
        shot = await run(host, "read_file", {"path": "shot.dat"})
        huge = await run(host, "read_file", {"path": "huge.png"})
    assert not shot.is_error
    envelope_block, image = shot.content
    assert envelope_block == TextBlock(text=(
        f"<path>shot.dat</path>\n<type>image</type>\n<content>\nimage/png, {len(picture)} "
        "bytes (the image follows)\n</content>"
    ))
    assert isinstance(image, ImageBlock)
    assert dict(image.attachment) == {
        "attachmentId": "sha256-" + sha(picture),
        "mediaType": "image/png",
        "bytes": len(picture),
        "name": "shot.dat",
        "data": base64.b64encode(picture).decode(),
    }
    assert huge.is_error
    assert text_of(huge).startswith(
        f'Error: "huge.png" is an image of {len(picture) + MAX_IMAGE_BYTES} bytes, over the '
        f"{MAX_IMAGE_BYTES} bytes read_file sends to the model; make a smaller copy"
    )


# --------------------------------------------------------------------------- write_file


async def test_write_file_creates_parents_only_when_asked(boot: Boot, ws: Path) -> None:
    async with boot() as host:
        refused = await run(host, "write_file", {"path": "a/b/c.txt", "content": "x"})
        made = await run(
            host, "write_file", {"path": "a/b/c.txt", "content": "x", "create_parents": True}
        )
    assert text_of(refused) == (
        'Error: the parent directory "a/b" of "a/b/c.txt" does not exist; pass '
        "create_parents: true to create it"
    )
    assert not made.is_error and (ws / "a" / "b" / "c.txt").read_text() == "x"


async def test_write_file_records_the_previous_digest_and_keeps_the_mode(
    boot: Boot, ws: Path
) -> None:
    target = ws / "run.sh"
    target.write_bytes(b"#!/bin/sh\necho old\n")
    target.chmod(0o751)
    async with boot() as host:
        updated = await run(host, "write_file", {"path": "run.sh", "content": "echo new\n"})
        created = await run(host, "write_file", {"path": "new.txt", "content": "n"})
    assert text_of(updated) == "Wrote 9 bytes to run.sh"
    assert updated.meta == {
        "path": "run.sh",
        "operation": "update",
        "previousSha256": sha(b"#!/bin/sh\necho old\n"),
        "sha256": sha(b"echo new\n"),
    }
    assert created.meta == {
        "path": "new.txt",
        "operation": "create",
        "previousSha256": None,
        "sha256": sha(b"n"),
    }
    assert target.stat().st_mode & 0o7777 == 0o751
    assert temp_files(ws) == []


# --------------------------------------------------------------------------- edit_file

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


async def test_edit_file_replaces_one_match_and_shows_a_diff(boot: Boot, ws: Path) -> None:
    target = ws / "calc.py"
    target.write_text(SOURCE)
    target.chmod(0o640)
    async with boot() as host:
        result = await run(
            host,
            "edit_file",
            {"path": "calc.py", "old_string": "return a - b", "new_string": "return a - b  # ok"},
        )
    after = SOURCE.replace("return a - b", "return a - b  # ok")
    assert target.read_text() == after
    assert target.stat().st_mode & 0o777 == 0o640
    assert text_of(result) == (
        "The file calc.py has been updated successfully.\n"
        "--- a/calc.py\n"
        "+++ b/calc.py\n"
        "@@ -3,4 +3,4 @@\n"
        " \n"
        " \n"
        " def sub(a, b):\n"
        "-    return a - b\n"
        "+    return a - b  # ok"
    )
    assert result.meta == {
        "path": "calc.py",
        "operation": "update",
        "previousSha256": sha(SOURCE.encode()),
        "sha256": sha(after.encode()),
    }


async def test_edit_file_refuses_zero_and_ambiguous_matches_with_counts(
    boot: Boot, ws: Path
) -> None:
    (ws / "calc.py").write_text(SOURCE)
    async with boot() as host:
        none = await run(
            host, "edit_file", {"path": "calc.py", "old_string": "return a * b", "new_string": "x"}
        )
        many = await run(
            host, "edit_file", {"path": "calc.py", "old_string": "(a, b)", "new_string": "(x, y)"}
        )
        empty = await run(
            host, "edit_file", {"path": "calc.py", "old_string": "", "new_string": "x"}
        )
        same = await run(
            host, "edit_file", {"path": "calc.py", "old_string": "add", "new_string": "add"}
        )
        every = await run(
            host,
            "edit_file",
            {
                "path": "calc.py",
                "old_string": "(a, b)",
                "new_string": "(x, y)",
                "replace_all": True,
            },
        )
    assert text_of(none) == (
        'Error: old_string was not found in "calc.py" (0 matches); it must match the file '
        "exactly, including whitespace and indentation; read the file again and copy the text"
    )
    assert code_of(none) == "FS_EDIT_MATCH"
    assert text_of(many) == (
        'Error: old_string matches 2 times in "calc.py"; provide a longer old_string that '
        "matches exactly once, or set replace_all to true"
    )
    assert code_of(many) == "FS_EDIT_MATCH"
    assert text_of(empty) == "Error: old_string must be a non-empty string"
    assert text_of(same) == "Error: old_string and new_string must differ"
    assert text_of(every).startswith(
        "The file calc.py has been updated. All occurrences were successfully replaced (2).\n"
    )
    assert (ws / "calc.py").read_text() == SOURCE.replace("(a, b)", "(x, y)")


async def test_edit_file_refusals_leave_files_alone(boot: Boot, ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text(SOURCE)
    (ws / "link.py").symlink_to(outside)
    (ws / "dirlink").symlink_to(tmp_path)
    (ws / "calc.py").write_text(SOURCE)
    (ws / "inlink.py").symlink_to(ws / "calc.py")  # inside, still not followed
    (ws / "blob.bin").write_bytes(b"a\0b")
    os.mkfifo(ws / "pipe")
    edit = {"old_string": "add", "new_string": "mul"}
    async with boot() as host:
        link = await run(host, "edit_file", {"path": "link.py", **edit})
        through = await run(host, "edit_file", {"path": "dirlink/outside.py", **edit})
        dotdot = await run(host, "edit_file", {"path": "../outside.py", **edit})
        inlink = await run(host, "edit_file", {"path": "inlink.py", **edit})
        blob = await run(
            host, "edit_file", {"path": "blob.bin", "old_string": "a", "new_string": "c"}
        )
        fifo = await run(host, "edit_file", {"path": "pipe", **edit})
        missing = await run(host, "edit_file", {"path": "nope.py", **edit})
    for result in (link, through, dotdot, inlink):
        assert code_of(result) == "FS_OUTSIDE_WORKSPACE", text_of(result)
    assert "outside the workspace" in text_of(link)
    assert text_of(inlink) == (
        'Error: path "inlink.py" goes through a symbolic link; the file tools do not follow '
        f"links (a link can lead outside the workspace {real(ws)})"
    )
    assert (ws / "calc.py").read_text() == SOURCE
    assert text_of(blob).startswith('Error: "blob.bin" looks like a binary file')
    assert text_of(fifo) == (
        'Error: "pipe" is not a regular file (a FIFO, socket or device); edit_file only reads '
        "regular files"
    )
    assert text_of(missing) == 'Error: file "nope.py" does not exist'
    assert outside.read_text() == SOURCE
    assert (ws / "blob.bin").read_bytes() == b"a\0b"


async def test_edit_file_is_denied_under_read_only(boot: Boot, ws: Path) -> None:
    (ws / "calc.py").write_text(SOURCE)
    async with boot(sandbox="read-only") as host:
        result = await run(
            host, "edit_file", {"path": "calc.py", "old_string": "add", "new_string": "mul"}
        )
        mode = host.ctx.tools.execution_mode(call(name="edit_file", arguments={"path": "a"}))
    assert text_of(result) == (
        "Error: edit_file is not allowed under read-only mode "
        "[sandbox: file access denied under read-only mode]"
    )
    assert code_of(result) == "FS_SANDBOX_DENIED"
    assert (ws / "calc.py").read_text() == SOURCE
    assert mode == "exclusive"


# --------------------------------------------------------------------------- atomicity

#: A real host in a child process running one real file tool call. An audit hook parks the
#: process at the rename of the target (after the temporary file was written and fsynced) and
#: says so; the test SIGKILLs it there. With "go" it lets the rename through.
CHILD = r"""
import sys, time, anyio
from dsh_host import CancelToken, Row, open_host
from dsh_host._tools import ToolExecutionInput

workspace, tool, arguments, park = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "park"
with open(arguments) as handle:
    arguments = handle.read()

def hook(event, args):
    if event == "os.rename" and str(args[1]).endswith("target.txt"):
        print("renaming", flush=True)
        while park:
            time.sleep(1)

async def main():
    import json
    rows = [Row(name="tools"), Row(name="builtin-tools", config={"workspace": workspace})]
    async with open_host(rows) as host:
        sys.addaudithook(hook)
        result = await host.ctx.tools.execute(ToolExecutionInput(
            call_id="call-kill", name=tool, arguments=json.loads(arguments), signal=CancelToken()))
        print("done", result.is_error, flush=True)

anyio.run(main)
"""

#: The control: the same kill point for a writer that rewrites the file in place.
IN_PLACE = r"""
import sys, time
with open(sys.argv[2]) as source:
    content = source.read()
with open(sys.argv[1], "w") as handle:
    handle.write(content[: len(content) // 2])
    handle.flush()
    print("renaming", flush=True)
    while True:
        time.sleep(1)
"""

OLD = "old line\n" * 20_000
NEW = "new line\n" * 20_000


def killed_at_rename(argv: list[str]) -> str:
    """Run ``argv``, wait for its "renaming" line, SIGKILL it, and return what it printed."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        child.send_signal(signal.SIGKILL)  # only the child this test started
        _, err = child.communicate(timeout=GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert line == "renaming\n", err
    assert child.returncode == -signal.SIGKILL
    return line


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_sigkill_between_write_and_rename_leaves_the_old_file(
    ws: Path, tmp_path: Path, tool: str
) -> None:
    target = ws / "target.txt"
    target.write_text(OLD)
    arguments: dict[str, Any]
    if tool == "write_file":
        arguments = {"path": "target.txt", "content": NEW}
    else:
        arguments = {
            "path": "target.txt",
            "old_string": "old",
            "new_string": "new",
            "replace_all": True,
        }
    (tmp_path / "args.json").write_text(json.dumps(arguments))
    argv = [sys.executable, "-c", CHILD, str(ws), tool, str(tmp_path / "args.json")]
    killed_at_rename([*argv, "park"])
    assert target.read_text() == OLD  # judged from the host: the old file, whole
    assert [p.read_text() == NEW for p in temp_files(ws)] == [
        True
    ]  # the complete temp, not renamed
    finished = subprocess.run([*argv, "go"], capture_output=True, text=True, timeout=GUARD_S)
    assert finished.stdout.endswith("done False\n"), finished.stderr
    assert target.read_text() == NEW


def test_control_an_in_place_write_killed_there_is_torn(ws: Path, tmp_path: Path) -> None:
    target = ws / "target.txt"
    target.write_text(OLD)
    (tmp_path / "new.txt").write_text(NEW)
    killed_at_rename([sys.executable, "-c", IN_PLACE, str(target), str(tmp_path / "new.txt")])
    torn = target.read_text()
    assert torn not in (OLD, NEW)
    assert torn == NEW[: len(NEW) // 2]


# --------------------------------------------------------------------------- glob and grep


def sample_repo(ws: Path, outside: Path) -> None:
    """A small repository: ignored build output, a nested .gitignore with a negation, a .git
    directory, a binary file and a symlink to a directory outside the workspace."""
    files = {
        ".gitignore": "build/\n*.log\n",
        "README.md": "# sample\nTODO: write docs\n",
        "src/app.py": "def main():\n    return 'TODO'\n",
        "src/util.py": "import os\n# todo lower case\n",
        "src/.gitignore": "generated_*.py\n!generated_keep.py\n",
        "src/generated_x.py": "TODO generated\n",
        "src/generated_keep.py": "TODO kept\n",
        "build/out.py": "TODO built\n",
        "debug.log": "TODO log\n",
        ".git/config": "TODO git\n",
    }
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    (ws / "src" / "blob.py").write_bytes(b"TODO\0binary")
    outside.mkdir()
    (outside / "secret.py").write_text("TODO outside\n")
    (ws / "linked").symlink_to(outside)


async def test_glob_honours_gitignore_and_sorts(boot: Boot, ws: Path, tmp_path: Path) -> None:
    sample_repo(ws, tmp_path / "outside")
    async with boot() as host:
        python = await run(host, "glob", {"pattern": "*.py"})
        under = await run(host, "glob", {"pattern": "*.py", "path": "src"})
        none = await run(host, "glob", {"pattern": "*.rs"})
        escape = await run(host, "glob", {"pattern": "*", "path": "linked"})
    assert text_of(python) == "src/app.py\nsrc/blob.py\nsrc/generated_keep.py\nsrc/util.py"
    assert text_of(under) == text_of(python)
    assert text_of(none) == 'No files match "*.rs".'
    assert code_of(escape) == "FS_OUTSIDE_WORKSPACE"


async def test_grep_finds_sorted_lines_and_skips_ignored_binary_and_links(
    boot: Boot, ws: Path, tmp_path: Path
) -> None:
    sample_repo(ws, tmp_path / "outside")
    async with boot(maxSearchResults=2) as host:
        capped = await run(host, "grep", {"pattern": "TODO"})
        spilled = text_of(capped).rsplit("stored at: ", 1)[1].split(". Use read_file")[0]
        paged = await run(host, "read_file", {"path": spilled, "offset": 3})
    async with boot() as host:
        every = await run(host, "grep", {"pattern": "TODO"})
        folded = await run(host, "grep", {"pattern": "todo", "ignore_case": True, "glob": "*.py"})
        bad = await run(host, "grep", {"pattern": "f(("})
    assert text_of(every) == (
        "README.md:2: TODO: write docs\n"
        "src/app.py:2:     return 'TODO'\n"
        "src/generated_keep.py:1: TODO kept"
    )
    assert text_of(capped) == (
        "README.md:2: TODO: write docs\n"
        "src/app.py:2:     return 'TODO'\n"
        f"(1 more matching lines not shown. Full grep result stored at: {spilled}. Use read_file "
        "with offset/limit to page through it.)"
    )
    assert text_of(paged) == envelope(
        spilled, "3: src/generated_keep.py:1: TODO kept\n", "(End of file - total 3 lines)"
    )
    assert text_of(folded) == (
        "src/app.py:2:     return 'TODO'\n"
        "src/generated_keep.py:1: TODO kept\n"
        "src/util.py:2: # todo lower case"
    )
    assert text_of(bad).startswith("Error: invalid pattern: ")
