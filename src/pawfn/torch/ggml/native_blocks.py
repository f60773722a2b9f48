"""GGUF block matrices (Q4_0, Q8_0, Q6_K) kept for the C kernels (`c_kernels`) and multiplied there as llama.cpp's
CPU backend does: the arithmetic of `blocks.BlockMatrix`, bit-identical, at llama.cpp's speed."""

from __future__ import annotations

from dataclasses import dataclass, field

import gguf
import numpy as np
import numpy.typing as npt
import torch

from .blocks import Q6_K_BYTES, q0_codes, repacked_by_llamacpp
from .c_kernels import TILED_MIN_ROWS, pointer
from .interface import Kernel, Out
from .library import NativeKernels, threads_for

__all__ = ["NativeBlockMatrix", "group_by_eights", "join_blocks", "native_block_matrix"]


def native_block_matrix(
    kernels: NativeKernels, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool = False
) -> NativeBlockMatrix | None:
    """`blocks.block_matrix` kept for the C `kernels`: Q4_0/Q8_0 grouped by eight outputs where they can be, Q6_K
    unpacked in C straight from the file's bytes (its map is only read); None for another type."""
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        data = np.ascontiguousarray(raw, dtype=np.uint8)
        n_blocks = data.size // Q6_K_BYTES // out_features
        codes = torch.empty((out_features, n_blocks, 192), dtype=torch.uint8)
        sub = torch.empty((out_features, n_blocks, 16), dtype=torch.int8)
        scale = torch.empty((out_features, n_blocks), dtype=torch.float32)
        kernels.unpack_q6_k(data.ctypes.data, out_features * n_blocks, codes.data_ptr(), sub.data_ptr(), scale.data_ptr())
        amx = base_layer and kernels.amx and out_features % 16 == 0
        return NativeBlockMatrix(gguf.GGMLQuantizationType.Q6_K, codes, scale, sub, kernels, amx=amx)
    q0 = q0_codes(raw, qtype, out_features)
    if q0 is None:
        return None
    qtype, codes, scale = q0
    return group_by_eights(NativeBlockMatrix(qtype, codes, scale, None, kernels, repacked_by_llamacpp(qtype, base_layer, out_features)))


