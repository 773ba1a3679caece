"""The catalog and the loaded skill are bounded, and odd files are skipped, never half-read."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from dsh_skills import SkillError, SkillsConfig, discover, load_skill, render_catalog


def skill(root: Path, name: str, description: str, body: str = "BODY") -> Path:
    (root / name).mkdir(parents=True)
    path = root / name / "SKILL.md"
    path.write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DSH_AGENTS_HOME", str(tmp_path / "no-agents-home"))
    (tmp_path / "p" / ".git").mkdir(parents=True)
    return tmp_path / "p"


def test_the_catalog_stops_at_its_byte_budget_and_says_how_many_it_left_out(
    project: Path,
) -> None:
    for index in range(40):
        skill(project / ".agents" / "skills", f"skill-{index:02d}", "d" * 100)
    config = SkillsConfig(max_catalog_bytes=2000)
    text = render_catalog(discover(str(project), config), config)
    assert len(text.encode()) <= 2000
    listed = text.count("- `skill-")
    assert 0 < listed < 40
    assert f"({40 - listed} more skills not listed: the catalog budget is full)" in text


def test_descriptions_are_capped(project: Path) -> None:
    skill(project / ".claude" / "skills", "long", "w" * 900)
    config = SkillsConfig(catalog_description_max_length=50)
    text = render_catalog(discover(str(project), config), config)
    assert f"- `long`: {'w' * 47}...\n" in text


def test_links_fifos_and_oversized_files_are_skipped(project: Path, tmp_path: Path) -> None:
    root = project / ".agents" / "skills"
    outside = skill(tmp_path / "elsewhere", "linked", "A secret outside.")
    (root / "linked").mkdir(parents=True)
    os.symlink(outside, root / "linked" / "SKILL.md")
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "SKILL.md")
    skill(root, "big", "Big.", "x" * 300)
    skill(root, "fine", "Fine.")
    config = SkillsConfig(max_skill_bytes=200)
    assert [s.name for s in discover(str(project), config)] == ["fine"]
    with pytest.raises(SkillError, match='skill "big" is unknown or no longer available'):
        load_skill(str(project), "big", config)
    with pytest.raises(SkillError, match=re.escape('invalid skill name "../x"')):
        load_skill(str(project), "../x", config)


def test_a_bad_config_names_the_key() -> None:
    with pytest.raises(
        ValueError, match="catalogDescriptionMaxLength must be an integer of at least 3"
    ):
        SkillsConfig(catalog_description_max_length=2)
