"""``dsh sessions list`` remembers each log's summary under the revision it was read at
(``dsh_host/_cli/list_cache.py``): an unchanged log is not read again, a changed or damaged one
always is, and a cache in any bad state is rebuilt without the listing noticing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dsh_host import __version__
from dsh_host._cli import list_cache
from dsh_host._cli.list_cache import ListCache

from .cli_helpers import dsh, json_lines


def _script(path: Path, text: str) -> Path:
    path.write_text(json.dumps({"responses": [
        {"text": text, "usage": {"input_tokens": 11, "output_tokens": 3}},
    ]}))
    return path


def _cache() -> Path:
    return Path(os.environ["XDG_CACHE_HOME"]) / "dsh" / "sessions-list.json"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with two stored sessions (under the tests' private XDG data home)."""
    work = tmp_path / "project"
    work.mkdir()
    for prompt in ("first session", "second session"):
        ran = dsh("run", prompt, "--model", f"scripted:{_script(tmp_path / 's.json', 'ok')}",
                  "--json", cwd=work)
        assert ran.returncode == 0, ran.stderr
    return work


def _list(cwd: Path, *flags: str) -> list[dict[str, Any]]:
    listed = dsh("sessions", "list", "--json", *flags, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""
    return json_lines(listed.stdout)


def _logs() -> dict[str, Path]:
    root = Path(os.environ["XDG_DATA_HOME"]) / "dsh" / "sessions"
    return {log.parent.name: log for log in root.rglob("session.v3.jsonl.zstd")}


def _entries() -> dict[str, Any]:
    document = json.loads(_cache().read_bytes())
    entries: dict[str, Any] = document["sessions"]
    return entries


def test_an_unchanged_log_is_not_read_again(project: Path) -> None:
    """The second listing prints what the first did; a remembered summary is what it prints
    (a planted title shows), until ``--fresh`` reads every log again and replaces it."""
    first = _list(project)
    assert [e["title"] for e in first] == ["second session", "first session"]
    assert all(e["events"] and e["problem"] is None for e in first)
    assert stat.S_IMODE(_cache().stat().st_mode) == 0o600
    assert stat.S_IMODE(_cache().parent.stat().st_mode) == 0o700
    logs = _logs()
    assert set(_entries()) == {f"jsonl:{log}" for log in logs.values()}
    assert _list(project) == first

    entries = _entries()
    planted = f"jsonl:{logs[first[0]['sessionId']]}"
    entries[planted]["title"] = "remembered, not read"
    _cache().write_text(json.dumps({"format": 1, "dsh": __version__, "sessions": entries}))
    assert _list(project)[0]["title"] == "remembered, not read"

    assert _list(project, "--fresh") == first
    assert _entries()[planted]["title"] == "second session"


def test_a_continued_session_is_read_again(project: Path, tmp_path: Path) -> None:
    first = _list(project)
    older = first[1]["sessionId"]
    again = dsh("run", "more", "--session", older, "--model",
                f"scripted:{_script(tmp_path / 'again.json', 'more ok')}", "--json", cwd=project)
    assert again.returncode == 0, again.stderr
    after = {e["sessionId"]: e for e in _list(project)}
    assert after[older]["events"] > first[1]["events"]
    assert after[older]["usage"]["inputTokens"] == 2 * first[1]["usage"]["inputTokens"]
    assert after[older]["size"] > first[1]["size"]
    assert list(after.values()) == _list(project, "--fresh")


def test_a_log_damaged_in_place_is_reported_and_forgotten(project: Path) -> None:
    """A byte flipped inside a log after it was listed, its mtime put back, same size: the
    revision still differs (the ctime moved), so the listing reads it and says it is damaged."""
    first = _list(project)
    victim = first[0]["sessionId"]
    log = _logs()[victim]
    before = log.stat()
    data = bytearray(log.read_bytes())
    offset = len(data) // 2  # inside a frame that is not the last (a torn tail is repairable)
    data[offset] ^= 0xFF
    fd = os.open(log, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(data[offset:offset + 1]), offset)
    finally:
        os.close(fd)
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert log.stat().st_size == before.st_size and log.stat().st_mtime_ns == before.st_mtime_ns

    listed = {e["sessionId"]: e for e in _list(project)}
    assert listed[victim]["problem"], listed[victim]
    assert listed[victim]["events"] is None
    assert f"jsonl:{log}" not in _entries()
    assert listed[first[1]["sessionId"]] == first[1]


@pytest.mark.parametrize(
    "state",
    ["empty", "not json", "another layout", "another dsh", "a bad entry", "a directory",
     "a symlink"],
)
def test_a_cache_in_a_bad_state_is_rebuilt(project: Path, tmp_path: Path, state: str) -> None:
    truth = _list(project, "--fresh")
    good = _entries()
    cache = _cache()
    cache.unlink()
    elsewhere = tmp_path / "not-the-cache.json"
    elsewhere.write_text("someone else's file")
    if state == "empty":
        cache.write_bytes(b"")
    elif state == "not json":
        cache.write_bytes(b'{"format": 1, "sessions": {')
    elif state == "another layout":
        cache.write_text(json.dumps({"format": 2, "dsh": __version__, "sessions": good}))
    elif state == "another dsh":
        cache.write_text(json.dumps({"format": 1, "dsh": "0.0.0", "sessions": good}))
    elif state == "a bad entry":
        key = next(iter(good))
        good[key]["events"] = "many"
        cache.write_text(json.dumps({"format": 1, "dsh": __version__, "sessions": good}))
    elif state == "a directory":
        cache.mkdir()
    else:
        cache.symlink_to(elsewhere)
    listed = _list(project)
    assert listed == truth
    if state == "a directory":  # it cannot be replaced by a file; nothing else breaks
        assert cache.is_dir()
        return
    assert not cache.is_symlink()
    assert elsewhere.read_text() == "someone else's file"
    assert set(_entries()) == set(good)
    assert _list(project) == truth


def test_a_cache_directory_that_cannot_be_made_leaves_the_listing_as_it_was(
    project: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    truth = _list(project)
    listed = dsh("sessions", "list", "--json", cwd=project,
                 env={"XDG_CACHE_HOME": str(blocker / "cache")})
    assert listed.returncode == 0 and listed.stderr == ""
    assert json_lines(listed.stdout) == truth


# -- the cache on its own ---------------------------------------------------------------------


def _summary(title: str) -> dict[str, Any]:
    return {"events": 3, "lastTurnEnd": "completed", "title": title, "pricedWith": "p1",
            "usage": {"inputTokens": 1, "outputTokens": 2, "cacheReadTokens": 0,
                      "cacheWriteTokens": 0, "reasoningTokens": 0, "requests": 1,
                      "costUsd": None, "unpricedModels": ["scripted"]}}


def test_a_summary_is_used_only_under_its_revision(tmp_path: Path) -> None:
    cache = ListCache.load(tmp_path / "c.json")
    cache.put("jsonl:/a", "r1", _summary("a"))
    assert cache.get("jsonl:/a", "r1") == _summary("a")
    assert cache.get("jsonl:/a", "r2") is None
    assert cache.get("jsonl:/b", "r1") is None
    got = cache.get("jsonl:/a", "r1")
    assert got is not None
    got["usage"]["inputTokens"] = 99  # what a caller does with it is not remembered
    assert cache.get("jsonl:/a", "r1") == _summary("a")


def test_the_file_is_written_only_when_the_listing_learned_something(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    log = tmp_path / "log"
    log.write_text("")
    first = ListCache.load(path)
    first.put(f"jsonl:{log}", "r1", _summary("a"))
    first.save()
    written = path.stat()
    again = ListCache.load(path)
    assert again.get(f"jsonl:{log}", "r1") == _summary("a")
    again.put(f"jsonl:{log}", "r1", _summary("a"))
    again.save()
    assert path.stat().st_ino == written.st_ino and path.stat().st_mtime_ns == written.st_mtime_ns
    fresh = ListCache.load(path, fresh=True)
    assert fresh.get(f"jsonl:{log}", "r1") is None
    fresh.save()
    assert path.stat().st_ino != written.st_ino


def test_summaries_of_deleted_logs_are_dropped_and_the_count_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.json"
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.write_text("")
    gone.write_text("")
    cache = ListCache.load(path)
    for key in (f"jsonl:{kept}", f"jsonl:{gone}", "sqlite:/db#s1"):
        cache.put(key, "r", _summary(key))
    cache.save()
    gone.unlink()
    cache = ListCache.load(path)  # another root's listing: none of the three is listed
    cache.put("jsonl:/elsewhere/log", "r", _summary("elsewhere"))
    cache.save()
    assert list(_entries_of(path)) == [f"jsonl:{kept}", "sqlite:/db#s1", "jsonl:/elsewhere/log"]

    monkeypatch.setattr(list_cache, "MAX_ENTRIES", 3)
    cache = ListCache.load(path)
    for n in range(4):
        cache.put(f"sqlite:/db#new{n}", "r", _summary(str(n)))
    cache.save()
    assert list(_entries_of(path)) == [f"sqlite:/db#new{n}" for n in range(1, 4)]  # listed last


def _entries_of(path: Path) -> dict[str, Any]:
    entries: dict[str, Any] = json.loads(path.read_bytes())["sessions"]
    return entries

