"""The switch that keeps real programs out of unit tests: while it is on, opening a program on a real backend (its
base weights, adapter, llama.cpp context) and any request to a hub or a pawfn server raise
`RealProgramsBlockedError`, naming the switch. On with `pawfn.testing.block_real_programs()`, the pytest plugin's
`--pawfn-no-real-programs` (or its `pawfn_no_real_programs` ini setting), or `PAWFN_NO_REAL_PROGRAMS=1`."""

from __future__ import annotations

import os
import threading
from collections.abc import Generator
from contextlib import contextmanager

from .errors import RealProgramsBlockedError

__all__ = ["ENVIRONMENT_SWITCH", "allowing_real_programs", "blocking_real_programs", "check_real_program", "real_programs_blocked"]

ENVIRONMENT_SWITCH = "PAWFN_NO_REAL_PROGRAMS"
"""The environment variable that turns the switch on for a whole process (and the processes it starts)."""

_lock = threading.Lock()
_reasons: list[str] = []
"""Who turned the switch on, innermost last (a process-wide stack: threads and worker threads see it too)."""


def real_programs_blocked() -> str | None:
    """What turned the switch on (None: real programs may load)."""
    with _lock:
        if _reasons:
            return _reasons[-1]
    if os.environ.get(ENVIRONMENT_SWITCH, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"{ENVIRONMENT_SWITCH}=1"
    return None


def check_real_program(what: str) -> None:
    """`RealProgramsBlockedError` if the switch is on: `what` (a real load or request) names what was refused."""
    reason = real_programs_blocked()
    if reason is not None:
        raise RealProgramsBlockedError(
            f"{what} while real programs are blocked ({reason}); stand a pawfn.testing.fake(...) in for the program, or allow "
            "real ones where they are meant (pytest: @pytest.mark.pawfn_real_programs)"
        )


@contextmanager
def blocking_real_programs(reason: str) -> Generator[None, None, None]:
    """The switch on while the block runs (`reason` is what the error names)."""
    with _lock:
        _reasons.append(reason)
    try:
        yield
    finally:
        with _lock:
            _reasons.remove(reason)


@contextmanager
def allowing_real_programs() -> Generator[None, None, None]:
    """The switch off while the block runs, whatever turned it on in this process (the environment's stays)."""
    with _lock:
        saved = list(_reasons)
        _reasons.clear()
    try:
        yield
    finally:
        with _lock:
            _reasons[:0] = saved
