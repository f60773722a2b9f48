"""GGUF block formats dequantized with torch's vectorized kernels (the official bases' Q6_K and Q8_0).

Bit-exact with the `gguf` package's numpy code, which took ~5.6 s for a Q6_K Qwen3-0.6B here; other types
fall back to it.
"""

from __future__ import annotations

import gguf
import numpy as np
import numpy.typing as npt
import torch

__all__ = ["RowTable", "dequantize", "q6_k_parts"]

_Q6_K_BYTES, _Q8_0_BYTES = 210, 34
_CHUNK_VALUES = 1 << 20  # values decoded at a time, so the temporaries stay small (~4 MB each)


def q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q6_K tensor's `[n, 210]` blocks as signed codes `[n, 16, 16]` (int8, -32..31), sub-block scales `[n, 16]`
    (int8) and block scales `[n]` (float32): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 scales, one f16."""
    n = blocks.shape[0]
    low, high = blocks[:, :128], blocks[:, 128:192]
    low = low.reshape(n, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 1, 2, 1)
    low = (low & 0x0F).reshape(n, 8, 32)
    high = high.reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = (high & 0x03).reshape(n, 8, 32)
    codes = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16)
    scales = blocks[:, 192:208].contiguous().view(torch.int8)
    d = blocks[:, 208:210].contiguous().view(torch.float16).to(torch.float32).reshape(n)
    return codes, scales, d


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """256 values a block: `d * scale` per sub-block of 16, times its codes."""
    codes, scales, d = q6_k_parts(blocks)
    scaled = (d.unsqueeze(1) * scales.to(torch.float32)).unsqueeze(-1)
    return (scaled * codes.to(torch.float32)).reshape(blocks.shape[0], 256)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """32 values a block: one f16 scale, then 32 int8."""
    d = blocks[:, :2].contiguous().view(torch.float16).to(torch.float32)
    return d * blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)


_KERNELS = {gguf.GGMLQuantizationType.Q6_K: (_Q6_K_BYTES, _q6_k), gguf.GGMLQuantizationType.Q8_0: (_Q8_0_BYTES, _q8_0)}


def dequantize(raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> npt.NDArray[np.float32] | None:
    """The float32 values of `raw` (a tensor's bytes) in numpy order `shape`, or None for a type without a kernel here."""
    kernel = _KERNELS.get(qtype)
    if kernel is None:
        return None
    block_bytes, decode = kernel
    blocks = raw.reshape(-1, block_bytes)
    values = np.empty(shape, dtype=np.float32)
    flat = torch.as_tensor(values).reshape(blocks.shape[0], -1)  # shares the array's memory
    step = max(1, _CHUNK_VALUES // flat.shape[1])
    for start in range(0, blocks.shape[0], step):
        chunk = torch.as_tensor(np.array(blocks[start : start + step]))  # a copy: the map is read-only
        flat[start : start + step] = decode(chunk)
    return values


class RowTable:
    """Rows of a GGUF matrix `[rows, cols]` decoded on demand from the file's bytes: an embedding lookup that is
    exact and keeps only the rows it touched in memory."""

    def __init__(self, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, rows: int, cols: int) -> None:
        self._raw = raw.reshape(rows, -1)
        self._qtype = qtype
        self._cols = cols

    @classmethod
    def of(cls, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> RowTable | None:
        """A table over a 2-D tensor of a type decoded here (F32, F16, Q8_0, Q6_K), else None."""
        if len(shape) != 2 or (qtype not in _KERNELS and qtype not in _PLAIN):
            return None
        return cls(raw, qtype, shape[0], shape[1])

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` as float32 `[len(ids), cols]`."""
        chunk = np.array(self._raw[ids.cpu().numpy()])  # a copy: the map is read-only
        plain = _PLAIN.get(self._qtype)
        if plain is not None:
            return torch.as_tensor(chunk.view(plain)).float()
        block_bytes, decode = _KERNELS[self._qtype]
        return decode(torch.as_tensor(chunk).reshape(-1, block_bytes)).reshape(len(chunk), self._cols)


_PLAIN = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16}
