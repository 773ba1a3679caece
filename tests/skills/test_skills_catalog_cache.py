"""The skills catalog is read once while its files are unchanged, and a change to them (a new
skill, an edited or removed ``SKILL.md``) is in the catalog of the next step.

A real agent with the scripted model; what is counted is how often discovery ran. ``RACY_NS``
is 0: every change here alters a size or a directory's entries, so the file system's clock tick
does not matter (``tests/host/test_filewatch.py`` covers the racy rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dsh_skills
import pytest
from agent.agent_helpers import agent_service, scripted_host
from dsh_skills import SkillsConfig

from dsh_host import Row
from dsh_host import _filewatch as filewatch
from dsh_host._filewatch import Watched
from dsh_host._session.messages import PluginSource

from .test_skills_bounds import skill

pytestmark = pytest.mark.anyio


def catalogs(agent: Any) -> list[str]:
    return [
        e.data.content[0].text
        for e in agent.session.events
        if e.type == "user/message" and isinstance(e.data.source, PluginSource)
    ]


async def test_the_catalog_is_reread_only_after_its_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filewatch, "RACY_NS", 0)
    monkeypatch.setenv("DSH_AGENTS_HOME", str(tmp_path / "no-agents-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config-home"))
    project = tmp_path / "p"
    (project / ".git").mkdir(parents=True)
    root = project / ".agents" / "skills"
    triage = skill(root, "triage", "Triage a bug report.")
    reads: list[str] = []
    discover = dsh_skills.discover

    def counted(cwd: str, config: SkillsConfig, watched: Watched | None = None) -> Any:
        reads.append(cwd)
        return discover(cwd, config, watched)

    monkeypatch.setattr(dsh_skills, "discover", counted)
    responses = [{"text": str(n)} for n in range(5)]
    async with scripted_host(responses, Row(name="skills")) as host:
        agent = agent_service(host).create(cwd=str(project))
        await agent.run_turn("one")
        await agent.run_turn("two")
        assert len(reads) == 1
        skill(root, "release", "Write release notes.")  # a new skill directory
        await agent.run_turn("three")
        triage.write_text("---\nname: triage\ndescription: Triage it twice.\n---\nBODY\n")
        await agent.run_turn("four")
        triage.unlink()
        await agent.run_turn("five")
        seen = catalogs(agent)
    assert len(reads) == 4
    assert len(seen) == 4
    assert "`release`" in seen[1] and "Triage a bug report." in seen[1]
    assert "Triage it twice." in seen[2]
    assert "`triage`" not in seen[3] and "`release`" in seen[3]
