"""``StatMemo`` (``dsh_host._filewatch``): a value computed from files is reused while an ``lstat``
of every path it looked at is unchanged, and recomputed after any change to them.

Real files in a temporary directory; what is counted is how often the computation ran.
``RACY_NS`` (how recent a change makes a value untrusted) is set per test: 0 where the test is
about changes it makes itself (each of a different size, or a created or removed path, so the
file system's clock tick does not matter), an hour where it is about the racy rule.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsh_host import _filewatch as filewatch
from dsh_host._filewatch import StatMemo, Watched

pytestmark = pytest.mark.anyio


def reader(seen: list[str]) -> StatMemo[str, str]:
    """A memo that reads ``<dir>/a.txt`` (if it exists) and lists ``<dir>/sub``."""

    def compute(directory: str, watched: Watched) -> str:
        seen.append(directory)
        path = os.path.join(directory, "a.txt")
        watched.note(path)
        text = Path(path).read_text() if os.path.exists(path) else "-"
        sub = os.path.join(directory, "sub")
        watched.note(sub, follow=True)
        names = sorted(os.listdir(sub)) if os.path.isdir(sub) else []
        return f"{text}|{','.join(names)}"

    return StatMemo(compute)


async def test_a_value_is_reused_until_a_path_it_read_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filewatch, "RACY_NS", 0)
    seen: list[str] = []
    memo = reader(seen)
    key = str(tmp_path)
    assert await memo.get(key) == "-|"
    assert await memo.get(key) == "-|"
    assert memo.computed == 1  # nothing changed: not recomputed
    (tmp_path / "a.txt").write_text("one")  # a noted path that did not exist appears
    assert await memo.get(key) == "one|"
    assert await memo.get(key) == "one|"
    (tmp_path / "a.txt").write_text("two two")  # an edit
    assert await memo.get(key) == "two two|"
    (tmp_path / "sub").mkdir()  # a listed directory appears
    assert await memo.get(key) == "two two|"
    (tmp_path / "sub" / "x").write_text("")  # an entry appears in it
    assert await memo.get(key) == "two two|x"
    (tmp_path / "a.txt").unlink()
    assert await memo.get(key) == "-|x"
    assert await memo.get(key) == "-|x"
    assert memo.computed == 6
    assert seen == [key] * 6


async def test_a_value_read_right_after_a_change_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A write in the same tick of the file system's clock as a read may leave every timestamp
    # as it was: a value computed within RACY_NS of a change is computed again next time.
    monkeypatch.setattr(filewatch, "RACY_NS", 3600 * 10**9)
    (tmp_path / "a.txt").write_text("fresh")
    memo = reader([])
    for _ in range(3):
        assert await memo.get(str(tmp_path)) == "fresh|"
    assert memo.computed == 3


async def test_a_replaced_part_of_the_path_is_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filewatch, "RACY_NS", 0)
    # The link is replaced by one of another length: a new link may reuse the old one's inode
    # number within the same clock tick (the racy rule covers a same-length one).
    for name, text in (("x", "in x"), ("yy", "in yy")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(text)
    os.symlink(tmp_path / "x", tmp_path / "link")

    def compute(path: str, watched: Watched) -> str:
        real = watched.realpath(path)
        watched.note(os.path.join(real, "a.txt"))
        return Path(real, "a.txt").read_text()

    memo: StatMemo[str, str] = StatMemo(compute)
    key = str(tmp_path / "link")
    assert await memo.get(key) == "in x"
    assert await memo.get(key) == "in x"
    os.unlink(tmp_path / "link")
    os.symlink(tmp_path / "yy", tmp_path / "link")
    assert await memo.get(key) == "in yy"
    assert memo.computed == 2


async def test_at_most_capacity_keys_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filewatch, "RACY_NS", 0)
    memo: StatMemo[str, str] = StatMemo(lambda key, _watched: key, capacity=2)
    for key in ("a", "b", "c", "c"):  # c drops a, the oldest; c is then kept
        await memo.get(key)
    assert memo.computed == 3
    await memo.get("a")
    assert memo.computed == 4
