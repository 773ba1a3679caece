"""Every plugin README has DSH's shape.

The one README-shape test of the suite (it replaces per-directory copies):

- a purpose paragraph before the first ``##`` heading;
- ``## Plugin``, directly followed by ``## Model Experience``, and ``## Known Limitations and
  Deferred Work`` as the last ``##`` section (other sections may stand between, as DSH's do);
- ``## Model Experience`` is either ``### <entry>`` subsections, each with the three headings
  ``#### What the model sees``, ``#### Token effect``, ``#### KV Cache effect`` in that order and
  each with text under it, or, for a plugin the model never sees, an opening ``None`` paragraph
  saying why, then ``#### KV Cache effect`` with text (DSH's form for such packages);
- the limitations are bullets, each with a bold lead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
PLUGIN = "## Plugin"
EXPERIENCE = "## Model Experience"
LIMITATIONS = "## Known Limitations and Deferred Work"
PARTS = ("#### What the model sees", "#### Token effect", "#### KV Cache effect")
PACKAGES = sorted(p.name for p in PLUGINS.iterdir() if (p / "__init__.py").exists())


def _section(text: str, heading: str) -> str:
    """The body of the ``##`` section ``heading`` (up to the next ``##`` heading)."""
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(r"^## ", body, maxsplit=1, flags=re.MULTILINE)[0]


def _subsections(body: str, level: str) -> list[tuple[str, str]]:
    """``(heading, text)`` for each heading of exactly ``level`` (``###``, ``####``)."""
    pieces = re.split(rf"^({level} .*)$", body, flags=re.MULTILINE)
    return [(pieces[i].strip(), pieces[i + 1].strip()) for i in range(1, len(pieces), 2)]


def readme_shape_problems(text: str) -> list[str]:
    """Everything wrong with one README's shape (empty when it has DSH's shape)."""
    problems: list[str] = []
    headings = [line.strip() for line in text.splitlines() if line.startswith("## ")]
    for required in (PLUGIN, EXPERIENCE, LIMITATIONS):
        if headings.count(required) != 1:
            problems.append(f"needs exactly one {required!r} heading")
    if problems:
        return problems
    if headings.index(EXPERIENCE) != headings.index(PLUGIN) + 1:
        problems.append(f"{EXPERIENCE!r} must follow {PLUGIN!r} directly")
    if headings[-1] != LIMITATIONS:
        problems.append(f"{LIMITATIONS!r} must be the last section")
    intro = text.split("\n## ", 1)[0]
    if len(intro.split()) <= 20:
        problems.append("needs a purpose paragraph before the first section")

    experience = _section(text, EXPERIENCE)
    entries = _subsections(experience, "###")
    if entries:
        for title, body in entries:
            parts = _subsections(body, "####")
            if tuple(heading for heading, _ in parts) != PARTS:
                problems.append(f"{title!r} needs exactly {', '.join(PARTS)} in that order")
            problems += [f"{title!r}: {heading!r} is empty" for heading, part in parts if not part]
    else:
        opening = experience.split("\n####", 1)[0].strip()
        if not opening.startswith("None"):
            problems.append(
                f"{EXPERIENCE!r} needs '### <entry>' subsections, or an opening 'None' paragraph"
            )
        elif len(opening.split()) < 8:
            problems.append(f"{EXPERIENCE!r}: the 'None' paragraph must say why")
        parts = _subsections(experience, "####")
        if [heading for heading, _ in parts] != [PARTS[2]] or not parts[0][1]:
            problems.append(f"a plugin the model never sees still states its {PARTS[2]!r}")

    bullets = [line for line in _section(text, LIMITATIONS).splitlines() if line.startswith("- ")]
    if not bullets:
        problems.append("the limitations must be bullets")
    problems += [f"limitation without a bold lead: {b}" for b in bullets if not b.startswith("- **")]
    return problems


@pytest.mark.parametrize("package", PACKAGES)
def test_readme_shape(package: str) -> None:
    readme = PLUGINS / package / "README.md"
    assert readme.is_file(), f"{package} has no README.md"
    assert readme_shape_problems(readme.read_text(encoding="utf-8")) == [], package


GOOD = """# dsh-example

A purpose paragraph long enough to say what this plugin is for, who uses it, and why it
exists at all in the harness.

## Plugin

Rows and config.

## Model Experience

### The entry

#### What the model sees

A line.

#### Token effect

A few tokens.

#### KV Cache effect

Tail only.

## Known Limitations and Deferred Work

- **Bold lead.** Text.
"""

NONE_FORM = GOOD.replace(
    GOOD[GOOD.index("### The entry") : GOOD.index("## Known")],
    "None, as this plugin only stores what the session core already derived.\n\n"
    "#### KV Cache effect\n\nNone: no request changes.\n\n",
)


def test_the_shape_check_accepts_both_dsh_forms() -> None:
    assert readme_shape_problems(GOOD) == []
    assert readme_shape_problems(NONE_FORM) == []


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        # an entry skipping a required part, even when another part says "None"
        (GOOD.replace("#### Token effect\n\nA few tokens.", "None here."), "needs exactly"),
        (GOOD.replace("#### KV Cache effect\n\nTail only.\n", ""), "needs exactly"),
        (GOOD.replace("A few tokens.", ""), "is empty"),
        (GOOD.replace("#### What the model sees", "What the model sees"), "needs exactly"),
        (NONE_FORM.replace("#### KV Cache effect\n\nNone: no request changes.", ""), "states"),
        (NONE_FORM.replace("None, as this", "Only this"), "or an opening 'None'"),
        (NONE_FORM.replace("None, as this plugin only stores what", "None."), "must say why"),
        (GOOD.replace("- **Bold lead.** Text.", "- Plain lead."), "without a bold lead"),
        (GOOD.replace("- **Bold lead.** Text.", "Prose instead."), "must be bullets"),
        (GOOD.replace("## Model Experience", "## Extra\n\n## Model Experience"), "directly"),
        (GOOD + "\n## Afterwards\n\nText.\n", "must be the last"),
        (GOOD.replace("## Plugin", "## Plugins"), "exactly one '## Plugin'"),
        (GOOD.replace("A purpose paragraph long enough to say what", "Short."), "purpose"),
    ],
)
def test_the_shape_check_rejects_a_readme_missing_a_part(broken: str, problem: str) -> None:
    problems = readme_shape_problems(broken)
    assert any(problem in p for p in problems), problems
