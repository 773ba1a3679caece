"""The approval plugins' READMEs keep DSH's plugin-README shape (STYLE.md §11)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "plugins"


@pytest.mark.parametrize("package", ["dsh_user_approval", "dsh_tool_rules"])
def test_readme_sections(package: str) -> None:
    text = (ROOT / package / "README.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Plugin", "## Model Experience", "## Known Limitations and Deferred Work"]
    experience = text.split("## Model Experience", 1)[1].split("## Known Limitations", 1)[0]
    entries = [part for part in experience.split("\n### ")[1:]]
    assert entries
    for entry in entries:
        for part in ("#### What the model sees", "#### Token effect", "#### KV Cache effect"):
            assert part in entry, (package, entry.splitlines()[0], part)
    limitations = text.split("## Known Limitations and Deferred Work", 1)[1]
    bullets = [line for line in limitations.splitlines() if line.startswith("- ")]
    assert bullets and all(line.startswith("- **") for line in bullets)
