"""Rotary embeddings' tables and rotations: torch's float32 arithmetic, or llama.cpp's (`numerics="llamacpp"`)."""

from __future__ import annotations

import torch

from ..errors import BaseModelError
from .ggml import ggml_rope, ggml_rope_table
from .ggml_hybrid import ggml_mrope_table
from .ggml_native import native_rope
from .loading import LoadedBase

__all__ = ["rotate", "rotation_table"]


def rotation_table(interpreter: LoadedBase, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, rotated/2] of `positions` [T], or of M-RoPE positions [T, 4] (time, row, column, extra:
    each pair of dimensions turns with its section's position, `Architecture.pair_sections`)."""
    arch, frequencies = interpreter.architecture, interpreter.rope_frequencies
    if frequencies is None:
        raise BaseModelError(None, f"family {arch.family!r} has no rotary embedding")
    rotated, llamacpp = arch.rope_dims or arch.head_dim, interpreter.numerics == "llamacpp"
    if positions.dim() == 2 and llamacpp:
        return ggml_mrope_table(positions, rotated, arch.rope_theta, arch.pair_sections(rotated // 2))
    if positions.dim() == 2:
        sections = torch.tensor(arch.pair_sections(frequencies.shape[0]), device=positions.device)
        angles = positions.to(torch.float32)[:, sections] * frequencies.unsqueeze(0)
        return torch.cos(angles).to(dtype).unsqueeze(1), torch.sin(angles).to(dtype).unsqueeze(1)
    if llamacpp:
        return ggml_rope_table(positions, rotated, arch.rope_theta)
    angles = positions.to(torch.float32).unsqueeze(1) * frequencies.unsqueeze(0)
    return torch.cos(angles).to(dtype).unsqueeze(1), torch.sin(angles).to(dtype).unsqueeze(1)


def rotate(interpreter: LoadedBase, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX-style rotation of `x` [T, heads, D] (its halves as pairs) by a `rotation_table`."""
    if interpreter.numerics == "llamacpp":
        kernels = interpreter.ggml_kernels
        if kernels is not None and x.dim() == 3 and cos.shape[0] == x.shape[0]:
            return native_rope(kernels, x, cos, sin)
        return ggml_rope(x, cos, sin)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
