"""The Torch backend's compute thread: every torch operation pawfn runs (loads, forward passes, sampling) runs on
this one thread, whichever thread calls.

Why: torch's CPU parallelism on Linux is libgomp, which gives each calling thread its own OpenMP team and lets
idle team threads spin only while the process's OpenMP threads fit the CPUs. A second thread running parallel
ops (an `arun` worker, a benchmark's caller thread, a second caller) makes every team sleep between parallel
regions, and each of the ~1,000 regions of a Qwen3-0.6B token then pays a wake-up: a 10-token call took ~1.3x
as long from a worker thread as from the loading thread here. One thread keeps one team. It also makes
`PawConfig.threads` (an OpenMP setting of the calling thread) apply to the thread that computes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

__all__ = ["on_compute_thread", "set_threads", "trim_heap"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_ident: int | None = None


def _start() -> ThreadPoolExecutor:
    global _executor, _ident
    with _lock:
        if _executor is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pawfn-compute")
            _ident = executor.submit(threading.get_ident).result()
            _executor = executor
        return _executor


def _forget_after_fork() -> None:
    """A forked child has no compute thread: it starts its own on first use."""
    global _executor, _ident, _lock
    _executor, _ident, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def on_compute_thread(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`function(*args, **kwargs)` run on the compute thread (directly when already on it); waits for the result."""
    executor = _executor or _start()
    if threading.get_ident() == _ident:
        return function(*args, **kwargs)
    return executor.submit(function, *args, **kwargs).result()


def set_threads(threads: int) -> None:
    """Set torch's CPU threads on the compute thread (process-wide for pawfn's work)."""
    on_compute_thread(torch.set_num_threads, threads)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc (macOS, musl, Windows): nothing to trim
        return None
    return trim


def trim_heap() -> None:
    """Hand the heap memory a load freed back to the OS. glibc keeps freed blocks in its arenas, and a load frees
    many (float32 adapter arrays, conversion temporaries): a second int8 program's process kept ~450 MB of them
    here. A no-op where the C library has no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
