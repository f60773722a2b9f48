"""What a `ProgramPool` holds and hands out: `HeldProgram` (a program and its bookkeeping), `ProgramLease` (a
program held in use by its holder), and what the pool reports of them (`ResidentProgram`, `PoolStats`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from ..core.backends import Backend
from ..core.models import InterpreterModel
from .function import PawFn

__all__ = ["HeldProgram", "PoolStats", "ProgramLease", "ResidentProgram"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)


@dataclass(frozen=True)
class ResidentProgram(Generic[M, B]):
    """A program the pool holds now."""

    name: str
    """Its program id, or the reference it was first loaded by where it has none."""
    references: tuple[str, ...]
    """Every reference (and alias) that finds it, sorted."""
    program: PawFn[M, B]
    pinned: bool
    """Kept until unloaded (`pin`, `add`): never evicted."""
    in_flight: int
    """`use` blocks holding it now."""
    last_used_s: float
    """`time.monotonic()` when its last use ended (its load time if never used)."""
    resident_bytes: int | None
    """Bytes it holds beside its base (`ProgramRuntime.resident_bytes`); None where its backend cannot tell."""


@dataclass(frozen=True)
class PoolStats:
    """Running totals of a pool."""

    loads: int
    """Programs loaded by `load` and `use`, first or again after an eviction (not those `add`ed)."""
    evictions: int
    """Idle programs unloaded to stay within the budget."""
    releases: int
    """Idle programs let go by `release` (a router dropped them): not evictions."""
    cold_start_s: float
    """Seconds those loads took, in all."""


class HeldProgram(Generic[M, B]):
    """A program a pool holds, and its bookkeeping: its name, its pin, its uses in flight, its last use."""

    def __init__(self, program: PawFn[M, B], name: str, pinned: bool) -> None:
        self.program = program
        self.name = name
        self.pinned = pinned
        self.in_flight = 0
        self.last_used_s = time.monotonic()


class ProgramLease(Generic[M, B]):
    """A program a pool hands out: neither evicted nor unloaded (so never closed) until the lease is released, by
    `release()` or at the end of `async with lease as program:`. Release it on the pool's event loop."""

    def __init__(self, entry: HeldProgram[M, B], went_idle: asyncio.Event) -> None:
        entry.in_flight += 1  # taken before any await: an eviction sees the lease
        self._entry = entry
        self._went_idle = went_idle
        self._held = True

    @property
    def program(self) -> PawFn[M, B]:
        """The program; after `release` the pool may close it."""
        return self._entry.program

    @property
    def held(self) -> bool:
        """False once released."""
        return self._held

    def release(self) -> None:
        """Let the pool evict or unload the program again (once it has no other lease); a second call does nothing."""
        if not self._held:
            return
        self._held = False
        self._entry.in_flight -= 1
        self._entry.last_used_s = time.monotonic()
        if not self._entry.in_flight:
            self._went_idle.set()

    async def __aenter__(self) -> PawFn[M, B]:
        return self._entry.program

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<ProgramLease {self._entry.name} {'held' if self._held else 'released'}>"
