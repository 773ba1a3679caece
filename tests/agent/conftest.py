"""Fixtures of the agent loop tests: a real host (sessions, llm, tools, agent, a model row)."""

from __future__ import annotations

import sys
from pathlib import Path

# The loopback SSE server lives with the LLM tests; make it importable when only
# this directory is collected.
_LLM_TESTS = str(Path(__file__).resolve().parent.parent / "llm")
if _LLM_TESTS not in sys.path:
    sys.path.insert(0, _LLM_TESTS)
