"""One engine per loaded base (`BaseEngine`: its network, KV slots, scheduler and runner, image towers), kept by
`Engines`, one load per (model, weights, device, dtype, storage, arithmetic) and reference counted by the programs
that use it: the last program to close frees its base. `ModelRegistry` is the process's engines, as the public API
shows them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from ...core.models import InterpreterModel
from .kv_slots import KvSlots, KvSlot
from .network import TorchInterpreter
from .runner import Runner
from .scheduler import Scheduler
from .vision import VisionTower

__all__ = ["ENGINES", "BaseEngine", "EngineKey", "Engines", "ModelRegistry"]


@dataclass(frozen=True)
class EngineKey:
    """What identifies one loaded base: model type, resolved weights path, device, dtype, weight storage and arithmetic
    (`auto` resolved for the file before the key is made: one base whatever name a program gave the same arithmetic)."""

    model: type[InterpreterModel]
    source: str
    device: str
    dtype: str
    weight_dtype: str | None = None
    numerics: str = "native"


class BaseEngine:
    """The engine of one loaded base: its network (`interpreter`), its bounded KV slots (a running call holds one),
    the scheduler and runner every call on the base goes through, and the image towers beside it."""

    def __init__(self, key: EngineKey, interpreter: TorchInterpreter, max_slots: int, max_rows: int) -> None:
        self.key = key
        self.interpreter = interpreter
        self._slots = KvSlots(interpreter, max_slots, max_rows)
        self.users = 0
        """Programs holding this base (guarded by the registry's lock)."""
        self.scheduler = Scheduler(self._slots, Runner(interpreter))
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
    def max_slots(self) -> int:
        """Upper bound on slots (and so on concurrent runs)."""
        return self._slots.max_slots

    @property
    def n_slots(self) -> int:
        """Slots created so far (they are created lazily)."""
        return self._slots.count

    def allow_slots(self, max_slots: int, max_rows: int) -> None:
        """Raise the bounds to `max_slots` and `max_rows` (bounds are never lowered while programs use the base)."""
        self._slots.allow(max_slots, max_rows)
        self.scheduler.wake()

    @contextlib.contextmanager
    def acquire(self) -> Generator[KvSlot, None, None]:
        """Hold one slot outside the scheduler (a load evaluating its prefix), waiting for a free one; calls waiting
        for it start once it is given back."""
        try:
            with self._slots.acquire() as slot:
                yield slot
        finally:
            self.scheduler.wake()


class Engines:
    """Loaded bases by key, each loaded once and shared; `load_count` tells how often a key was actually loaded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[EngineKey, BaseEngine] = {}
        self._key_locks: dict[EngineKey, threading.Lock] = {}
        self._loads: dict[EngineKey, int] = {}

    def acquire(self, key: EngineKey, load: Callable[[], TorchInterpreter], max_slots: int, max_rows: int) -> BaseEngine:
        """The engine for `key`, loading its base once, with one more user; pair it with `release`. Concurrent callers
        for one key wait for that load; other keys keep loading in parallel."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                engine = self._engines.get(key)
                if engine is not None:
                    engine.users += 1
            if engine is None:
                engine = BaseEngine(key, load(), max_slots, max_rows)
                with self._lock:
                    self._engines[key] = engine
                    self._loads[key] = self._loads.get(key, 0) + 1
                    engine.users += 1
            else:
                engine.allow_slots(max_slots, max_rows)
        return engine

    def release(self, engine: BaseEngine) -> None:
        """One user fewer; the last one removes the engine, so its memory goes with the last reference to it."""
        with self._lock:
            engine.users -= 1
            if engine.users <= 0 and self._engines.get(engine.key) is engine:
                del self._engines[engine.key]

    def load_count(self, key: EngineKey | None = None) -> int:
        """Loads of `key` so far (of every key when None)."""
        with self._lock:
            return sum(self._loads.values()) if key is None else self._loads.get(key, 0)

    def loaded(self) -> list[EngineKey]:
        """Keys of the bases loaded now."""
        with self._lock:
            return list(self._engines)

    def evict(self, key: EngineKey) -> bool:
        """Forget a loaded base (its memory is freed once no program holds it); True if it was loaded."""
        with self._lock:
            return self._engines.pop(key, None) is not None

    def clear(self) -> None:
        """Forget every loaded base and the load counts."""
        with self._lock:
            self._engines.clear()
            self._loads.clear()


ENGINES = Engines()
"""The process's engines: every Torch program in this process shares its base through them."""


class ModelRegistry:
    """The process's loaded bases (`ENGINES`), as the public API shows them: what is loaded, how often a base was
    loaded, and forgetting them (tests, notebooks)."""

    @staticmethod
    def load_count(key: EngineKey | None = None) -> int:
        """Loads of `key` so far (of every key when None)."""
        return ENGINES.load_count(key)

    @staticmethod
    def loaded() -> list[EngineKey]:
        """Keys of the bases loaded now."""
        return ENGINES.loaded()

    @staticmethod
    def evict(key: EngineKey) -> bool:
        """Forget a loaded base (its memory is freed once no program holds it); True if it was loaded."""
        return ENGINES.evict(key)

    @staticmethod
    def clear() -> None:
        """Forget every loaded base and the load counts."""
        ENGINES.clear()
