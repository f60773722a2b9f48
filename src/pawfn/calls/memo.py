"""A result cache for deterministic calls: a program's greedy (or seeded) call on the same input and options gives the
same `Generation`, so a repeated one is answered from memory instead of computed again.

Keyed by the program's identity (its files, base, backend and engine settings), the input (an image by its pixels'
hash) and the options; bounded in bytes, least recently used first; shared by every program loaded with the same
`PawConfig.result_cache_bytes` (a server's programs share one). `bypassing_result_cache()` skips it for the calls a
block starts (a server does so for `Cache-Control: no-cache`).
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.images import Image
from ..core.options import RuntimeOptions
from ..core.results import Generation
from .prompt import CallInput

__all__ = ["CacheStats", "ResultCache", "bypassing_result_cache", "result_cache_for"]

_ENTRY_OVERHEAD_BYTES = 512
"""What an entry costs beside its key's and its generation's text and token ids (objects, the map's slot)."""

_bypass: contextvars.ContextVar[bool] = contextvars.ContextVar("pawfn_bypass_result_cache", default=False)


@contextmanager
def bypassing_result_cache() -> Generator[None]:
    """Calls started inside the block neither read nor fill the result cache (they are computed)."""
    token = _bypass.set(True)
    try:
        yield
    finally:
        _bypass.reset(token)


@dataclass(frozen=True)
class CacheStats:
    """A result cache's counts: `hits` answered from it, `misses` computed (deterministic calls only), `entries` and
    `bytes` held now, `evictions` of the least recently used to stay within `max_bytes`."""

    hits: int
    misses: int
    entries: int
    bytes: int
    max_bytes: int
    evictions: int


class ResultCache:
    """`Generation`s of deterministic calls, at most `max_bytes` (as counted by `entry_bytes`), least recently used
    out first; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str, str], tuple[Generation, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = self._hits = self._misses = self._evictions = 0

    @staticmethod
    def key(identity: str, given: CallInput, options: RuntimeOptions) -> tuple[str, str, str] | None:
        """The cache key of a call, None for a call it must not answer: a sampled call without a seed, or any call in
        a `bypassing_result_cache()` block."""
        if _bypass.get() or (options.temperature > 0 and options.seed is None):
            return None
        return identity, _input_key(given), options.model_dump_json()

    def get(self, key: tuple[str, str, str]) -> Generation | None:
        """The generation stored for `key` (counted as a hit), else None (a miss)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return found[0]

    def put(self, key: tuple[str, str, str], generation: Generation) -> None:
        """Store `generation` under `key`, evicting the least recently used past `max_bytes` (one larger than the
        whole cache is not stored)."""
        size = entry_bytes(key, generation)
        if size > self.max_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._bytes -= previous[1]
            self._entries[key] = (generation, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
                self._evictions += 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries), self._bytes, self.max_bytes, self._evictions)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def entry_bytes(key: tuple[str, str, str], generation: Generation) -> int:
    """What an entry is counted as: its key's and text's UTF-8, 8 bytes per token id, and a fixed overhead."""
    return sum(len(part.encode()) for part in key) + len(generation.text.encode()) + 8 * len(generation.token_ids) + _ENTRY_OVERHEAD_BYTES


def _input_key(given: CallInput) -> str:
    """A call's input as a key: its text, or its arguments with each image as the sha256 of its pixels."""
    if isinstance(given, str):
        return "s" + given
    parts = [("s" + argument) if isinstance(argument, str) else ("i" + _image_digest(argument)) for argument in given]
    return "\0".join(parts)


def _image_digest(image: Image) -> str:
    """sha256 of the image's normalized pixels (the same picture in another file format is the same input)."""
    picture = image.rgb()
    return hashlib.sha256(f"{picture.size}".encode() + picture.tobytes()).hexdigest()


_CACHES: dict[int, ResultCache] = {}
_CACHES_LOCK = threading.Lock()


def result_cache_for(max_bytes: int) -> ResultCache | None:
    """The process's result cache of `max_bytes` (every program loaded with that size shares it), None for 0: off."""
    if max_bytes <= 0:
        return None
    with _CACHES_LOCK:
        cache = _CACHES.get(max_bytes)
        if cache is None:
            cache = _CACHES[max_bytes] = ResultCache(max_bytes)
        return cache
