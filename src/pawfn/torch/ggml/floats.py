"""F32, F16 and BF16 matrices as llama.cpp's CPU backend multiplies them (`numerics="llamacpp"`): a base converted
to F32 or F16, float adapters, and an image projector's matrices (mtmd's). ggml keeps an F32 product's inputs in
float32 and rounds an F16 product's to f16 and a BF16 product's to bf16; two rows or more take tinyBLAS (one W-lane
FMA chain a dot, then the lanes by halves; with AVX-512 BF16 one chain of `vdpbf16ps` pairs) where the width is a
multiple of its step, one row takes `ggml_vec_dot_*` (several such chains). torch's float32 products add in another
order: their ulps, rounded into the f16 cache and into the next quantized product's 8-bit blocks, moved llama.cpp's
tokens."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import numpy.typing as npt
import torch

from .c_kernels import NativeKernels
from .float_ops import fma32, ggml_dot_f16, sum_halves
from .hybrid import ggml_dot_f32
from .interface import FloatKind

__all__ = ["NativeFloatMatrix", "float_matrix", "ggml_bf16_dots", "ggml_float_product"]

_FLOAT_KINDS = {gguf.GGMLQuantizationType.F32: FloatKind.F32, gguf.GGMLQuantizationType.F16: FloatKind.F16}


@dataclass
class NativeFloatMatrix:
    """An F32, F16 or BF16 `[out, in]` matrix kept in its file's type, multiplied by the C kernels as llama.cpp does."""

    qtype: gguf.GGMLQuantizationType
    """F32, F16 or BF16."""
    weight: torch.Tensor
    """float32 [out, in], or (f16, bf16) the values' bits as int16 [out, in]."""
    width: int
    """llama.cpp's SIMD width on this CPU (16 with AVX-512, else 8): its dots' lanes."""
    kernels: NativeKernels
    bf16_pairs: bool
    """BF16 weights dotted in `vdpbf16ps` pairs (a CPU with AVX-512 BF16, as its llama.cpp does), else widened."""

    @property
    def out_features(self) -> int:
        """Output width."""
        return int(self.weight.shape[0])

    def all_finite(self) -> bool:
        """No NaN or infinity among the weights."""
        values = {gguf.GGMLQuantizationType.F16: torch.float16, gguf.GGMLQuantizationType.BF16: torch.bfloat16}.get(self.qtype)
        return bool(torch.isfinite(self.weight if values is None else self.weight.view(values)).all())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (tinyBLAS from two rows on)."""
        return self._product(x, tiled=x.shape[0] >= 2)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row dots): a row's result never depends on the others."""
        return self._product(x, tiled=False)

    def biased(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`self(x) + bias` (float32 [out]), the sum rounded after the product as ggml_add adds it, by the kernel as it
        stores each value (no pass of its own over the outputs)."""
        bias = bias.float().contiguous()
        return self._product(x, tiled=x.shape[0] >= 2, bias=bias)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step's rows, all at once."""
        return self(x)

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self(x)`, the product and the scaling rounded apart."""
        self._accumulate(y, x, alpha, tiled=x.shape[0] >= 2)

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self.rows(x)`, the product and the scaling rounded apart."""
        self._accumulate(y, x, alpha, tiled=False)

    def _accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float, tiled: bool) -> None:
        if y.dtype != torch.float32 or y.stride(-1) != 1:
            y += self._product(x, tiled) * torch.tensor(alpha, dtype=torch.float32)
            return
        self._product(x, tiled, into=y, alpha=alpha)

    def _product(
        self, x: torch.Tensor, tiled: bool, into: torch.Tensor | None = None, alpha: float = 0.0, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x.float()
        kind = _FLOAT_KINDS.get(self.qtype)
        if kind is None:  # BF16: ggml rounds the inputs to bf16 (to nearest even), the C kernel takes their bits
            kind = FloatKind.BF16_PAIRS if self.bf16_pairs else FloatKind.BF16_WIDENED
            x = x.to(torch.bfloat16).view(torch.int16)
        elif kind == FloatKind.F16:
            x = x.to(torch.float16).float()  # ggml converts the inputs to the weights' type first
        x = x.contiguous()
        rows, width = x.shape
        out = self.out_features
        y = torch.empty((rows, out), dtype=torch.float32) if into is None else into
        tinyblas = tiled and (kind >= FloatKind.BF16_PAIRS or width % self.width == 0)  # whole vectors only (BF16: checked in C)
        target = (y.data_ptr(), y.stride(0), into is not None, alpha)
        bias_at = 0 if bias is None else bias.data_ptr()
        self.kernels.float_product(self.weight.data_ptr(), kind, x.data_ptr(), rows, width, out, tinyblas, self.width, target, bias_at)
        return y


def float_matrix(
    kernels: NativeKernels, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, width: int, bf16_pairs: bool
) -> NativeFloatMatrix | None:
    """A GGUF F32, F16 or BF16 matrix (its bytes `raw`, `out_features` rows) on the C `kernels`, or None for another
    type; `bf16_pairs`: this CPU's llama.cpp dots BF16 with `vdpbf16ps` (AVX-512 BF16)."""
    if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        return None
    data = np.ascontiguousarray(raw).view(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.int16)
    weight = torch.as_tensor(data.reshape(out_features, -1).copy())
    return NativeFloatMatrix(qtype, weight, width, kernels, bf16_pairs)


def _flushed(x: torch.Tensor) -> torch.Tensor:
    """Values below FLT_MIN in magnitude as zero (`vdpbf16ps`' DAZ and FTZ)."""
    return torch.where(x.abs() < 2.0**-126, torch.zeros_like(x) * x.sign(), x)


def ggml_bf16_dots(x: torch.Tensor, w: torch.Tensor, width: int, pairs: bool, tiled: bool) -> torch.Tensor:
    """x [n, k] and w [out, k], bf16 values as float32, dotted as llama.cpp does on this CPU: [n, out]. `pairs`
    (AVX-512 BF16): `vdpbf16ps` lanes of 16, each adding its odd then its even pair's product by FMA (DAZ, FTZ);
    else FMA chains of `width` lanes. `tiled` (tinyBLAS, k a multiple of its step): one chain a dot, by halves; else
    `ggml_vec_dot_bf16` (two chains, or four with 8 lanes). The C kernel's reference (`dot_bf16_lanes`)."""
    k = x.shape[1]
    step = 32 if pairs else width
    tiled = tiled and k % step == 0
    if tiled and not pairs:
        return _tinyblas_dots(x, w, width)
    chains, per = (1, step) if tiled else ((2, 32 if pairs else 16) if pairs or width == 16 else (4, 8))
    block = chains * per
    whole = k - k % block
    lanes = torch.zeros((chains, x.shape[0], w.shape[0], 16 if pairs else per), dtype=torch.float32)
    for start in range(0, whole, block):
        for chain in range(chains):
            a = x[:, None, start + chain * per : start + (chain + 1) * per]
            b = w[None, :, start + chain * per : start + (chain + 1) * per]
            if pairs:
                for pair in (1, 0):  # the odd product first
                    lanes[chain] = _flushed(fma32(_flushed(a[..., pair::2]), _flushed(b[..., pair::2]), _flushed(lanes[chain])))
            else:
                lanes[chain] = fma32(a, b, lanes[chain])
    if tiled:
        return sum_halves(lanes[0])
    if chains == 4:
        total = sum_halves((lanes[0] + lanes[2]) + (lanes[1] + lanes[3])).double()
    else:
        total = sum_halves(lanes[0]).double() + sum_halves(lanes[1]).double()
    for index in range(whole, k):
        total = total + (x[:, None, index] * w[None, :, index]).double()
    return total.float()


_LANE_VALUES = 1 << 22
"""Lanes (rows x outputs x lanes) one block of an emulated product keeps at once: its float64 steps stay ~100 MB."""


def ggml_float_product(x: torch.Tensor, weight: torch.Tensor, qtype: gguf.GGMLQuantizationType, width: int, bf16_pairs: bool) -> torch.Tensor:
    """`x` [n, in] times a `qtype` (F32, F16 or BF16) matrix `weight` [out, in] (its values as float32) in torch as
    `NativeFloatMatrix` computes it in C: x rounded to the weights' type, tinyBLAS from two rows, `ggml_vec_dot_*`
    for one. [n, out]; slow (a chain of torch steps per `width` values; rows in blocks that bound its memory): the
    reference, and the fallback without a C compiler."""
    tiled = x.shape[0] >= 2  # the whole call's rows decide, as ggml's graph does
    block = max(1, _LANE_VALUES // (weight.shape[0] * 32))
    return torch.cat([_float_dots(x[start : start + block], weight, qtype, width, bf16_pairs, tiled) for start in range(0, x.shape[0], block)])


def _float_dots(x: torch.Tensor, weight: torch.Tensor, qtype: gguf.GGMLQuantizationType, width: int, bf16_pairs: bool, tiled: bool) -> torch.Tensor:
    if qtype == gguf.GGMLQuantizationType.BF16:
        return ggml_bf16_dots(x.to(torch.bfloat16).float(), weight, width, bf16_pairs, tiled)
    if qtype == gguf.GGMLQuantizationType.F16:
        x = x.half().float()
    if not tiled or x.shape[1] % width:
        pairs = (x[:, None, :], weight[None, :, :])
        return ggml_dot_f16(*pairs, one_row=True, width=width) if qtype == gguf.GGMLQuantizationType.F16 else ggml_dot_f32(*pairs, width)
    return _tinyblas_dots(x, weight, width)


def _tinyblas_dots(x: torch.Tensor, w: torch.Tensor, width: int) -> torch.Tensor:
    """x [n, k] . w [out, k] (k a multiple of `width`) as tinyBLAS dots float values: one FMA chain of `width` lanes a
    dot, lane l summing element l of every `width` in order, then the lanes by halves. [n, out]."""
    lanes = torch.zeros((x.shape[0], w.shape[0], width), dtype=torch.float32)
    for start in range(0, x.shape[1], width):
        lanes = fma32(x[:, None, start : start + width], w[None, :, start : start + width], lanes)
    return sum_halves(lanes)
