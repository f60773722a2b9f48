"""An on-disk prefix KV cache in the folder the hub hands over (beside a program in the shared cache), under a
name the official SDK ignores.

A program's prefix is evaluated once per load; with this store, once per (program, base weights, dtype, device).
The file name carries a hash of everything the KV depends on, so a changed base, adapter or template misses, and
so does another version of the code that computes it (a stored prefix from older arithmetic would silently change
tokens).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from pathlib import Path

import torch

from ...core.files import mark_used, write_atomically
from ...core.hashing import file_sha256
from ..model.families import Architecture
from ..model.kvcache import PrefixState

__all__ = ["PrefixStore"]

_FORMAT = 3  # 2: the adapter is keyed by its content; 3: recurrent layers' states


@functools.cache
def _code_digest() -> str:
    """A hash of the Torch backend's sources (this package, its C kernels too): whatever computes a prefix's KV."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent  # the Torch backend, not only this folder
    for source in sorted([*package.rglob("*.py"), *package.rglob("*.c")]):
        digest.update(source.relative_to(package).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _identity(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _content(path: Path) -> str:
    """An adapter by its bytes: a `.paw` is extracted to a new temporary folder at every load."""
    return file_sha256(path)


def _states(stored: object, architecture: Architecture) -> dict[int, tuple[torch.Tensor, ...]] | None:
    """The recurrent layers' states as stored (a layer -> tensors mapping naming each recurrent layer that ran), or
    None when they do not fit the architecture. An empty prefix leaves none to store."""
    if stored is None:
        stored = {}
    if not isinstance(stored, dict):
        return None
    states: dict[int, tuple[torch.Tensor, ...]] = {}
    for layer, tensors in stored.items():  # pyright: ignore[reportUnknownVariableType]  # checked below
        if not isinstance(layer, int) or architecture.attends(layer) or not isinstance(tensors, list):
            return None
        states[layer] = tuple(t for t in tensors if isinstance(t, torch.Tensor))  # pyright: ignore[reportUnknownVariableType]  # filtered by isinstance
    linear = architecture.linear
    if not states:
        return states
    if linear is None or set(states) != set(linear.layers):
        return None
    expected = linear.state_shapes
    if any(tuple(tuple(t.shape) for t in state) != expected for state in states.values()):
        return None
    return states


class PrefixStore:
    """One program's stored prefix for one (base, dtype, device): `<folder>/.pawfn-prefix-<key>.pt`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def in_folder(cls, folder: Path, base: Path, adapter: Path, prefix_ids: list[int], dtype: str, device: str) -> PrefixStore:
        """The store in `folder` for this base, adapter, prefix, dtype and device."""
        identity = {
            "format": _FORMAT,
            "code": _code_digest(),
            "base": _identity(base),
            "adapter": _content(adapter),
            "dtype": dtype,
            "device": torch.device(device).type,
            "prefix": hashlib.sha256(json.dumps(prefix_ids).encode()).hexdigest(),
        }
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
        return cls(folder / f".pawfn-prefix-{key}.pt")

    def load(self, prefix_ids: list[int], architecture: Architecture, device: torch.device) -> PrefixState | None:
        """The stored prefix if present and consistent with `prefix_ids` and the architecture, else None."""
        if not self.path.is_file() or self.path.is_symlink():
            return None
        try:
            data: object = torch.load(self.path, map_location=device, weights_only=True)
        except Exception:  # noqa: BLE001 - any unreadable file is a cache miss, rewritten below
            return None
        if not isinstance(data, dict):
            return None
        token_ids, keys, values, logits, states = (data.get(k) for k in ("token_ids", "keys", "values", "last_logits", "states"))  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]  # checked below
        if token_ids != prefix_ids or not isinstance(keys, list) or not isinstance(values, list):
            return None
        n = architecture.n_layers
        shapes = [(architecture.n_kv_heads, len(prefix_ids) if architecture.attends(layer) else 0, architecture.head_dim) for layer in range(n)]
        tensors: list[torch.Tensor] = [
            t
            for t, shape in zip([*keys, *values], shapes * 2, strict=False)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]  # filtered by isinstance
            if isinstance(t, torch.Tensor) and tuple(t.shape) == shape
        ]
        if len(tensors) != 2 * n or not (logits is None or isinstance(logits, torch.Tensor)):
            return None
        recurrent = _states(states, architecture)  # pyright: ignore[reportUnknownArgumentType]  # checked there
        if recurrent is None:
            return None
        mark_used(self.path)
        return PrefixState(
            token_ids=tuple(prefix_ids),
            keys=tuple(tensors[:n]),
            values=tuple(tensors[n:]),
            last_logits=logits if isinstance(logits, torch.Tensor) else None,
            states=recurrent,
        )

    def save(self, prefix: PrefixState) -> None:
        """Write atomically; a read-only or full cache only costs the next load a prefix evaluation."""
        data = {
            "token_ids": list(prefix.token_ids),
            "keys": [k.cpu() for k in prefix.keys],
            "values": [v.cpu() for v in prefix.values],
            "last_logits": None if prefix.last_logits is None else prefix.last_logits.cpu(),
            "states": {layer: [t.cpu() for t in state] for layer, state in prefix.states.items()},
        }
        with contextlib.suppress(OSError):
            write_atomically(self.path, lambda temporary: torch.save(data, temporary))
