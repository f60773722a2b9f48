"""Atomic file writes: readers see the old file or the whole new one, never a part, and no temporary file stays
behind when the write fails (KeyboardInterrupt included)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["mark_used", "write_atomically"]


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Have `write` fill a temporary file beside `path` (its result is ignored), then rename it to `path`; on any
    error the temporary file is removed and the error raised (callers that only cache decide what to swallow)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def mark_used(path: Path) -> None:
    """Record that a cached file was just read (its modification time: a pruned cache keeps the most recently used);
    a read-only cache is left as it is."""
    with contextlib.suppress(OSError):
        os.utime(path)
