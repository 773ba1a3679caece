"""Schemathesis against ``GET /openapi.json`` of a real ``dsh serve`` process on loopback.

Every documented operation gets a bounded number of generated requests (valid and invalid
bodies, ids, seqs, headers). Each answer must be no 5xx, a status the document lists for that
operation, and of a documented media type: the document is made from the same table as the
router, so a status a route answers and the document misses fails here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import write_composition

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    status_code_conformance,
)

#: Generated requests per operation: bounded so the lane stays short.
EXAMPLES = 25


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    work, workspace = tmp_path / "work", tmp_path / "ws"
    work.mkdir()
    workspace.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}] * 500}))
    env = {k: v for k, v in os.environ.items() if k != "DSH_SERVE_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh_host", "serve", "--config", str(write_composition(tmp_path)),
         "--model", f"scripted:{script}", "--root", str(tmp_path / "sessions"), "--workspace",
         str(workspace), "--port", "0"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("dsh serve: listening on "), line
    try:
        yield line.split()[4].rstrip("/")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_no_generated_request_gets_a_5xx_or_an_undocumented_status(served: str) -> None:
    schema = schemathesis.openapi.from_url(f"{served}/openapi.json")
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/stream"):
            continue  # an open stream never ends; its statuses are tested in test_hold/stream
        tested.append(f"{operation.method.upper()} {operation.path}")

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: object) -> None:
            response = case.call(base_url=served, timeout=60)  # type: ignore[attr-defined]
            case.validate_response(  # type: ignore[attr-defined]
                response,
                checks=[not_a_server_error, status_code_conformance, content_type_conformance],
            )

        check()
    assert len(tested) == 12, tested
