"""Every reason the repository cites is in the repository.

Code, tests and docs explain themselves by pointing at a decision (``D16``) or at a section of a
page (``docs/format.md §5.1``). Such a pointer is only worth something if a reader of this tree can
follow it, so this test reads every tracked text file and fails, naming file and line, on

* a decision number with no ``## D<n>.`` heading in ``docs/decisions.md``;
* a pointer at a text that is not in the tree: the design notes and behavioural specifications
  dsh was written from (their file names, "spec §", "the spec's text"), the seed documents
  (``seed 000``), their checklist numbers, the outside style guide, a test named by a code;
* a relative Markdown link that leaves the tree or names a missing file;
* a section sign that resolves nowhere: ``format.md §9.9`` without such a heading, or a bare
  ``§1.9`` on a line that names no page of the tree (unless the file has that numbered section
  itself).

The patterns are narrow on purpose: ``spec`` is also an ordinary word of the code (a model spec,
an event spec, ``parse_model(spec)``), and those must not match.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECISIONS_PAGE = ROOT / "docs" / "decisions.md"

#: A decision heading of docs/decisions.md: ``## D16. Configuration is trusted ...``.
DECISION_HEADING = re.compile(r"^## D(\d+)\.", re.MULTILINE)
#: A decision citation: ``D16``, ``(D16)``, ``D15/D16``, ``D16, D19``, ``DECISIONS D16``. One or
#: two digits, so data such as a ``~D800`` escape vector is not read as a citation.
DECISION = re.compile(r"(?<![\w~\\])D(\d{1,2})(?!\w)")

#: Citations of texts that live outside the repository; each names what it is.
OUTSIDE: list[tuple[str, re.Pattern[str]]] = [
    ("the outside decisions file", re.compile(r"\bDECISIONS\b")),
    (
        "an outside spec file",
        re.compile(
            r"\b(?:session-and-persistence|host-tools-loop|approval-and-sandbox|jsonl-v3-format)\b"
        ),
    ),
    ("an outside path", re.compile(r"shared/(?:spec|seeds)\b")),
    ("an outside style guide", re.compile(r"\bSTYLE\.md\b")),
    ("a test named by a decision code", re.compile(r"\bdef test_(?:\w+_)?d\d+_")),
    ("a seed document", re.compile(r"\bseeds? \d{3}\b|\bthe seeds\b", re.IGNORECASE)),
    ("a spec section", re.compile(r"\bspec(?:'s)?\s*§")),
    (
        "the spec as a source",
        re.compile(
            r"\bthe spec's (?:text|texts|example|table|wording)\b"
            r"|\bspec's ``"
            r"|\bexact spec (?:message|text)\b"
            r"|\b(?:of|in|per|by|from) the spec\b(?! string)"
            r"|\bthe spec (?:says|gives|requires|states|defines)\b"
        ),
    ),
    ("an outside checklist", re.compile(r"\bchecklist\s+(?:items?\s+)?\d|§\s*\d+, item \d")),
]

#: ``NAME.md`` right before a section sign (``docs/format.md §5.1``, or at the end of the line
#: before it): the page the section belongs to. A bare sign is the file's own section.
PAGE_BEFORE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)[`\s]*$")
#: A Markdown link's target, without its anchor: ``[format.md](format.md#5-reading)``.
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
#: A section sign with its number: ``§5.1``, ``§ 2``.
SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
#: A numbered heading: ``## 5. Reading``, ``### 5.1 A torn tail``.
NUMBERED_HEADING = re.compile(r"^#+\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)

#: Data, not prose: fixture trees (their READMEs are prose and are read).
SKIPPED_PARTS = ("node_modules", ".venv")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".json"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}: {self.text.strip()}"


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [p for p in out.split("\0") if p]


def read_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for rel in tracked_files():
        path = Path(rel)
        if any(part in SKIPPED_PARTS for part in path.parts):
            continue
        if "fixtures" in path.parts and path.suffix != ".md":
            continue  # recorded logs and scripts: data, not prose
        if path.suffix not in TEXT_SUFFIXES and path.name not in {".gitignore"}:
            continue
        if rel == "tests/docs/test_citations.py":
            continue  # this file spells the patterns it looks for
        full = ROOT / rel
        if not full.is_file():
            continue
        try:
            files[rel] = full.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def decision_numbers(page: str) -> set[int]:
    return {int(n) for n in DECISION_HEADING.findall(page)}


def sections_of(text: str) -> set[str]:
    return set(NUMBERED_HEADING.findall(text))


def scan(files: dict[str, str], decisions: set[int]) -> list[Finding]:
    """Every unresolved citation in ``files`` (path -> text), given the decision numbers."""
    sections = {Path(p).name: sections_of(t) for p, t in files.items() if p.endswith(".md")}
    known = set(files) | {str(parent) for p in files for parent in Path(p).parents}
    findings: list[Finding] = []
    for path, text in files.items():
        own = sections.get(Path(path).name, set()) if path.endswith(".md") else set()
        lines = text.splitlines()
        for number, line in enumerate(lines, start=1):
            if path == "docs/decisions.md" and line.startswith("## D"):
                continue
            for match in DECISION.finditer(line):
                if int(match.group(1)) not in decisions:
                    findings.append(
                        Finding(
                            path, number, f"D{match.group(1)} is not in docs/decisions.md", line
                        )
                    )
            for what, pattern in OUTSIDE:
                if pattern.search(line):
                    findings.append(Finding(path, number, f"cites {what}", line))
            findings.extend(_sections(path, number, line, lines, own, sections))
            if path.endswith(".md"):
                findings.extend(_links(path, number, line, known))
    return findings


def _links(path: str, number: int, line: str, known: set[str]) -> list[Finding]:
    """A relative Markdown link must land on a file or folder of the tree."""
    out: list[Finding] = []
    for match in LINK.finditer(line):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if resolved not in known:
            out.append(Finding(path, number, f"link {target} leaves the tree or is missing", line))
    return out


def _sections(
    path: str,
    number: int,
    line: str,
    lines: list[str],
    own: set[str],
    sections: dict[str, set[str]],
) -> list[Finding]:
    """Check each ``§N`` of ``line`` against the page it names (this line or the one before)."""
    out: list[Finding] = []
    for match in SECTION.finditer(line):
        before = line[: match.start()]
        named = PAGE_BEFORE.search(before)
        if named is None and number > 1 and not before.strip(" `(*,;—-#:"):
            named = PAGE_BEFORE.search(lines[number - 2])
        if named is not None:
            page = Path(named.group(1)).name
            if page in sections and match.group(1) not in sections[page]:
                out.append(Finding(path, number, f"{page} has no section {match.group(1)}", line))
            continue
        if match.group(1) in own:
            continue
        out.append(Finding(path, number, f"§{match.group(1)} names no page of the tree", line))
    return out


def test_the_patterns_find_what_they_must_and_nothing_else() -> None:
    """Each kind of citation is found; ordinary uses of the same words are not."""
    page = "## D1. One\n## D16. Two\n"
    files = {
        "a.py": "\n".join(
            [
                '"""See D16, D1 and DECISIONS D16."""',  # the outside file name
                "x = 1  # (D99) and D16, D40",  # 2: unknown numbers
                "def parse_model(spec: str) -> None: ...",  # a variable
                "#: the spec that rebuilds the model (openai-compatible:M)",  # a model spec
                '("\\ud800", "~D800"),',  # data
                "# the window is fixed (seed 000 §4.1)",  # seed, and a bare § on its line
                "# exact texts of spec §7.4 step 2",  # spec section
                "# (session-and-persistence.md §2.7)",  # an outside file
                "# see docs/format.md §5.1 and format.md §9.9",  # 1: §9.9
                "# the shapes of the spec's table",  # 1
                "def test_d16_refusals() -> None: ...",  # 1: a test named by a code
                "def test_add16_items() -> None: ...",  # a word that ends in d16
            ]
        ),
        "docs/format.md": "# F\n## 5. R\n### 5.1 T\nAs §5 says, and §3 does not.\n",
        "docs/links.md": (
            "[a](format.md#5-r) [b](../a.py) [c](https://x.org/y.md)\n[d](../../spec/x.md)\n"
        ),
    }
    found = [(f.path, f.line) for f in scan(files, decision_numbers(page))]
    assert found.count(("a.py", 1)) == 1
    assert found.count(("a.py", 2)) == 2
    assert ("a.py", 3) not in found and ("a.py", 4) not in found and ("a.py", 5) not in found
    assert found.count(("a.py", 6)) == 2
    assert found.count(("a.py", 7)) == 2  # "spec §" and a § of no page
    assert found.count(("a.py", 8)) == 1
    assert found.count(("a.py", 9)) == 1
    assert found.count(("a.py", 10)) == 1
    assert found.count(("a.py", 11)) == 1 and ("a.py", 12) not in found
    assert found.count(("docs/format.md", 4)) == 1  # §3 is not a heading of the page
    assert ("docs/links.md", 1) not in found  # in the tree, or not a path
    assert found.count(("docs/links.md", 2)) == 1  # outside the tree


def test_every_citation_resolves_inside_the_repository() -> None:
    decisions = decision_numbers(DECISIONS_PAGE.read_text(encoding="utf-8"))
    assert decisions, "docs/decisions.md has no '## D<n>.' headings"
    findings = scan(read_files(), decisions)
    if findings:
        pytest.fail(
            f"{len(findings)} citation(s) point outside the repository or at nothing; cite a "
            "heading of docs/decisions.md (D<n>) or an in-repo page and section, or state the "
            "rule where it is used:\n" + "\n".join(str(f) for f in findings)
        )
