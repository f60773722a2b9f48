"""A base's model copies: a bounded set of KV caches over the shared read-only weights, made as runs overlap."""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import contextmanager

from ..model.kvcache import KVCache
from .network import TorchInterpreter

__all__ = ["ModelCopies", "ModelCopy"]


class ModelCopy:
    """One execution copy of a base: its own KV cache over the shared read-only weights."""

    def __init__(self, index: int, cache: KVCache) -> None:
        self.index = index
        self.cache = cache
        self.runs = 0


class ModelCopies:
    """A base's bounded set of copies (KV caches over the shared weights), created as runs overlap. The scheduler
    holds this, not the `SharedBase`, so the base and its scheduler form no reference cycle: the weights go with
    the last program's reference, not at some later garbage collection."""

    def __init__(self, interpreter: TorchInterpreter, max_copies: int, max_rows: int) -> None:
        self._interpreter = interpreter
        self.max_copies = max_copies
        """Upper bound on copies (and so on concurrent runs)."""
        self.max_rows = max_rows
        """Most rows in one decode step."""
        self._copies: list[ModelCopy] = []
        self._free: list[ModelCopy] = []
        self._available = threading.Condition()

    @property
    def count(self) -> int:
        """Copies created so far."""
        return len(self._copies)

    def allow(self, max_copies: int, max_rows: int) -> None:
        """Raise the bounds (never lowered while programs use the base)."""
        with self._available:
            self.max_copies = max(self.max_copies, max_copies)
            self.max_rows = max(self.max_rows, max_rows)
            self._available.notify_all()

    def try_take(self) -> ModelCopy | None:
        """A copy for a run without waiting (created if below the bound), or None when every copy is in use."""
        with self._available:
            return self._take_locked()

    def give_back(self, copy: ModelCopy) -> None:
        """Return a copy `try_take` or `acquire` handed out."""
        with self._available:
            self._free.append(copy)
            self._available.notify()

    @contextmanager
    def acquire(self) -> Generator[ModelCopy, None, None]:
        """Hold one copy for a run, waiting for a free one when every copy is in use (never on the compute thread:
        the runs holding them give them back there)."""
        with self._available:
            while (copy := self._take_locked()) is None:
                self._available.wait()
        try:
            yield copy
        finally:
            self.give_back(copy)

    def _take_locked(self) -> ModelCopy | None:
        if self._free:
            copy = self._free.pop()
        elif len(self._copies) < self.max_copies:
            copy = ModelCopy(len(self._copies), self._interpreter.new_cache())
            self._copies.append(copy)
        else:
            return None
        copy.runs += 1
        return copy
