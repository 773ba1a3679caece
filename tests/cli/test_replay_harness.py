"""``dsh replay ID --same-model``: the harness mode (D32). A session recorded by the real CLI
with a scripted model is derived again request by request, without a model call: the unchanged
build derives every request as recorded (exit 0); a planted persona change, a planted tool schema
change and a planted AGENTS.md change are each named as the part that differs (exit 1).
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .cli_helpers import REPO, copy_fixture_root, dsh

PLUGIN = textwrap.dedent('''
    from dsh_host import Plugin, ToolContext, tool

    @tool
    def greet(ctx: ToolContext, name: str) -> str:
        """Greet someone by name."""
        return f"hello {name}"

    class Greet(Plugin):
        name = "greet"
        inject = ("tools",)

        def apply(self, ctx, config):
            ctx.tools.register(greet.definition, owner=ctx)
''')

CALL = {"tool_calls": [{"name": "greet", "arguments": {"name": "ada"}, "id": "g1"}]}
PERSONA = "You work in the workspace {{cwd}}."


class Recorded:
    """A session of two turns (one with a tool call) recorded under a composition of its own."""

    def __init__(self, tmp: Path, base: str = "default.yml") -> None:
        self.tmp = tmp
        self.workspace = tmp / "ws"
        self.workspace.mkdir()
        (tmp / "greet_plugin.py").write_text(PLUGIN)
        self.config = tmp / "dsh.yml"
        self.config.write_text((REPO / "configs" / base).read_text()
                               + "\n- name: greet_plugin:Greet\n")  # fmt: skip
        self.flags = ["--config", str(self.config), "--root", str(tmp / "store")]
        self.env = {"PYTHONPATH": f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        (self.workspace / "AGENTS.md").write_text("Answer briefly.\n")
        self.run("greet ada", [CALL, {"text": "greeted"}], "--new")
        self.run("again", [{"text": "done"}])

    def run(self, prompt: str, responses: list[Any], *extra: str) -> None:
        script = self.tmp / f"s{len(list(self.tmp.glob('s*.json')))}.json"
        script.write_text(json.dumps({"responses": responses}))
        done = dsh("run", prompt, "--session", "src", *extra, "--model", f"scripted:{script}",
                   "--workspace", str(self.workspace), "--json", *self.flags, cwd=self.tmp,
                   env=self.env)  # fmt: skip
        assert done.returncode == 0, done.stderr

    def harness(self, *extra: str) -> Any:
        return dsh("replay", "src", "--same-model", *extra, *self.flags, cwd=self.tmp,
                   env=self.env)  # fmt: skip

    def report(self) -> tuple[int, dict[str, Any]]:
        done = self.harness("--json")
        assert done.returncode in (0, 1), done.stderr
        assert "Traceback" not in done.stderr
        payload: dict[str, Any] = json.loads(done.stdout)
        return done.returncode, payload


@pytest.mark.parametrize("base", ["default.yml", "sqlite.yml"])
def test_the_unchanged_build_derives_every_request_as_recorded(tmp_path: Path, base: str) -> None:
    recorded = Recorded(tmp_path, base)
    code, report = recorded.report()
    assert code == 0, report["differences"]
    assert report["identical"] is True and report["differences"] == []
    # turn 1: the call and its follow-up; turn 2: one request
    assert [(s["turn"], s["step"]) for s in report["steps"]] == [(1, 1), (1, 2), (2, 1)]
    assert all(s["recordedDigest"] == s["derivedDigest"] for s in report["steps"])
    human = recorded.harness()
    assert human.returncode == 0, human.stderr
    assert "identical: every request is derived byte for byte as recorded" in human.stdout


def test_a_persona_change_is_named_as_the_system_prompt(tmp_path: Path) -> None:
    recorded = Recorded(tmp_path)
    text = recorded.config.read_text()
    assert "You work in the workspace {{cwd}}." in text
    recorded.config.write_text(text.replace("You work in the workspace {{cwd}}.",
                                            "You work hard in the workspace {{cwd}}."))  # fmt: skip
    code, report = recorded.report()
    assert code == 1
    parts = {(d["turn"], d["step"], d["part"]) for d in report["differences"]}
    assert parts == {(1, 1, "system prompt"), (1, 2, "system prompt"), (2, 1, "system prompt")}
    first = report["differences"][0]
    assert "-You work in the workspace" in first["diff"]
    assert "+You work hard in the workspace" in first["diff"]
    human = recorded.harness()
    assert human.returncode == 1
    assert "turn 1 step 1: system prompt differs" in human.stdout
    assert "3 difference(s) in: system prompt" in human.stdout


def test_a_tool_schema_change_is_named_with_the_tool(tmp_path: Path) -> None:
    recorded = Recorded(tmp_path)
    plugin = tmp_path / "greet_plugin.py"
    plugin.write_text(plugin.read_text().replace("name: str)", "name: str, loud: bool = False)"))
    code, report = recorded.report()
    assert code == 1
    assert {d["part"] for d in report["differences"]} == {"tool schemas"}
    assert {d["detail"] for d in report["differences"]} == {"tool greet: its schema differs"}
    assert '"loud"' in report["differences"][0]["diff"]


def test_a_changed_agents_md_is_named_as_the_runtime_context(tmp_path: Path) -> None:
    recorded = Recorded(tmp_path)
    (recorded.workspace / "AGENTS.md").write_text("Answer at length.\n")
    code, report = recorded.report()
    assert code == 1
    assert {d["part"] for d in report["differences"]} == {"runtime context"}
    assert "+Answer at length." in report["differences"][0]["diff"]


def test_harness_mode_refuses_the_flags_of_a_model_replay(tmp_path: Path) -> None:
    done = dsh("replay", "src", "--same-model", "--from", "2", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--from is for a replay with --model" in done.stderr
    both = dsh("replay", "src", "--same-model", "--model", "demo", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_log_another_writer_left_without_request_headers_is_compared(tmp_path: Path) -> None:
    """DSH's reference session holds no ``request/header`` and no system message: the step is
    derived with the model that answered it, and what the log lacks is named, not a crash."""
    root = copy_fixture_root(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = dsh("replay", "multi-batch", "--same-model", "--json", "--root", str(root),
               "--config", str(REPO / "configs" / "default.yml"), cwd=work)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [(s["turn"], s["step"]) for s in report["steps"]] == [(1, 1), (2, 1)]
    first = [d for d in report["differences"] if (d["turn"], d["step"]) == (1, 1)]
    assert [d["detail"] for d in first if d["part"] == "system prompt"] == [
        "no system prompt was recorded"
    ]
    (config,) = [d for d in first if d["part"] == "request config"]
    assert "-(none)" in config["diff"] and '+    "provider": "mock",' in config["diff"]
