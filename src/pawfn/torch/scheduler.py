"""Continuous batching on one shared base: calls from any threads, tasks and programs join the next decode step
and leave when they end.

One scheduler thread per base admits waiting calls (each takes a model copy: its KV cache), evaluates their
prompts one by one, then advances every running call by one token in shared forward passes (`TorchInterpreter.step`,
exact per row, so a call's tokens never depend on what else runs). A call waits to join at most one step plus the
prompts admitted with it, unless every model copy is busy.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field

from ..runtime import Decoding

from ..calls import PendingGeneration
from .compute import on_compute_thread
from .kvcache import KVCache, PrefixState
from .lora import DeviceAdapter
from .network import TorchInterpreter
from .session import TorchSession

__all__ = ["Scheduler", "ScheduledCall"]


@dataclass(eq=False)
class ScheduledCall:
    """A call handed to a `Scheduler`: its decoding, its program's side paths and prefix, and where results go."""

    decoding: Decoding
    adapter: DeviceAdapter
    prefix: PrefixState
    pending: PendingGeneration
    ended: Callable[[], None]
    """Called once when the call ends, however it ends (the program counts its running calls)."""
    cache: KVCache | None = None
    """The KV cache of the model copy the call holds while it runs."""
    session: TorchSession | None = None
    token: int = 0
    """The token sampled last, to be taken (and evaluated, if the call goes on) in the next step."""
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


class Scheduler:
    """Batches the calls on one base; `max_running` is the copies bound, `max_rows` the rows per forward pass."""

    def __init__(
        self,
        interpreter: TorchInterpreter,
        acquire: Callable[[], contextlib.AbstractContextManager[KVCache]],
        max_running: Callable[[], int],
        max_rows: Callable[[], int],
    ) -> None:
        self._interpreter = interpreter
        self._acquire = acquire
        self._max_running = max_running
        self._max_rows = max_rows
        self._lock = threading.Lock()
        self._waiting: deque[ScheduledCall] = deque()
        self._running: list[ScheduledCall] = []
        self._thread: threading.Thread | None = None
        self._ending: threading.Thread | None = None
        """The last thread that found nothing to do (it may still be returning)."""
        self.steps = 0
        """Decode steps taken so far (forward passes over one or more rows)."""
        self.rows_stepped = 0
        """Rows those steps advanced, in total (rows_stepped / steps is the mean batch size)."""

    def submit(self, call: ScheduledCall) -> None:
        """Queue `call`; it joins at the next step."""
        with self._lock:
            self._waiting.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="pawfn-scheduler", daemon=True)
                self._thread.start()

    def wait_idle(self) -> None:
        """Wait until the scheduler thread has ended (no call waiting or running); it holds the base until then."""
        with self._lock:
            threads = [thread for thread in (self._thread, self._ending) if thread is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    @property
    def running(self) -> int:
        """Calls decoding now."""
        return len(self._running)

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._waiting and not self._running:
                    self._ending, self._thread = self._thread, None  # a later submit starts a new thread
                    return
                admitted: list[ScheduledCall] = []
                while self._waiting and len(self._running) + len(admitted) < self._max_running():
                    admitted.append(self._waiting.popleft())
            for call in admitted:
                if not call.pending.set_running_or_notify_cancel():
                    call.ended()
                    continue
                # a copy is taken here, off the compute thread: a load evaluating its prefix may hold one briefly
                call.cache = call.resources.enter_context(self._acquire())
                self._running.append(call)
            on_compute_thread(self._iteration, admitted)

    def _iteration(self, admitted: list[ScheduledCall]) -> None:
        """Evaluate the new calls' prompts, then take one token for every running call."""
        for call in admitted:
            if call.cache is not None:  # a call cancelled before it was admitted has none
                try:
                    self._start(call, call.cache)
                except Exception as exc:  # noqa: BLE001 - one call's failure is that call's result
                    self._end(call, exc)
        stepping: list[tuple[ScheduledCall, TorchSession]] = []
        for call in list(self._running):  # every running call has started: a failed start ended it
            if call.session is None or call.pending.abandoned.is_set() or not call.decoding.take(call.token):
                self._end(call, None)
            else:
                stepping.append((call, call.session))
        # a program's rows adjacent: each program's side paths then run once per step, on all its rows
        first_seen: dict[int, int] = {}
        stepping.sort(key=lambda entry: first_seen.setdefault(id(entry[0].adapter), len(first_seen)))
        width = self._max_rows()
        for start in range(0, len(stepping), width):
            chunk = stepping[start : start + width]
            try:
                logits = self._interpreter.step([session.step_row(call.token) for call, session in chunk])
            except Exception as exc:  # noqa: BLE001 - a failed pass fails the calls in it, not the scheduler
                for call, _ in chunk:
                    self._end(call, exc)
                continue
            self.steps += 1
            self.rows_stepped += len(chunk)
            for (call, session), row_logits in zip(chunk, logits, strict=True):
                try:
                    session.stepped(row_logits)
                    call.token = session.sample()
                except Exception as exc:  # noqa: BLE001 - e.g. non-finite logits: that row's call fails alone
                    self._end(call, exc)

    def _start(self, call: ScheduledCall, cache: KVCache) -> None:
        session = TorchSession(self._interpreter, call.adapter, call.prefix, cache, call.decoding.options)
        call.session = session
        session.prefill(call.decoding.prompt_ids)
        call.decoding.prefilled()
        call.token = session.sample()

    def _end(self, call: ScheduledCall, error: BaseException | None) -> None:
        """Free the call's copy and hand over its result (or `error`); a cancelled call gets nothing."""
        if call in self._running:
            self._running.remove(call)
        try:
            call.resources.close()
        finally:
            pending = call.pending
            if not pending.done():
                if error is not None:
                    pending.set_exception(error)
                elif pending.abandoned.is_set():
                    pending.set_exception(CancelledError())
                else:
                    pending.set_result(call.decoding.result())
            call.ended()
