"""What the cache holds besides programs, with sizes: downloaded base models and the files pawfn derives from
them (converted bases, stored prefixes, compiled kernels), which `clear_derived` removes and pawfn rebuilds."""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .cache import PawCache

__all__ = ["CacheFile", "CacheFileKind", "cache_files", "clear_derived", "prune_derived"]

CacheFileKind = Literal["base_model", "converted_base", "prefix", "kernel"]
"""A base model (or a vision runtime's projector) downloaded for the official runtime, or one of pawfn's derived files: a base converted for a
compact mode (``int8``, ``float16``), a program's evaluated prefix, a compiled C kernel library."""

_DERIVED_KINDS: frozenset[CacheFileKind] = frozenset({"converted_base", "prefix", "kernel"})
_DERIVED = ".pawfn-derived"
_LEGACY_KERNELS = "kernels"  # where pawfn before 0.1 compiled its kernels
_PREFIX_GLOB = ".pawfn-prefix*.pt"
_HEADER_LIMIT = 1 << 20  # a safetensors header longer than this is not one pawfn wrote


@dataclass(frozen=True)
class CacheFile:
    """One file of the cache and its size in bytes; `detail` says what a converted base came from."""

    kind: CacheFileKind
    path: Path
    size_bytes: int
    detail: str | None = None
    last_used: float = 0.0
    """Its modification time (seconds since the epoch), which a load that reads a derived file renews."""

    @property
    def derived(self) -> bool:
        """True for files pawfn rebuilds when they are missing (`clear_derived` removes them)."""
        return self.kind in _DERIVED_KINDS


def cache_files(cache: PawCache) -> list[CacheFile]:
    """Base models, then converted bases, stored prefixes and kernels, each group sorted by path."""
    found: list[CacheFile] = []
    if cache.base_models_dir.is_dir():
        found += [_entry("base_model", path) for path in sorted(cache.base_models_dir.iterdir()) if _visible_file(path)]
        by_content = cache.base_models_dir / "sha256"  # a version-2 runtime's base and projector, named by digest
        found += [_entry("base_model", path, "by sha256") for path in _files(by_content, "*.gguf") if _visible_file(path)]
    found += [_entry("converted_base", path, _converted_from(path)) for path in _files(cache.base_derived_dir(), "*.safetensors")]
    prefixes = _files(cache.root / _DERIVED, f"*/{_PREFIX_GLOB}") + _files(cache.programs_dir, f"*/{_PREFIX_GLOB}")
    found += [_entry("prefix", path) for path in sorted(prefixes)]
    kernels = _files(cache.root / _DERIVED / "kernels", "*.so") + _files(cache.root / _LEGACY_KERNELS, "ggml-*.so")
    found += [_entry("kernel", path) for path in kernels]
    return [item for item in found if item.size_bytes >= 0]


def clear_derived(cache: PawCache) -> list[CacheFile]:
    """Delete pawfn's derived files (programs and base models stay); returns what was deleted. A process using one
    keeps its open copy; the next load rebuilds it."""
    removed = [item for item in cache_files(cache) if item.derived]
    for item in removed:
        with contextlib.suppress(FileNotFoundError):
            item.path.unlink()
    shutil.rmtree(cache.root / _DERIVED, ignore_errors=True)  # empty per-bundle folders and interrupted writes too
    legacy = cache.root / _LEGACY_KERNELS
    with contextlib.suppress(OSError):
        legacy.rmdir()  # only when nothing else is left in it
    return removed


def prune_derived(cache: PawCache, max_bytes: int) -> list[CacheFile]:
    """Delete pawfn's derived files, least recently used first (a file's modification time: a load that reads one
    marks it), until they take at most `max_bytes`; returns what was deleted. Under the cache's ``derived`` lock, so
    processes sharing the cache prune one at a time; a process using a deleted file keeps its open copy, and the
    next load rebuilds it."""
    with cache.lock("derived"):
        derived = [item for item in cache_files(cache) if item.derived]
        total = sum(item.size_bytes for item in derived)
        removed: list[CacheFile] = []
        for item in sorted(derived, key=lambda item: item.last_used):
            if total <= max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()
            total -= item.size_bytes
            removed.append(item)
        return removed


def _visible_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and not path.name.startswith(".")


def _files(folder: Path, pattern: str) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.glob(pattern) if path.is_file() and not path.is_symlink())


def _entry(kind: CacheFileKind, path: Path, detail: str | None = None) -> CacheFile:
    try:
        stat = path.stat()
    except OSError:
        return CacheFile(kind, path, -1, detail)  # removed meanwhile: left out
    return CacheFile(kind, path, stat.st_size, detail, stat.st_mtime)


def _converted_from(path: Path) -> str | None:
    """``int8 of /path/to/base.gguf``, read from the identity pawfn wrote in the safetensors header; None if
    the header is not pawfn's."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _HEADER_LIMIT:
                return None
            header = json.loads(handle.read(length))
        identity = json.loads(json.loads(header["__metadata__"]["pawfn"])["identity"])
        return f"{identity['mode']} of {identity['base']}"
    except (OSError, struct.error, ValueError, KeyError, TypeError):
        return None
