"""Another process holding an exclusive `flock` on a file, as the official SDK or a second pawfn would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["lock_held_elsewhere"]

_HOLD = (
    "import fcntl, sys, time\n"
    "from pathlib import Path\n"
    "lock = Path(sys.argv[1])\n"
    "lock.parent.mkdir(parents=True, exist_ok=True)\n"
    "with lock.open('a+b') as handle:\n"
    "    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)\n"
    "    print('locked', flush=True)\n"
    "    time.sleep(float(sys.argv[2]))\n"
)


@contextmanager
def lock_held_elsewhere(path: Path, seconds: float = 60.0) -> Generator[None, None, None]:
    """While inside, a child process holds `path`'s lock (for at most `seconds`); it is killed on the way out."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.kill()
        holder.wait()
