"""Turning the real-programs switch on and off from tests (`pawfn.core.guard` holds it)."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager

from ..core.guard import allowing_real_programs, blocking_real_programs

__all__ = ["allow_real_programs", "block_real_programs"]


@contextmanager
def block_real_programs() -> Generator[None, None, None]:
    """While the block runs, opening a real program or asking a hub or server raises `RealProgramsBlockedError`
    (fakes from `pawfn.testing.fake` still answer)."""
    with blocking_real_programs("pawfn.testing.block_real_programs()"):
        yield


@contextmanager
def allow_real_programs() -> Generator[None, None, None]:
    """Real programs allowed while the block runs, whatever blocked them in this process (not `PAWFN_NO_REAL_PROGRAMS`)."""
    with allowing_real_programs():
        yield
