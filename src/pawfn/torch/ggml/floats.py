"""F32 and F16 matrices as llama.cpp's CPU backend multiplies them (`numerics="llamacpp"`): a base converted to F32
or F16, and float adapters. ggml keeps an F32 product's inputs in float32 and rounds an F16 product's to f16; two
rows or more take tinyBLAS (one W-lane FMA chain a dot, then the lanes by halves) where the width is a multiple of
W, one row takes `ggml_vec_dot_*` (four such chains). torch's float32 products add in another order: their ulps,
rounded into the f16 cache and into the next quantized product's 8-bit blocks, moved llama.cpp's tokens."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import numpy.typing as npt
import torch

from .c_kernels import NativeKernels

__all__ = ["NativeFloatMatrix", "float_matrix"]


@dataclass
class NativeFloatMatrix:
    """An F32 or F16 `[out, in]` matrix kept in its file's type, multiplied by the C kernels as llama.cpp does."""

    qtype: gguf.GGMLQuantizationType
    """F32 or F16."""
    weight: torch.Tensor
    """float32 [out, in], or (f16) the values' bits as int16 [out, in]."""
    width: int
    """llama.cpp's SIMD width on this CPU (16 with AVX-512, else 8): its dots' lanes."""
    kernels: NativeKernels

    @property
    def out_features(self) -> int:
        """Output width."""
        return int(self.weight.shape[0])

    def all_finite(self) -> bool:
        """No NaN or infinity among the weights."""
        values = self.weight if self.qtype == gguf.GGMLQuantizationType.F32 else self.weight.view(torch.float16)
        return bool(torch.isfinite(values).all())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (tinyBLAS from two rows on)."""
        return self._product(x, tiled=x.shape[0] >= 2)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row dots): a row's result never depends on the others."""
        return self._product(x, tiled=False)

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

    def _product(self, x: torch.Tensor, tiled: bool, into: torch.Tensor | None = None, alpha: float = 0.0) -> torch.Tensor:
        x = x.float()
        if self.qtype == gguf.GGMLQuantizationType.F16:
            x = x.to(torch.float16).float()  # ggml converts the inputs to the weights' type first
        x = x.contiguous()
        rows, width = x.shape
        out = self.out_features
        y = torch.empty((rows, out), dtype=torch.float32) if into is None else into
        tinyblas = tiled and width % self.width == 0  # tinyBLAS takes whole vectors only
        target = (y.data_ptr(), y.stride(0), into is not None, alpha)
        self.kernels.float_product(
            self.weight.data_ptr(), self.qtype == gguf.GGMLQuantizationType.F16, x.data_ptr(), rows, width, out, tinyblas, self.width, target
        )
        return y


def float_matrix(
    kernels: NativeKernels, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, width: int
) -> NativeFloatMatrix | None:
    """A GGUF F32 or F16 matrix (its bytes `raw`, `out_features` rows) on the C `kernels`, or None for another type."""
    if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return None
    data = np.ascontiguousarray(raw).view(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.int16)
    weight = torch.as_tensor(data.reshape(out_features, -1).copy())
    return NativeFloatMatrix(qtype, weight, width, kernels)
