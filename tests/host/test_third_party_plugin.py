"""Extensibility proof: a separately built and pip-installed distribution that
declares an entry point in ``dsh.plugins`` is composed from YAML by name and
its around-hook runs on ``tools/execute``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "dsh-plugin-stopwatch"
version = "0.0.1"

[project.entry-points."dsh.plugins"]
stopwatch = "dsh_plugin_stopwatch:Stopwatch"
"""

PLUGIN = '''
import msgspec
from dsh_host import Plugin


class StopwatchConfig(msgspec.Struct, forbid_unknown_fields=True):
    label: str = "stopwatch"


class Stopwatch(Plugin):
    name = "stopwatch"
    Config = StopwatchConfig

    def apply(self, ctx, config):
        async def around(exec_, next_):
            exec_.append(f"{config.label}: before")
            result = await next_()
            exec_.append(f"{config.label}: after")
            return result

        ctx.on("tools/execute", around)
'''

DRIVER = '''
import anyio
from dsh_host import open_host_from_yaml
from dsh_host._tools import TOOLS_EXECUTE

async def main():
    async with open_host_from_yaml("composition.yml") as host:
        trace = []

        async def body():
            trace.append("tool body")
            return "ok"

        # No tools row declares tools/execute: the plugin's listener by name waits for a
        # declaration, so the key (which needs none) dispatches.
        host.bus.declare(TOOLS_EXECUTE)
        await host.ctx.waterfall("tools/execute", trace, body)
        print("|".join(trace))
        print(host.status()[0]["entryPoint"])

anyio.run(main, backend="trio")
'''


@pytest.mark.slow
def test_pip_installed_third_party_plugin_composes_by_name(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "dsh_plugin_stopwatch").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "dsh_plugin_stopwatch" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(source)],
        check=True,
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "composition.yml").write_text(
        "- id: timing\n  name: stopwatch\n  config: {label: outer}\n"
        "- id: timing2\n  name: dsh-stopwatch\n  config: {label: inner}\n"
    )
    (work / "driver.py").write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run(
        [sys.executable, "driver.py"], cwd=work, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "outer: before|inner: before|tool body|inner: after|outer: after"
    assert lines[1] == "dsh_plugin_stopwatch:Stopwatch"
