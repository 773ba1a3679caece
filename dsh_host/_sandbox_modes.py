"""The sandbox modes, spelled once (re-exported by :mod:`dsh_host._sandbox`).

A module of its own, importing nothing, so that ``dsh run --help`` can list the modes without
loading the sandbox layer (and msgspec with it).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["CONFINED_SANDBOX_MODES", "SANDBOX_MODES", "ConfinedSandboxMode", "SandboxMode"]

SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]
ConfinedSandboxMode = Literal["read-only", "workspace-write"]

SANDBOX_MODES: tuple[SandboxMode, ...] = ("read-only", "workspace-write", "danger-full-access")
CONFINED_SANDBOX_MODES: tuple[ConfinedSandboxMode, ...] = ("read-only", "workspace-write")
