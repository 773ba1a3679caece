"""Every plugin README has DSH's shape (STYLE.md §11): a purpose paragraph, then
``## Plugin``, ``## Model Experience`` (What the model sees / Token effect / KV Cache effect per
entry) and ``## Known Limitations and Deferred Work`` whose items are bullets with a bold lead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
REQUIRED = ("## Plugin", "## Model Experience", "## Known Limitations and Deferred Work")


@pytest.mark.parametrize(
    "package", sorted(p.name for p in PLUGINS.iterdir() if (p / "__init__.py").exists())
)
def test_readme_shape(package: str) -> None:
    readme = PLUGINS / package / "README.md"
    assert readme.is_file(), f"{package} has no README.md"
    text = readme.read_text(encoding="utf-8")
    headings = [line.strip() for line in text.splitlines() if re.match(r"^## ", line)]
    positions = []
    for required in REQUIRED:
        matches = [i for i, h in enumerate(headings) if h == required]
        assert matches, f"{package}/README.md lacks the heading {required!r}"
        positions.append(matches[0])
    assert positions == sorted(positions), f"{package}/README.md: sections out of order"
    intro = text.split("\n## ", 1)[0]
    assert len(intro.split()) > 20, f"{package}/README.md needs a purpose paragraph"
    experience = text.split("## Model Experience", 1)[1].split("\n## ", 1)[0]
    for part in ("What the model sees", "Token effect", "KV Cache effect"):
        assert part in experience or "None" in experience, (package, part)
    limitations = text.split("## Known Limitations and Deferred Work", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in limitations.splitlines() if line.startswith("- ")]
    assert bullets, f"{package}: limitations must be bullets"
    for bullet in bullets:
        assert bullet.startswith("- **"), f"{package}: limitation without a bold lead: {bullet}"
