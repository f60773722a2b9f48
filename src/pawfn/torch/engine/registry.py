"""`ModelRegistry`: the process-wide registry of loaded base models, one load per (model, weights, device,
dtype), reference counted by the programs that use them: the last program to close frees its base."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ...core.models import InterpreterModel
from .copies import ModelCopies, ModelCopy
from .network import TorchInterpreter
from .runner import Runner
from .scheduler import Scheduler
from .vision import VisionTower

__all__ = ["BaseKey", "ModelRegistry", "SharedBase"]


@dataclass(frozen=True)
class BaseKey:
    """What identifies one loaded base: model type, resolved weights path, device, dtype and weight storage."""

    model: type[InterpreterModel]
    source: str
    device: str
    dtype: str
    weight_dtype: str | None = None
    numerics: str = "native"


class SharedBase:
    """A loaded base model and its bounded set of copies; runs hold one specific copy each."""

    def __init__(self, key: BaseKey, interpreter: TorchInterpreter, max_copies: int, max_rows: int) -> None:
        self.key = key
        self.interpreter = interpreter
        self._copies = ModelCopies(interpreter, max_copies, max_rows)
        self.users = 0
        """Programs holding this base (guarded by the registry's lock)."""
        self.scheduler = Scheduler(self._copies, Runner(interpreter))
        """Batches every call on this base."""
        self._towers: dict[Path, VisionTower] = {}
        self._towers_lock = threading.Lock()

    def vision_tower(self, projector: Path, load: Callable[[], VisionTower]) -> VisionTower:
        """The image tower of `projector` beside this base, loaded by the first program that asks (`load`) and shared
        by every program on the base; it goes with the base."""
        key = projector.resolve()
        with self._towers_lock:
            tower = self._towers.get(key)
            if tower is None:
                tower = self._towers[key] = load()
            return tower

    @property
    def max_copies(self) -> int:
        """Upper bound on copies (and so on concurrent runs)."""
        return self._copies.max_copies

    @property
    def n_copies(self) -> int:
        """Copies created so far (they are created lazily)."""
        return self._copies.count

    def allow_copies(self, max_copies: int, max_rows: int) -> None:
        """Raise the bounds to `max_copies` and `max_rows` (bounds are never lowered while programs use the base)."""
        self._copies.allow(max_copies, max_rows)
        self.scheduler.wake()

    @contextlib.contextmanager
    def acquire(self) -> Generator[ModelCopy, None, None]:
        """Hold one copy outside the scheduler (a load evaluating its prefix), waiting for a free one; calls waiting
        for it start once it is given back."""
        try:
            with self._copies.acquire() as copy:
                yield copy
        finally:
            self.scheduler.wake()


class ModelRegistry:
    """Process-wide registry; `load_count` tells how often a key was actually loaded (for tests and stats)."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _entries: ClassVar[dict[BaseKey, SharedBase]] = {}
    _key_locks: ClassVar[dict[BaseKey, threading.Lock]] = {}
    _loads: ClassVar[dict[BaseKey, int]] = {}

    @classmethod
    def acquire(cls, key: BaseKey, load: Callable[[], TorchInterpreter], max_copies: int, max_rows: int) -> SharedBase:
        """The shared base for `key`, loading it once, with one more user; pair it with `release`.

        Concurrent callers for one key wait for that load; other keys keep loading in parallel.
        """
        with cls._lock:
            key_lock = cls._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with cls._lock:
                entry = cls._entries.get(key)
                if entry is not None:
                    entry.users += 1
            if entry is None:
                entry = SharedBase(key, load(), max_copies, max_rows)
                with cls._lock:
                    cls._entries[key] = entry
                    cls._loads[key] = cls._loads.get(key, 0) + 1
                    entry.users += 1
            else:
                entry.allow_copies(max_copies, max_rows)
        return entry

    @classmethod
    def release(cls, base: SharedBase) -> None:
        """One user fewer; the last one removes the base, so its memory goes with the last reference to it."""
        with cls._lock:
            base.users -= 1
            if base.users <= 0 and cls._entries.get(base.key) is base:
                del cls._entries[base.key]

    @classmethod
    def load_count(cls, key: BaseKey | None = None) -> int:
        """Loads of `key` so far (of every key when None)."""
        with cls._lock:
            return sum(cls._loads.values()) if key is None else cls._loads.get(key, 0)

    @classmethod
    def loaded(cls) -> list[BaseKey]:
        """Keys of the bases loaded now."""
        with cls._lock:
            return list(cls._entries)

    @classmethod
    def evict(cls, key: BaseKey) -> bool:
        """Forget a loaded base (its memory is freed once no program holds it); True if it was loaded."""
        with cls._lock:
            return cls._entries.pop(key, None) is not None

    @classmethod
    def clear(cls) -> None:
        """Forget every loaded base and the load counts."""
        with cls._lock:
            cls._entries.clear()
            cls._loads.clear()
