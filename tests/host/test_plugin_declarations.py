"""The host names roles and run terms, never the plugin that fills them (issue 33).

A session's run terms (workspace, sandbox mode, network, approval policy) reach the rows whose
plugin declares them (``Plugin.run_terms``); a repair-only resume boots the rows whose plugin
declares ``boots_for_repair``; ``Agent(...)`` keeps ``runs_confined`` rows only with ``sandbox=``.
So a third-party plugin that takes a term is patched by every front door with no host edit —
shown here with a plugin that exists only in this test — and a search of the host's source for
shipped plugin names finds none outside the registry.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import dsh_host
from dsh_host._cli.common import CliUsageError, patch_term_flag
from dsh_host._composition_edits import patch_term, runs_confined, takes_term, term_value
from dsh_host._front.runner import terms_of
from dsh_host._loader import LocatedRow, Row, rows_needed_for
from dsh_host._session.events.data import CompositionTerms
from dsh_host._shipped_plugins import SHIPPED_PLUGINS

_PLUGIN = textwrap.dedent(
    '''
    from dsh_host.sdk import Context, Plugin, RunTermKeys

    class FencedTools(Plugin):
        name = "fenced-tools"
        inject = ("tools",)
        run_terms = RunTermKeys(workspace="root_dir", sandbox="fence")
        runs_confined = True

        def apply(self, ctx: Context, config: object) -> None:
            pass

    class Auditor(Plugin):
        name = "auditor"
        boots_for_repair = True

        def apply(self, ctx: Context, config: object) -> None:
            pass
    '''
)


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a module holding two plugins no host file knows of."""
    module = f"fenced_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def _located(*rows: Row) -> list[LocatedRow]:
    return [LocatedRow(row, f"test.yml:{i + 1}") for i, row in enumerate(rows)]


def test_a_third_party_row_takes_the_terms_it_declares(third_party: str) -> None:
    rows = _located(
        Row(name=f"{third_party}:FencedTools", id="fenced"),
        Row(name="user-approval", id="approval"),
    )
    assert takes_term(rows[0].row, "workspace") == "root_dir"
    assert runs_confined(rows[0].row)
    assert patch_term(rows, "workspace", "/srv/w") == 1
    assert patch_term(rows, "sandbox", "read-only") == 1
    assert rows[0].row.config == {"root_dir": "/srv/w", "fence": "read-only"}
    assert patch_term(rows, "approval_policy", "never") == 1
    assert rows[1].row.config == {"policy": "never"}
    assert term_value(rows, "sandbox") == "read-only"
    terms = terms_of(
        rows, composition=CompositionTerms(name="test.yml", digest="0" * 64), spec=None, by="test"
    )
    assert terms.workspace == "/srv/w"
    assert terms.sandbox is not None and terms.sandbox.mode == "read-only"
    assert terms.approval is not None and terms.approval.policy == "never"


def test_a_flag_without_a_row_taking_its_term_names_the_term_and_who_takes_it() -> None:
    rows = _located(Row(name="user-approval", id="approval"))
    with pytest.raises(CliUsageError) as caught:
        patch_term_flag(rows, "workspace", "/w", "--workspace")
    assert str(caught.value) == (
        "--workspace needs a row that takes the workspace term (builtin-tools) in the "
        "composition, and it has none; add one or drop the flag"
    )


def test_a_repair_boots_the_rows_that_declare_it(third_party: str) -> None:
    rows = _located(
        Row(name="sessions", id="sessions"),
        Row(name="session-persistence-memory", id="store", config={"store": "decl"}),
        Row(name=f"{third_party}:Auditor", id="auditor"),
        Row(name="telemetry-otel", id="telemetry", disabled=True),
        Row(name="builtin-tools", id="tools"),
    )
    plain = [entry.row.id for entry in rows_needed_for(rows, ("sessionPersistence",))]
    repair = [
        entry.row.id for entry in rows_needed_for(rows, ("sessionPersistence",), repair=True)
    ]
    assert plain == ["sessions", "store"]
    assert repair == ["sessions", "store", "auditor"]


#: String literals equal to a shipped plugin's name that are not that plugin: a service key, a
#: dict key of a report, the in-host memory store's own name.
_NOT_A_ROW_NAME = {
    ("_agent/keys.py", "subagents"),  # ServiceKey("subagents"): the service's name
    ("_context.py", "hooks"),  # a fiber report's key
    ("_cli/plugins_cmd.py", "hooks"),  # the same report read back
    ("_persistence/storage.py", "session-persistence-memory"),  # the store names itself
}


def test_no_host_module_names_a_shipped_plugin_outside_the_registry() -> None:
    """Search, not a list: every string constant of every host module (docstrings aside)."""
    root = Path(dsh_host.__file__).parent
    names = set(SHIPPED_PLUGINS) - {"sessions", "llm", "tools", "agent"}  # the host's own rows
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "_shipped_plugins.py":
            continue
        tree = ast.parse(path.read_text(), relative)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in names
                and id(node) not in docstrings
                and (relative, node.value) not in _NOT_A_ROW_NAME
            ):
                found.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert found == []
