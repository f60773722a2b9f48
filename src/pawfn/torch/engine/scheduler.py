"""Continuous batching on one shared base, the deciding half: which calls start, which rows step together, and
when calls end. Calls from any threads, tasks and programs join the next decode step and leave when they end.

Each iteration the scheduler writes a `Plan` (data: prompts to evaluate, decode steps grouped by program) and a
runner executes it (`runner.Runner`); both run on the compute thread, one iteration queued behind the other work
there, so a call costs no thread of its own. A call waits to join at most one iteration, unless every KV slot
is busy.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field

from ...calls.pending import PendingGeneration
from ...calls.runtime import Decoding
from .compute import on_compute_thread, on_compute_thread_now, queue_on_compute_thread
from .kv_slots import KvSlots, KvSlot
from ..model.kvcache import PrefixState
from ..weights.lora import DeviceAdapter
from .session import TorchSession
from .vision import PromptImage

__all__ = ["Plan", "ScheduledCall", "Scheduler", "Step"]


@dataclass(eq=False)
class ScheduledCall:
    """A call handed to a `Scheduler`: its decoding, its program's side paths and prefix, and where results go."""

    decoding: Decoding
    adapter: DeviceAdapter
    prefix: PrefixState
    pending: PendingGeneration
    ended: Callable[[], None]
    """Called once when the call ends, however it ends (the program counts its running calls)."""
    batch_invariant: bool = True
    """Its decode steps compute each row exactly as alone (`PawConfig.batch_invariant`)."""
    slot: KvSlot | None = None
    """The KV slot (its KV cache) the call holds while it runs."""
    session: TorchSession | None = None
    token: int = 0
    """The token sampled last, to be taken (and evaluated, if the call goes on) in the next step."""
    parts: Sequence[list[int] | PromptImage] = ()
    """A prompt with images: its runs of token ids and its images in order (empty: `decoding.prompt_ids`)."""


@dataclass(frozen=True)
class Step:
    """One forward pass of a decode step: its rows, a program's rows adjacent, and whether it is row-exact."""

    calls: list[ScheduledCall]
    batch_invariant: bool


@dataclass(frozen=True)
class Plan:
    """One iteration, decided before anything runs: the prompts to evaluate (calls that hold a slot now), then the
    decode steps of the calls already running."""

    start: list[ScheduledCall] = field(default_factory=list[ScheduledCall])
    steps: list[Step] = field(default_factory=list[Step])


Failures = list[tuple[ScheduledCall, Exception]]
Execute = Callable[[Plan], Failures]
"""Runs a plan on the compute thread and names the calls that failed (a failure is that call's result only)."""


class Scheduler:
    """Batches the calls on one base; the slots bound how many run (`max_slots`) and how many rows share a pass
    (`max_rows`)."""

    def __init__(self, slots: KvSlots, execute: Execute) -> None:
        self._slots = slots
        self._execute = execute
        self._lock = threading.Condition()
        self._waiting: deque[ScheduledCall] = deque()
        self._running: list[ScheduledCall] = []
        """Calls that hold a slot: touched by iterations only, which run one at a time on the compute thread."""
        self._busy = False
        """An iteration is queued or running; it queues the next one while there is work."""
        self._woken = False
        """A call came or a slot was given back during the iteration: waiting calls may start in the next one."""
        self.steps = 0
        """Decode steps taken so far (forward passes over one or more rows)."""
        self.rows_stepped = 0
        """Rows those steps advanced, in total (rows_stepped / steps is the mean batch size)."""

    def submit(self, call: ScheduledCall) -> None:
        """Queue `call`; it starts in the next iteration that finds a free slot."""
        with self._lock:
            self._waiting.append(call)
            self._woken = True
            start = not self._busy
            self._busy = True
        if start:
            queue_on_compute_thread(self._iterate)

    def wake(self) -> None:
        """A slot was given back outside the scheduler (a load's prefix evaluation), or the bounds were raised: waiting
        calls may start now."""
        with self._lock:
            self._woken = True
            start = bool(self._waiting) and not self._busy
            self._busy = self._busy or start
        if start:
            queue_on_compute_thread(self._iterate)

    def wait_idle(self) -> None:
        """Wait until no iteration is queued or running (no call waiting for a slot or running)."""
        if on_compute_thread_now():
            return  # an iteration is the caller (a token listener closing its program): it ends by itself
        with self._lock:
            self._lock.wait_for(lambda: not self._busy)
        on_compute_thread(lambda: None)  # the last iteration has returned: its frame no longer holds the base

    @property
    def running(self) -> int:
        """Calls decoding now."""
        return len(self._running)

    def plan(self) -> Plan:
        """Decide the next iteration: end the calls that are done or cancelled, step the others (a program's rows
        adjacent, at most `max_rows` per pass) and start waiting calls while slots are free."""
        stepping: list[ScheduledCall] = []
        for call in list(self._running):
            try:
                goes_on = not call.pending.abandoned.is_set() and call.decoding.take(call.token)
            except Exception as exc:  # noqa: BLE001 - its token listener failed: that call's error, not the batch's
                self._end(call, exc)
                continue
            if goes_on:
                stepping.append(call)
            else:
                self._end(call, None)
        first_seen: dict[int, int] = {}  # each program's side paths then run once per pass, on all its rows
        stepping.sort(key=lambda call: first_seen.setdefault(id(call.adapter), len(first_seen)))
        width = self._slots.max_rows
        steps: list[Step] = []
        for invariant in (True, False):  # each program's choice holds: row-exact rows never share a batched pass
            rows = [call for call in stepping if call.batch_invariant is invariant]
            steps += [Step(rows[start : start + width], invariant) for start in range(0, len(rows), width)]
        started: list[ScheduledCall] = []
        with self._lock:  # calls cancelled while they waited for a slot end now, without one
            cancelled = [call for call in self._waiting if call.pending.abandoned.is_set()]
            for call in cancelled:
                self._waiting.remove(call)
        for call in cancelled:
            call.pending.set_running_or_notify_cancel()
            self._end(call, None)
        while True:
            with self._lock:
                self._woken = False
                slot = self._slots.try_take() if self._waiting else None  # every running call holds one
                if slot is None:
                    break
                call = self._waiting.popleft()
            call.slot = slot
            self._running.append(call)
            if call.pending.set_running_or_notify_cancel():
                started.append(call)
            else:
                self._end(call, None)
        return Plan(started, steps)

    def _iterate(self) -> None:
        """One iteration on the compute thread: plan, execute, then queue the next while there is work."""
        try:
            plan = self.plan()
            for call, error in self._execute(plan):
                self._end(call, error)
            self.steps += len(plan.steps)
            self.rows_stepped += sum(len(step.calls) for step in plan.steps)
        finally:
            with self._lock:
                again = bool(self._running) or (bool(self._waiting) and self._woken)
                self._busy = again
                if not again:
                    self._lock.notify_all()
            if again:
                queue_on_compute_thread(self._iterate)

    def _end(self, call: ScheduledCall, error: BaseException | None) -> None:
        """Give back the call's slot and hand over its result (or `error`); a cancelled call gets nothing."""
        if call in self._running:
            self._running.remove(call)
        slot, call.slot, call.session = call.slot, None, None
        try:
            if slot is not None:
                self._slots.give_back(slot)
                self.wake()
        finally:
            pending = call.pending
            if not pending.done():
                if error is not None:
                    pending.set_exception(error)
                elif pending.abandoned.is_set():
                    pending.set_exception(CancelledError())
                else:
                    pending.settle(call.decoding.result)
            call.ended()
