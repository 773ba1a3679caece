"""The backend contract (contract.py) run against the JSONL backend, in both encodings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dsh_session_persistence_jsonl import JsonlSessionPersistence

from .contract import *  # noqa: F403

pytestmark = pytest.mark.anyio


class JsonlFactory:
    def __init__(self, base: Path, compression: str) -> None:
        self.base = base
        self.compression = compression

    def root(self, store: str) -> str:
        return os.path.join(self.base, store)

    def make(self, store: str, spawn: Callable[..., Any] | None) -> JsonlSessionPersistence:
        return JsonlSessionPersistence(self.root(store), self.compression, spawn=spawn)  # type: ignore[arg-type]

    def child_source(self, store: str) -> str:
        return (
            "from dsh_session_persistence_jsonl import JsonlSessionPersistence\n"
            "def make_backend(spawn):\n"
            f"    return JsonlSessionPersistence({self.root(store)!r}, {self.compression!r}, "
            "spawn=spawn)\n"
        )


@pytest.fixture(params=["zstd", "none"])
def backend_factory(request: pytest.FixtureRequest, tmp_path: Path) -> JsonlFactory:
    return JsonlFactory(tmp_path, request.param)
