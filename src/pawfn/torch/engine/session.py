"""One call's decoding state on the Torch backend: the KV slot's cache it continues, its position and its
sampler."""

from __future__ import annotations

import torch

from ...core.options import RuntimeOptions
from ..model.kvcache import KVCache, PrefixState
from ..weights.lora import DeviceAdapter
from .network import StepRow
from .sampling import make_generator

__all__ = ["TorchSession"]


class TorchSession:
    """One call on one KV slot: the slot's cache continues the program's prefix (shared, not copied)."""

    def __init__(self, adapter: DeviceAdapter, prefix: PrefixState, cache: KVCache, options: RuntimeOptions) -> None:
        self.adapter = adapter
        self.cache = cache
        self.options = options
        self.generator: torch.Generator | None = make_generator(options)
        """The call's own sampler (None: greedy)."""
        self.position = prefix.length
        """Where the next evaluated token goes."""
        cache.begin(prefix)

    def step_row(self, token: int) -> StepRow:
        """This call's row in a decode step that evaluates `token` next."""
        return StepRow(token, self.position, self.cache, self.adapter)
