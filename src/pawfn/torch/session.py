"""One call's decoding state on the Torch backend: its KV cache (a model copy's), position and last logits."""

from __future__ import annotations

import torch

from ..errors import NonFiniteError
from ..options import RuntimeOptions
from .compute import on_compute_thread
from .kvcache import KVCache, PrefixState
from .lora import DeviceAdapter
from .network import StepRow, TorchInterpreter
from .sampling import make_generator, pick_token

__all__ = ["TorchSession"]


class TorchSession:
    """One call on one model copy: the copy's KV cache continues the program's prefix (shared, not copied)."""

    def __init__(self, interpreter: TorchInterpreter, adapter: DeviceAdapter, prefix: PrefixState, cache: KVCache, options: RuntimeOptions) -> None:
        self.interpreter = interpreter
        self.adapter = adapter
        self._cache = cache
        self._options = options
        self._generator = make_generator(options)
        self._position = prefix.length
        self._logits: torch.Tensor | None = prefix.last_logits
        cache.begin(prefix)

    def prefill(self, prompt_ids: list[int]) -> None:
        if prompt_ids:
            self._logits = on_compute_thread(self.interpreter.forward, prompt_ids, self._position, self._cache, self.adapter)
            self._position += len(prompt_ids)

    def sample(self) -> int:
        """The next token from the last logits; `NonFiniteError` if they hold NaN or infinity."""
        logits = self._logits
        assert logits is not None  # a `Decoding` refuses an empty prefix with an empty prompt
        if not bool(torch.isfinite(logits).all()):
            dtype = str(self.interpreter.dtype).removeprefix("torch.")
            raise NonFiniteError(
                self._position,
                f"the base or adapter holds extreme values, or the {dtype} computation overflowed; "
                "load the program with dtype='float32' and check its files",
            )
        return on_compute_thread(pick_token, logits, self._options, self._generator)

    def step_row(self, token: int) -> StepRow:
        """This call's row in a decode step that evaluates `token` next."""
        return StepRow(token, self._position, self._cache, self.adapter)

    def stepped(self, logits: torch.Tensor) -> None:
        """Take this row's logits from a decode step made with `step_row`."""
        self._logits = logits
        self._position += 1
