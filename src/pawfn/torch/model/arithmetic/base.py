"""The arithmetic every base's passes run, as one object (`Arithmetic`), and torch's own (`TorchArithmetic`)."""

from __future__ import annotations

import math

import gguf
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from ....core.options import ResolvedNumerics
from ..attention import StepSlots, attend, attend_batched
from ..delta_rule import delta_rule, l2_normalized
from ..families import Architecture
from ..kvcache import KVCache
from ..packed import plain
from ..product import Kept, Product, Storage, StoredProduct
from .tower import TowerArithmetic, rotate_halves

__all__ = ["QKV", "Arithmetic", "TorchArithmetic"]

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Queries [T, heads, D], keys and values [T, KV heads, D] of new rows."""


class Arithmetic:
    """Torch's float arithmetic in the compute dtype (`numerics="native"`): the operations as transformers + peft
    compute them. `LlamaCppArithmetic` overrides what llama.cpp computes otherwise."""

    numerics: ResolvedNumerics = "native"
    row_exact = False
    """Every decode step row by row whatever `batch_invariant` asks (llama.cpp computes each call alone)."""
    keeps_last_row = False
    """The last layer keeps only the rows whose outputs a pass returns, from its attention output on."""
    prefix_granule: int = 1
    """Tokens a whole prompt's cached prefix is a multiple of (`WholePrompt`): 1, or the batch from position 0 whose
    size decides the attention kernel (llama.cpp's flash attention in the official vision runtime: 128)."""

    prefix_tag = ""
    """What a stored prefix's key adds for this arithmetic (`PrefixStore`)."""

    def kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The KV cache's dtype for compute dtype `dtype`."""
        return dtype

    def describe(self, storage: str, device: str) -> str:
        """The engine line (`pawfn bench`, `TorchProgram.engine`) for weights kept as `storage` on `device`."""
        return f"torch numerics ({storage}) on {device}"

    # -- elementwise and norms --------------------------------------------------------------------------------------

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """`x / sqrt(sum(x^2) + eps)` over the last axis (Gated DeltaNet's key and query norm)."""
        return l2_normalized(x, eps)

    # -- Qwen3.5's recurrent layers ---------------------------------------------------------------------------------

    def convolve(self, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """silu of the causal short convolution of the window by time, `window` [K - 1, channels] then `rows` [T,
        channels], by `kernel` [channels, K]: [T, channels]."""
        timeline = torch.cat((window, rows))
        return F.silu((timeline.T.unfold(1, kernel.shape[1], 1) * kernel.unsqueeze(1)).sum(dim=-1).T)

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gated delta rule over T tokens: outputs [T, heads, value] and the memory after them."""
        return delta_rule(q, k, v, beta, decay, memory)

    # -- rotary embeddings ------------------------------------------------------------------------------------------

    def rotation_table(
        self, arch: Architecture, frequencies: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotated/2] of `positions` [T], or of M-RoPE positions [T, 4] (time, row, column, extra:
        each pair of dimensions turns with its section's position, `Architecture.pair_sections`)."""
        if positions.dim() == 2:
            sections = torch.tensor(arch.pair_sections(frequencies.shape[0]), device=positions.device)
            angles = positions.to(torch.float32)[:, sections] * frequencies.unsqueeze(0)
        else:
            angles = positions.to(torch.float32).unsqueeze(1) * frequencies.unsqueeze(0)
        return torch.cos(angles).to(dtype).unsqueeze(1), torch.sin(angles).to(dtype).unsqueeze(1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """NEOX-style rotation of `x` [T, heads, D] (its halves as pairs) by a `rotation_table`."""
        return rotate_halves(x, cos, sin)

    # -- attention --------------------------------------------------------------------------------------------------

    def attend_prompt(
        self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV, batches: list[int], masks: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        """A prompt's rows: store k/v at `slot...`, attend causally; `masks` keeps one pass's causal mask by row count."""
        q, k, v = qkv
        n_new = q.shape[0]
        mask = None
        if n_new > 1:
            mask = masks.get(n_new)
            if mask is None:  # one mask per pass: every layer attends over the same positions
                group, end = arch.n_heads // arch.n_kv_heads, slot + n_new
                query_at = torch.arange(end - n_new, end, device=q.device).unsqueeze(1)
                hidden = torch.arange(0, end, device=q.device).unsqueeze(0) > query_at
                mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, -math.inf).repeat(group, 1)
                masks[n_new] = mask
        return attend(arch, cache, layer, slot, q, k, v, mask)

    def attend_row(self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV) -> torch.Tensor:
        """One decode row alone (row-exact): its k/v stored at `slot`, its query over its own positions and prefix."""
        return attend(arch, cache, layer, slot, *qkv, None)

    def attend_rows(self, arch: Architecture, rows: list[tuple[KVCache, int]], layer: int, qkv: QKV) -> torch.Tensor:
        """Decode rows together in one fused kernel (not row-exact)."""
        return attend_batched(arch, rows, layer, *qkv)

    def attend_each_row(self, arch: Architecture, slots: StepSlots, layer: int, qkv: QKV) -> torch.Tensor:
        """Decode rows (row i's (cache, slot) in `slots`), each attended exactly as `attend_row` attends it alone."""
        q, k, v = qkv
        return torch.cat(
            [self.attend_row(arch, cache, layer, slot, (q[i : i + 1], k[i : i + 1], v[i : i + 1])) for i, (cache, slot) in enumerate(slots.rows)]
        )

    # -- the matrices it multiplies ---------------------------------------------------------------------------------

    def keep(self, storage: Storage[Kept]) -> Kept:
        """A base's matrices or a program's side paths kept as this arithmetic multiplies them: float matrices."""
        return storage.floats()

    def stored_matrix(
        self, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool
    ) -> StoredProduct | None:
        """A GGUF matrix kept in its file's type (its bytes `raw`, `out_features` rows; `base_layer`: a base model's
        layer weight), or None where this arithmetic multiplies float values instead (`float_matrix`)."""
        return None

    def float_matrix(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Product:
        """A matrix of float values `weight` [out, in] (and its `bias`), multiplied in this arithmetic."""
        return plain(weight, bias)

    def tower(self) -> TowerArithmetic:
        """How an image tower computes beside this arithmetic: torch's float32 (with mtmd's GELU)."""
        return TowerArithmetic()


class TorchArithmetic(Arithmetic):
    """Torch's own arithmetic (`numerics="native"`)."""
