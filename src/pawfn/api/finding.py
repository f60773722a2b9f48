"""How a `ProgramPool` learns what a reference names before it makes room: a `Finder` gives its program id and how to
open it (`finder_of`: the pool's own `load` and `identify`; `prepared_first`: resolved and downloaded once, then opened)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..core.backends import Backend
from ..core.config import PawConfig
from ..core.models import InterpreterModel
from ..hub.prepare import PreparedProgram
from .function import PawFn
from .opening import ModelChoice, prepare_reference

__all__ = ["Finder", "Found", "finder_of", "prepared_first", "retrieved"]

M = TypeVar("M", bound=InterpreterModel)
B = TypeVar("B", bound=Backend)


@dataclass(frozen=True)
class Found(Generic[M, B]):
    """What a pool learnt of a reference before making room: its program id, and how to open it."""

    program_id: str | None
    load: Callable[[], Awaitable[PawFn[M, B]]]


Finder = Callable[[str], Awaitable[Found[M, B]]]
"""How a pool learns what a reference names before it evicts anything."""


def finder_of(load: Callable[[str], Awaitable[PawFn[M, B]]], identify: Callable[[str], Awaitable[str | None]] | None) -> Finder[M, B]:
    """A pool's `load` and `identify` as one finder."""

    async def find(reference: str) -> Found[M, B]:
        return Found(None if identify is None else await identify(reference), lambda: load(reference))

    return find


def prepared_first(
    open_prepared: Callable[[PreparedProgram], Awaitable[PawFn[M, B]]],
    choose: ModelChoice,
    config: PawConfig | None,
    base: str | os.PathLike[str] | None,
    references: Mapping[str, str],
    local_paths: bool,
) -> Finder[M, B]:
    """Resolve and download a reference once (a program its interpreter cannot run is refused before its base
    weights are fetched), then open those files: the load asks the hub nothing more. `local_paths=False`: a
    reference is a program id or slug, never a file (`references`' targets, which the pool's owner named, may be)."""

    async def find(reference: str) -> Found[M, B]:
        named = references.get(reference)
        paths = local_paths or named is not None
        prepared = await asyncio.to_thread(
            lambda: prepare_reference(named or reference, choose, config or PawConfig.from_env(), base, local_paths=paths)
        )
        return Found(prepared.program_id, lambda: open_prepared(prepared))

    return find


def retrieved(finding: asyncio.Future[Found[M, B]]) -> None:
    """Mark a find's failure seen: every waiter may have been cancelled, and asyncio would log it as never retrieved."""
    if not finding.cancelled():
        finding.exception()
