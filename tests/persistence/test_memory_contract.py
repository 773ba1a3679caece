"""The backend contract (contract.py) run against the in-memory storage the session layer ships.

A contract "store" is one :class:`MemoryStorage` instance: every service built over it
shares its logs, as backend instances over one JSONL root share files. The cross-process
cases skip: an in-memory store is not shared between processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dsh_host.session.backend import PersistenceService
from dsh_host.session.storage import MemoryStorage

from .contract import *  # noqa: F403

pytestmark = pytest.mark.anyio


class MemoryFactory:
    def __init__(self) -> None:
        self.stores: dict[str, MemoryStorage] = {}

    def make(self, store: str, spawn: Callable[..., Any] | None) -> PersistenceService[Any]:
        return PersistenceService(self.stores.setdefault(store, MemoryStorage()), spawn=spawn)

    def child_source(self, store: str) -> str:
        pytest.skip("an in-memory store is not shared between processes")


@pytest.fixture
def backend_factory() -> MemoryFactory:
    return MemoryFactory()
