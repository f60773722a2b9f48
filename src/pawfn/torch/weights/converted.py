"""Converted base weights in the shared cache: what a compact mode derives from a base (`kernels.compress`'s
stored forms and the float32 vectors) is written once, so a later process skips dequantizing and compressing.

`<folder>/<place>-<key>.safetensors`: a hash of the base file's path and the mode, then one of its identity
(path, size, mtime, mode); writing a new version removes the earlier ones of the same place. Each
tensor's CRC-32 is in the file's metadata and checked when the tensor is read, so a corrupt, truncated or stale
file is detected, deleted and rebuilt, never used. Each tensor is read through its own short-lived map, so the
process's memory holds the packed matrices, not the file as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import zlib
from collections.abc import Mapping
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ...core.files import mark_used, write_atomically

__all__ = ["ConvertedStore", "CorruptStoreError", "StoredWeights"]

_FORMAT = 1
_METADATA_KEY = "pawfn"


class _Metadata(BaseModel):
    """What the file's safetensors metadata holds: the identity it was written for, each tensor's CRC-32."""

    model_config = ConfigDict(extra="forbid", strict=True)

    identity: str
    crc32: dict[str, int]


def _digest(fields: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(dict(fields), sort_keys=True).encode()).hexdigest()[:24]


class CorruptStoreError(Exception):
    """A converted-weights file that cannot be trusted (internal: the loader rebuilds it)."""


def _crc(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.contiguous().view(torch.uint8).reshape(-1).numpy().data)


class StoredWeights:
    """The tensors of one readable converted-weights file; `get` reads and checks one tensor."""

    def __init__(self, path: Path, checksums: Mapping[str, int]) -> None:
        self._path = path
        self._checksums = dict(checksums)

    def names(self) -> set[str]:
        """Every stored tensor's name."""
        return set(self._checksums)

    def get(self, name: str) -> torch.Tensor:
        """Tensor `name` (backed by the file until dropped); raises `CorruptStoreError` on any mismatch."""
        expected = self._checksums.get(name)
        if expected is None:
            raise CorruptStoreError(f"{self._path} lacks {name}")
        try:
            with safe_open(str(self._path), framework="pt") as handle:
                tensor = handle.get_tensor(name)
        except (OSError, SafetensorError) as exc:
            raise CorruptStoreError(f"{self._path}: {exc}") from exc
        if _crc(tensor) != expected:
            raise CorruptStoreError(f"{self._path}: {name} fails its checksum")
        return tensor


class ConvertedStore:
    """One base's converted weights for one mode."""

    def __init__(self, path: Path, identity: Mapping[str, object]) -> None:
        self.path = path
        """`<folder>/<base path and mode>-<their identity>.safetensors`."""
        self._identity = json.dumps(dict(identity), sort_keys=True)

    @classmethod
    def for_base(cls, folder: Path, base: Path, mode: str) -> ConvertedStore:
        """The store in `folder` for base file (or folder) `base` in `mode` (e.g. ``int8``)."""
        stat = base.stat()
        place = {"format": _FORMAT, "base": str(base.resolve()), "mode": mode}
        identity = {**place, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        return cls(folder / f"{_digest(place)}-{_digest(identity)}.safetensors", identity)

    def open(self) -> StoredWeights | None:
        """The stored weights if the file exists and was written for this identity, else None."""
        if not self.path.is_file() or self.path.is_symlink():
            return None
        try:
            with safe_open(str(self.path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                names = set(handle.keys())
            stored = _Metadata.model_validate_json(metadata.get(_METADATA_KEY, "null"))
        except (OSError, SafetensorError, ValidationError):
            self.discard()
            return None
        if stored.identity != self._identity or set(stored.crc32) != names:
            self.discard()
            return None
        mark_used(self.path)
        return StoredWeights(self.path, stored.crc32)

    def save(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write atomically; a read-only or full cache only costs the next process a conversion."""
        contiguous = {name: tensor.contiguous() for name, tensor in tensors.items()}
        checksums = {name: _crc(tensor) for name, tensor in contiguous.items()}
        metadata = {_METADATA_KEY: _Metadata(identity=self._identity, crc32=checksums).model_dump_json()}
        try:
            write_atomically(self.path, lambda temporary: save_file(contiguous, temporary, metadata=metadata))
        except (OSError, SafetensorError):
            return
        self._remove_older()

    def _remove_older(self) -> None:
        """Delete the files written for earlier versions of this base file in this mode (a base replaced in
        place, e.g. downloaded again): each is as large as the converted weights."""
        place = self.path.name.split("-", 1)[0]
        for older in self.path.parent.glob(f"{place}-*.safetensors"):
            if older != self.path:
                with contextlib.suppress(OSError):
                    older.unlink()

    def discard(self) -> None:
        """Delete the file (a corrupt or stale one)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
