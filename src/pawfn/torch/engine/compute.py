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
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

import torch

__all__ = [
    "FreeCores",
    "on_compute_thread",
    "on_compute_thread_now",
    "queue_on_compute_thread",
    "set_threads",
    "share_cores",
    "sharing_cores",
    "trim_heap",
]

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
    """`function(*args, **kwargs)` run on the compute thread (directly when already on it); waits for the result.
    Where pawfn shares the cores (`share_cores`), the thread count follows the idle cores first."""
    executor = _executor or _start()
    if threading.get_ident() == _ident:
        return _adapted(function, *args, **kwargs)

    def run() -> _T:
        return _adapted(function, *args, **kwargs)

    return executor.submit(run).result()


def on_compute_thread_now() -> bool:
    """Whether the calling thread is the compute thread."""
    return _ident is not None and threading.get_ident() == _ident


def queue_on_compute_thread(function: Callable[[], None]) -> Future[None]:
    """Queue `function()` on the compute thread behind the work already there, and return at once (the scheduler's
    iterations take turns with loads this way: a load's prefix evaluation is never starved)."""
    executor = _executor or _start()
    return executor.submit(_adapted, function)


def _adapted(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    cores = _shared
    if cores is not None:
        threads = cores.threads()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
    return function(*args, **kwargs)


class FreeCores:
    """How many threads pawfn's work should use now: the cores other processes left idle over the last interval
    (from /proc/stat's CPU time less this process's own), at least 1 and at most `ceiling`.

    Why: every torch operation and C kernel is an OpenMP fork-join; when another process holds one of the team's
    cores, each of a token's ~1,000 joins waits for that core's time slice, and a call took 4-9x as long beside one
    busy process on 2 cores (llama.cpp, which decodes on one thread, 1.3x). On the idle cores alone it takes about
    its share."""

    def __init__(
        self,
        ceiling: int,
        interval_s: float = 0.2,
        *,
        stat: Path = Path("/proc/stat"),
        cpus: set[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        own_cpu_s: Callable[[], float] = time.process_time,
    ) -> None:
        self.ceiling = max(1, ceiling)
        self.interval_s = interval_s
        self._stat = stat
        self._cpus = cpus if cpus is not None else (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None)
        """The CPUs this process may run on (others' work elsewhere is not in its way)."""
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._clock, self._own_cpu_s = clock, own_cpu_s
        self._last: tuple[float, float, float] | None = None
        self._threads = self.ceiling

    def threads(self) -> int:
        """The thread count for the next piece of work (re-measured at most every `interval_s`)."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self._threads
        measured = self._busy_s()
        if measured is None:  # no /proc/stat (not Linux): keep every core
            return self._threads
        cores, busy = measured
        own = self._own_cpu_s()
        if self._last is not None:
            wall, last_busy, last_own = self._last
            others = max(0.0, (busy - last_busy) - (own - last_own)) / max(now - wall, 1e-3)
            self._threads = max(1, min(self.ceiling, int(cores - others + 0.3)))  # a core 70% taken is taken
        self._last = (now, busy, own)
        return self._threads

    def _busy_s(self) -> tuple[int, float] | None:
        """This process's CPUs and the seconds they have spent busy since boot (all but idle and iowait; steal
        counts: another VM had the core)."""
        try:
            lines = self._stat.read_text().splitlines()
        except OSError:
            return None
        cores, busy = 0, 0
        for line in lines:
            fields = line.split()
            if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
                continue
            if self._cpus is not None and int(fields[0][3:]) not in self._cpus:
                continue
            values = [int(value) for value in fields[1:9]]
            cores, busy = cores + 1, busy + sum(values) - values[3] - values[4]
        return (cores, busy / self._ticks) if cores else None


_shared: FreeCores | None = None
_default_threads = torch.get_num_threads()
"""torch's thread count when pawfn was imported (its default, or what the program set before): the most it uses."""


def share_cores() -> None:
    """Let pawfn's thread count follow the cores other processes leave idle (`FreeCores`), up to torch's count when
    pawfn was imported: `PawConfig.threads` None, on the CPU. A later `set_threads` fixes the count again."""
    global _shared
    if _shared is None:
        _shared = FreeCores(_default_threads)


def sharing_cores() -> bool:
    """Whether pawfn's thread count follows the idle cores now (`share_cores`)."""
    return _shared is not None


def set_threads(threads: int) -> None:
    """Set torch's CPU threads on the compute thread (process-wide for pawfn's work); no more following the idle
    cores (`share_cores`)."""
    global _shared
    _shared = None
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
