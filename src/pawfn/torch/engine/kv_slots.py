"""A base's KV slots: a bounded set of KV caches over the shared read-only weights, made as runs overlap."""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import contextmanager

from ..model.kvcache import KVCache
from .network import TorchInterpreter

__all__ = ["KvSlots", "KvSlot"]


class KvSlot:
    """One execution slot of a base: its own KV cache over the shared read-only weights."""

    def __init__(self, index: int, cache: KVCache) -> None:
        self.index = index
        self.cache = cache
        self.runs = 0


class KvSlots:
    """A base's bounded set of slots (KV caches over the shared weights), created as runs overlap. The scheduler
    holds this, not the `BaseEngine`, so the base and its scheduler form no reference cycle: the weights go with
    the last program's reference, not at some later garbage collection."""

    def __init__(self, interpreter: TorchInterpreter, max_slots: int, max_rows: int) -> None:
        self._interpreter = interpreter
        self.max_slots = max_slots
        """Upper bound on slots (and so on concurrent runs)."""
        self.max_rows = max_rows
        """Most rows in one decode step."""
        self._slots: list[KvSlot] = []
        self._free: list[KvSlot] = []
        self._available = threading.Condition()

    @property
    def count(self) -> int:
        """Slots created so far."""
        return len(self._slots)

    def allow(self, max_slots: int, max_rows: int) -> None:
        """Raise the bounds (never lowered while programs use the base)."""
        with self._available:
            self.max_slots = max(self.max_slots, max_slots)
            self.max_rows = max(self.max_rows, max_rows)
            self._available.notify_all()

    def try_take(self) -> KvSlot | None:
        """A slot for a run without waiting (created if below the bound), or None when every slot is in use."""
        with self._available:
            return self._take_locked()

    def give_back(self, slot: KvSlot) -> None:
        """Return a slot `try_take` or `acquire` handed out; its sequence ends (its program's prefix let go)."""
        slot.cache.end()
        with self._available:
            self._free.append(slot)
            self._available.notify()

    @contextmanager
    def acquire(self) -> Generator[KvSlot, None, None]:
        """Hold one slot for a run, waiting for a free one when every slot is in use (never on the compute thread:
        the runs holding them give them back there)."""
        with self._available:
            while (slot := self._take_locked()) is None:
                self._available.wait()
        try:
            yield slot
        finally:
            self.give_back(slot)

    def _take_locked(self) -> KvSlot | None:
        if self._free:
            slot = self._free.pop()
        elif len(self._slots) < self.max_slots:
            slot = KvSlot(len(self._slots), self._interpreter.new_cache())
            self._slots.append(slot)
        else:
            return None
        slot.runs += 1
        return slot
