"""A sequence's keys and values: a program's evaluated prefix, shared in place, and each sequence's own cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .families import Architecture

__all__ = ["KVCache", "PrefixState"]

_CACHE_GRANULE = 256  # tokens; the KV buffer grows in steps of this size


@dataclass(frozen=True)
class PrefixState:
    """A program's evaluated prompt prefix: its KV per layer (empty in recurrent layers), the recurrent layers' states
    after it and the logits after its last token."""

    token_ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    last_logits: torch.Tensor | None
    states: Mapping[int, tuple[torch.Tensor, ...]] = field(default_factory=dict[int, tuple[torch.Tensor, ...]])
    """Recurrent layer -> its state after the prefix (never changed: each sequence replaces its own copy's entries)."""

    @property
    def length(self) -> int:
        """Prefix length in tokens."""
        return len(self.token_ids)

    def tensors(self) -> list[torch.Tensor]:
        """Its keys, values, logits and recurrent states."""
        logits = [] if self.last_logits is None else [self.last_logits]
        return [*self.keys, *self.values, *logits, *(t for state in self.states.values() for t in state)]


class KVCache:
    """Keys and values of one sequence after its program's prefix: per layer `[n_kv_heads, capacity, head_dim]`, one
    slot per evaluated token after the prefix, grown on demand. The prefix's KV is read where it lies (every
    sequence of a program shares it; nothing is copied per sequence). A token's slot is its position after the
    prefix, plus `shift` once an image (whose tokens outnumber the positions they advance) was stored."""

    def __init__(self, architecture: Architecture, device: torch.device, dtype: torch.dtype) -> None:
        self._arch = architecture
        self._device = device
        self._dtype = dtype
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.prefix: PrefixState | None = None
        """The program's prefix this sequence continues (None: the sequence starts at position 0)."""
        self.states: dict[int, tuple[torch.Tensor, ...]] = {}
        """Recurrent layer -> this sequence's state (a layer not yet run: absent)."""
        self.shift = 0
        """Slots the sequence's images took beyond the positions they advance (M-RoPE: rows x columns tokens for
        max(rows, columns) positions)."""

    @property
    def offset(self) -> int:
        """The first position this cache stores (the prefix's length)."""
        return 0 if self.prefix is None else self.prefix.length

    def begin(self, prefix: PrefixState | None) -> None:
        """Start a new sequence after `prefix` (None: from position 0); what was stored is written over."""
        self.prefix = prefix
        self.states = {} if prefix is None else dict(prefix.states)
        self.shift = 0

    def end(self) -> None:
        """The sequence is over: let go of its prefix and states (an idle slot must not keep an unloaded program's
        prefix alive; its own buffers stay for the next sequence)."""
        self.prefix = None
        self.states = {}
        self.shift = 0

    def slot(self, position: int) -> int:
        """The slot of the token at text `position` (after every image stored so far)."""
        return position - self.offset + self.shift

    def reserve(self, n_tokens: int) -> None:
        """Make room for `n_tokens` slots after the prefix, keeping what is stored."""
        if n_tokens <= self.capacity:
            return
        capacity = -(-n_tokens // _CACHE_GRANULE) * _CACHE_GRANULE
        arch = self._arch
        keys = [self._layer_buffer(layer, capacity) for layer in range(arch.n_layers)]
        values = [self._layer_buffer(layer, capacity) for layer in range(arch.n_layers)]
        for layer in range(len(self.keys)):
            if arch.attends(layer):
                keys[layer][:, : self.capacity] = self.keys[layer]
                values[layer][:, : self.capacity] = self.values[layer]
        self.keys, self.values, self.capacity = keys, values, capacity

    def _layer_buffer(self, layer: int, capacity: int) -> torch.Tensor:
        """Room for `capacity` positions of `layer`'s keys or values (none in a recurrent layer)."""
        arch = self._arch
        length = capacity if arch.attends(layer) else 0
        return torch.empty((arch.n_kv_heads, length, arch.head_dim), device=self._device, dtype=self._dtype)

    def store(self, layer: int, slot: int, keys: torch.Tensor, values: torch.Tensor) -> int:
        """Store `keys`/`values` [new, n_kv_heads, head_dim] of `layer` at slots `slot...`; returns the stored length."""
        end = slot + keys.shape[0]
        self.keys[layer][:, slot:end] = keys.transpose(0, 1)
        self.values[layer][:, slot:end] = values.transpose(0, 1)
        return end
