"""A cross-thread, cross-process exclusive lock on a file (`file_lock`), as the cache takes it around installs and
downloads: a wait is logged, and gives up with `CacheLockError` after a timeout."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
import time
from collections.abc import Generator
from pathlib import Path

from ..core.errors import CacheLockError

__all__ = ["file_lock"]

_LOCK_POLL_S = 0.1
_LOG = logging.getLogger("pawfn")
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def file_lock(path: Path, what: str, timeout_s: float) -> Generator[None, None, None]:
    """Exclusive lock on `path` (made with its folder), across threads and processes; `what` names it in the log and
    in the `CacheLockError` raised after `timeout_s` seconds of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(str(path), threading.Lock())
    if not thread_lock.acquire(blocking=False):
        _LOG.warning("waiting for the cache lock on %s (another thread is installing or downloading it)", what)
        if not thread_lock.acquire(timeout=timeout_s):
            raise CacheLockError(what, path, timeout_s)
    try:
        with path.open("a+b") as handle:
            told = False
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        _LOG.warning("waiting for the cache lock on %s (%s): another process holds it", what, path)
                        told = True
                    if time.monotonic() >= deadline:
                        raise CacheLockError(what, path, timeout_s) from None
                    time.sleep(_LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        thread_lock.release()
