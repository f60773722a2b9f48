"""Waiting on calls: a Ctrl-C reaches the waiting main thread even when the kernel hands SIGINT to another thread."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from pawfn.calls.pending import PendingGeneration, results_in_order


class _InterruptedError(Exception):
    """Raised by the test's SIGINT handler (a KeyboardInterrupt that escaped would end the pytest session)."""


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _InterruptedError

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigint_delivered_to_a_worker_thread_cancels_the_calls_the_main_thread_waits_on(sigint_raises: None) -> None:
    """The CI failure this guards: the kernel gave a process's SIGINT to a decode thread, and the main thread,
    blocked in a lock wait with no timeout, raised it only once the call had run to its end (nothing was cancelled)."""
    pendings = [PendingGeneration(), PendingGeneration()]
    finish = threading.Event()

    def worker() -> None:
        finish.wait(0.3)  # the main thread is in its wait by then
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the signal lands on this thread, not the main one
        finish.wait(10)  # without the wake-ups the main thread waits here until the calls end
        for pending in pendings:
            if not pending.cancelled():
                pending.set_exception(RuntimeError("the call ended before the interrupt was seen"))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        with pytest.raises(_InterruptedError):
            results_in_order(pendings)
        assert all(pending.cancelled() for pending in pendings)
        assert all(pending.abandoned.is_set() for pending in pendings)  # a scheduler drops their rows
    finally:
        finish.set()
        thread.join()
