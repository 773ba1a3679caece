"""Skills end to end: the real ``dsh run`` with a scripted model and a ``skills`` row.

A project carries Claude Code and agents-style skill directories; the model reads only the
catalog (names and descriptions, in the runtime context the log keeps), loads one skill whole
with the ``skill`` tool, and runs the script it ships through ``bash`` under the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import REPO, dsh, json_lines

#: The default without its skills row: the tests append the row they configure.
DEFAULT = (REPO / "configs" / "default.yml").read_text().replace(
    "\n- id: skills\n  name: skills\n", "\n", 1
)
SKILLS_ROW = "\n- id: skills\n  name: skills\n  config:\n    maxSkillBytes: 4096\n"


def write_skill(root: Path, name: str, description: str, body: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n"
    )
    return directory


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    release = write_skill(
        project / ".claude" / "skills",
        "release-notes",
        "Write release notes from the git log.",
        "RELEASE-BODY: run scripts/stamp.sh first.",
    )
    (release / "scripts").mkdir()
    (release / "scripts" / "stamp.sh").write_text("echo stamped > stamp.txt\n")
    write_skill(project / ".agents" / "skills", "triage", "Triage a bug report.", "TRIAGE-BODY")
    # A user skill, and a user skill the project's shadows (the project's wins).
    user = tmp_path / "agents-home" / "skills"
    write_skill(user, "user-only", "A skill from the user's directory.", "USER-BODY")
    write_skill(user, "triage", "The user's triage, shadowed.", "SHADOWED-BODY")
    # Oversized (over maxSkillBytes: never listed, never loaded) and malformed (no name).
    write_skill(project / ".agents" / "skills", "huge", "Too big.", "x" * 5000)
    bad = project / ".agents" / "skills" / "nameless"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\ndescription: no name\n---\nBODY\n")
    return project


def run(project: Path, tmp_path: Path, calls: list[dict[str, object]]) -> str:
    config = tmp_path / "composition.yml"
    config.write_text(DEFAULT + SKILLS_ROW)
    script = tmp_path / "script.json"
    responses: list[dict[str, object]] = [
        {"tool_calls": [{"id": f"call-{i}", **call}]} for i, call in enumerate(calls)
    ]
    script.write_text(json.dumps({"responses": [*responses, {"text": "done"}]}))
    result = dsh(
        "run",
        "do the release",
        "--config",
        str(config),
        "--model",
        f"scripted:{script}",
        "--json",
        cwd=project,
        env={"DSH_AGENTS_HOME": str(tmp_path / "agents-home")},
    )
    assert result.returncode == 0, result.stderr
    session_id: str = json.loads(result.stdout)["sessionId"]
    return session_id


def events(project: Path, session_id: str) -> list[dict[str, object]]:
    shown = dsh("sessions", "show", session_id, "--view", "events", "--json", cwd=project)
    assert shown.returncode == 0, shown.stderr
    return json_lines(shown.stdout)


def model_view(project: Path, session_id: str) -> str:
    shown = dsh("sessions", "show", session_id, "--view", "model", cwd=project)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_catalog_lists_names_and_descriptions_only_and_the_log_shows_it(
    project: Path, tmp_path: Path
) -> None:
    session_id = run(project, tmp_path, [])
    view = model_view(project, session_id)
    assert "<available_skills>" in view
    for name, description in (
        ("release-notes", "Write release notes from the git log."),
        ("triage", "Triage a bug report."),
        ("user-only", "A skill from the user's directory."),
    ):
        assert f"- `{name}`: {description}" in view
    # names and descriptions only: no body, no path; the oversized and the malformed are left out
    for absent in (
        "RELEASE-BODY",
        "TRIAGE-BODY",
        "USER-BODY",
        "SHADOWED",
        "`huge`",
        "nameless",
        str(project),
    ):
        assert absent not in view.split("<available_skills>")[1].split("</available_skills>")[0]


def test_skill_loads_whole_on_request_and_its_script_runs_under_the_sandbox(
    project: Path, tmp_path: Path
) -> None:
    base = project / ".claude" / "skills" / "release-notes"
    session_id = run(
        project,
        tmp_path,
        [
            {"name": "skill", "arguments": {"name": "release-notes"}},
            {"name": "skill", "arguments": {"name": "huge"}},
            {
                "name": "bash",
                "arguments": {"command": f"bash {base}/scripts/stamp.sh", "description": "stamp"},
            },
            {
                "name": "bash",
                "arguments": {
                    "command": f"bash {base}/scripts/stamp.sh > {tmp_path}/out",
                    "description": "stamp outside",
                },
            },
        ],
    )
    results = [e for e in events(project, session_id) if e["type"] == "tool/result"]
    texts = [json.dumps(r["data"]) for r in results]
    assert "RELEASE-BODY: run scripts/stamp.sh first." in texts[0]
    assert f"Base directory for this skill: {base}" in texts[0]
    assert 'skill \\"huge\\" is unknown or no longer available' in texts[1]
    assert (project / "stamp.txt").read_text() == "stamped\n"  # the script ran, in the workspace
    assert not (tmp_path / "out").exists()  # and under the sandbox: no write outside it