@dataclass
class NativeBlockMatrix:
    """A quantized `[out, in]` GGUF matrix kept as its codes, multiplied by the C kernels as llama.cpp does."""

    qtype: gguf.GGMLQuantizationType
    """Q4_0, Q8_0 or Q6_K."""
    codes: torch.Tensor
    """Q6_K: the blocks' codes as stored (low nibbles, then high bit pairs), uint8 [out, blocks, 192]; Q4_0/Q8_0:
    signed codes int8 [out, blocks, 32], or `grouped` by eight outputs."""
    scale: torch.Tensor
    """Per block f16 scale as float32, [out, blocks] (`grouped`: as float16, [out / 8, blocks, 8])."""
    sub_scales: torch.Tensor | None
    """Q6_K: int8 sub-block scales [out, blocks, 16]."""
    kernels: NativeKernels
    repacked: bool = False
    """A Q4_0 base weight llama.cpp repacks (see `blocks.BlockMatrix.repacked`)."""
    amx: bool = False
    """A Q6_K base matrix whose tiled products run on AMX tiles (CPUs with AMX, outputs a multiple of 16): one C call
    makes each block's weights into tiles from the codes. Elsewhere the tiled kernel reads the codes too (AVX-512
    VNNI or AVX2): no second copy of the weights is kept."""
    grouped: bool = False
    """Q4_0/Q8_0 codes and scales grouped by eight outputs for the `q0_eights` kernels (made by `group_by_eights`):
    Q8_0 codes int8 [out / 8, blocks, 8 lanes, 8 outputs, 4]; Q4_0 codes + 8 as nibbles, uint8 [out / 8, blocks, 4, 32],
    lane 2p in the low and lane 2p + 1 in the high nibbles of row p (the file's 0.5 bytes a weight)."""
    _scales_by_block: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def out_features(self) -> int:
        """Output width."""
        return int(self.codes.shape[0]) * (8 if self.grouped else 1)

    def part(self, first: int, count: int) -> NativeBlockMatrix:
        """Outputs [first, first + count) as views of this matrix's tensors (a grouped one in whole groups of eight)."""
        if self.grouped:
            if first % 8 or count % 8:
                raise ValueError(f"a grouped matrix's part starts and ends at a multiple of 8, not at {first} and {first + count}")
            first, count = first // 8, count // 8
        sub = None if self.sub_scales is None else self.sub_scales[first : first + count]
        return NativeBlockMatrix(
            self.qtype, self.codes[first : first + count], self.scale[first : first + count], sub, self.kernels, self.repacked, self.amx, self.grouped
        )

    def _scale_t(self) -> torch.Tensor:
        """The block scales as [blocks, out], for the tiled epilogue's vectors over outputs."""
        if self._scales_by_block is None:
            self._scales_by_block = self.scale.t().contiguous()
        return self._scales_by_block

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (the kernel depends on n for Q6_K)."""
        return self._product(x, tiled=self.qtype == gguf.GGMLQuantizationType.Q6_K and x.shape[0] >= TILED_MIN_ROWS)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row kernels): a row's result never depends on the others."""
        return self._product(x, tiled=False)

    def all_finite(self) -> bool:
        """No NaN or infinity among the block scales (the codes are integers)."""
        return bool(torch.isfinite(self.scale.float()).all())

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step's rows, all at once."""
        return self(x)

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self(x)`, the product and the scaling rounded apart."""
        self._accumulate(y, x, alpha, tiled=self.qtype == gguf.GGMLQuantizationType.Q6_K and x.shape[0] >= TILED_MIN_ROWS)

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self.rows(x)`, the product and the scaling rounded apart."""
        self._accumulate(y, x, alpha, tiled=False)

    def _accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float, tiled: bool) -> None:
        if tiled and self.amx or y.dtype != torch.float32 or y.stride(-1) != 1:
            y += self._product(x, tiled) * torch.tensor(alpha, dtype=torch.float32)
            return
        self._product(x, tiled, into=y, alpha=alpha)

    def _product(self, x: torch.Tensor, tiled: bool, into: torch.Tensor | None = None, alpha: float = 0.0) -> torch.Tensor:
        """The product, or (`into`) `into += product * alpha` in place, the product and the scaling rounded apart."""
        kernels = self.kernels
        x = x.float().contiguous()
        rows, width = x.shape
        out = self.out_features
        if tiled and self.amx:
            return self._tiled_amx(kernels, x)
        y = torch.empty((rows, out), dtype=torch.float32) if into is None else into
        sub = self.sub_scales if self.sub_scales is not None else self.scale  # Q4_0/Q8_0: the grouped kernels' scales
        if self.qtype == gguf.GGMLQuantizationType.Q6_K:
            kernel = Kernel.Q6_K_TILED if tiled else Kernel.Q6_K_ROWS
        elif self.repacked:
            kernel = Kernel.Q4_0_REPACKED
        elif self.grouped:
            kernel = Kernel.Q4_0_EIGHTS if self.qtype == gguf.GGMLQuantizationType.Q4_0 else Kernel.Q0_EIGHTS
        else:
            kernel = Kernel.Q0_ROWS
        target = Out(y.data_ptr(), y.stride(0), into is not None, alpha)
        kernels.block_product(
            kernel, pointer(x), rows, width, pointer(self.codes), pointer(sub), pointer(self.scale), out, target, rows * out * width
        )
        return y

    def _tiled_amx(self, kernels: NativeKernels, x: torch.Tensor) -> torch.Tensor:
        """The tiled Q6_K kernel in one C call on AMX tiles (`amx`)."""
        rows, width = x.shape
        out = self.out_features
        y = torch.empty((rows, out), dtype=torch.float32)
        assert self.sub_scales is not None
        kernels.q6_k_amx_product(
            pointer(x),
            rows,
            width,
            pointer(self.codes),
            pointer(self.sub_scales),
            pointer(self._scale_t()),
            out,
            pointer(y),
            threads_for(out // 16, rows * out * width),
        )
        return y


def join_blocks(parts: list[NativeBlockMatrix]) -> NativeBlockMatrix | None:
    """Matrices that read the same input joined by output rows, or None where their kinds or widths differ. Exact:
    every kernel here computes each output on its own, so a joined product equals its parts side by side."""
    first = parts[0]
    alike = all(
        part.qtype == first.qtype
        and part.repacked == first.repacked
        and part.codes.shape[1:] == first.codes.shape[1:]
        and (part.sub_scales is None) == (first.sub_scales is None)
        and part.amx == first.amx
        and part.grouped == first.grouped
        for part in parts
    )
    if not alike:
        return None
    sub = None if first.sub_scales is None else torch.cat([p.sub_scales for p in parts if p.sub_scales is not None])
    codes, scale = torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts])
    return NativeBlockMatrix(first.qtype, codes, scale, sub, first.kernels, first.repacked, first.amx, first.grouped)


def group_by_eights(matrix: NativeBlockMatrix) -> NativeBlockMatrix:
    """A Q4_0/Q8_0 matrix (not repacked, outputs a multiple of 8) grouped for the `q0_eights` kernels, in place of its
    rows (one copy of the codes, never both); others as they are."""
    out, blocks = matrix.codes.shape[0], matrix.codes.shape[1]
    if matrix.qtype == gguf.GGMLQuantizationType.Q6_K or matrix.repacked or matrix.grouped or out % 8 != 0:
        return matrix
    codes = matrix.codes.reshape(out // 8, 8, blocks, 8, 4).permute(0, 2, 3, 1, 4).contiguous()  # [g, b, lane, output, 4]
    if matrix.qtype == gguf.GGMLQuantizationType.Q4_0:
        nibbles = (codes + 8).to(torch.uint8).reshape(out // 8, blocks, 4, 2, 32)
        codes = nibbles[:, :, :, 0] | (nibbles[:, :, :, 1] << 4)
    scale = matrix.scale.reshape(out // 8, 8, blocks).transpose(1, 2).to(torch.float16).contiguous()  # the file's f16: exact
    return NativeBlockMatrix(matrix.qtype, codes, scale, None, matrix.kernels, False, False, True)
