"""llama.cpp's CPU arithmetic on GGUF block weights, in torch: the `numerics="llamacpp"` mode.

Read from ggml's CPU sources (llama-cpp-python 0.3.36's vendored llama.cpp, x86 with AVX2 or AVX-512):

- A product with quantized weights first quantizes the activations to the weight type's partner: Q8_K blocks
  of 256 for K-quants (`quantize_row_q8_K_ref`: the first value of largest magnitude maps to -127, scale
  `1/iscale` in float32), Q8_0 blocks of 32 for Q4_0/Q8_0 (`quantize_row_q8_0`: scale `amax/127` stored as f16,
  values `round(x * (127/amax))`). Integer products are exact; only the float steps after them round.
- Q4_0 and Q8_0 weights (`ggml_vec_dot_q*_0_q8_0` for one row, llamafile's `tinyBLAS_Q0_AVX` for more, the
  same arithmetic): per block of 32, eight int32 lanes each sum 4 consecutive products; each lane accumulates
  `fma(d_w * d_x, lane, acc)` over the blocks in order; the 8 lanes are then summed pairwise
  (`(l0+l4, l1+l5, l2+l6, l3+l7)`, then `(a0+a2, a1+a3)`, then their sum).
- Q4_0 base weights with out features a multiple of 8 are repacked at load (`block_q4_0x8`, the default extra
  buffer type) and multiplied by `ggml_gemm/gemv_q4_0_8x8_q8_0`: per block the exact integer sum `s`, then
  `acc = fma(float(s), d_w * d_x, acc)` over the blocks in order. Adapters' Q4_0 halves are not repacked.
- Q6_K weights, fewer than 8 rows (`ggml_vec_dot_q6_K_q8_K`, decode steps and short prompts): per block of
  256, lane L sums `code * scale * x` over the elements at offsets 4L..4L+3 of every 32 with the codes unsigned
  (0..63), less `32 * (bsum[2L] * scale[2L] + bsum[2L+1] * scale[2L+1])`; then as above with `d_x * d_w`.
- Q6_K weights, 8 rows or more (ggml's tiled K-quant kernel, on by default): per block the exact integer sum
  `s`, then `acc = fma(float(s) * d_w, d_x, acc)` over the blocks in order (the AVX2 path writes the FMA; the
  AVX-512 VNNI path writes a multiply and an add, which GCC contracts into one).

Every float step is emulated in float32, or in float64 rounded once to float32 where the CPU fuses a
multiply-add (the product of two float32 values is exact in float64): `float_ops.fma32`. The float operations around the
products (norms, rotary tables, activations, attention) are in `float_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
import numpy.typing as npt
import torch

from .dequant import q6_k_parts
from .c_kernels import TILED_MIN_ROWS, int8_mm
from .float_ops import fma32, sum_halves

__all__ = ["BlockMatrix", "block_matrix", "q0_codes", "quantize_q8_0", "quantize_q8_k", "repacked_by_llamacpp"]

_PAIR_MASK = (torch.arange(16).unsqueeze(0) // 2 == torch.arange(8).unsqueeze(1)).float()
"""[lane, sub-block]: the one-row Q6_K kernel corrects lane L with sub-blocks 2L and 2L+1."""
_LANE_MASK = (torch.arange(256).unsqueeze(0) % 32 // 4 == torch.arange(8).unsqueeze(1)).to(torch.int8)
"""[lane, element]: a Q6_K block's elements the one-row kernel's lane L sums (offsets 4L..4L+3 of each run of 32)."""
Q6_K_BYTES, _Q8_0_BYTES, _Q4_0_BYTES = 210, 34, 18
_LANES = 8


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [n, k] as Q8_0: codes [n, k/32, 32] (float32 integers) and scales [n, k/32] (f16 values, as float32)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(dim=-1)
    scale = torch.div(amax, torch.full_like(amax, 127.0)).half().float()
    inverse = torch.where(amax != 0, torch.div(torch.full_like(amax, 127.0), amax), torch.zeros_like(amax))
    codes = torch.round(blocks * inverse.unsqueeze(-1))
    return codes, scale


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`x` [n, k] as Q8_K: codes [n, k/256, 256], scales [n, k/256] (float32) and code sums per 16 [n, k/256, 16]."""
    blocks = x.reshape(x.shape[0], -1, 256)
    first_largest = blocks.abs().argmax(dim=-1, keepdim=True)  # argmax keeps the first, like the strict `>` scan
    signed_max = torch.gather(blocks, -1, first_largest).squeeze(-1)
    zero = signed_max == 0
    iscale = torch.div(torch.full_like(signed_max, -127.0), torch.where(zero, torch.ones_like(signed_max), signed_max))
    codes = torch.round(blocks * iscale.unsqueeze(-1)).clamp_(max=127.0)
    codes = torch.where(zero.unsqueeze(-1), torch.zeros_like(codes), codes)
    scale = torch.where(zero, torch.zeros_like(iscale), torch.div(torch.ones_like(iscale), iscale))
    sums = codes.reshape(codes.shape[0], codes.shape[1], 16, 16).sum(dim=-1)
    return codes, scale, sums


@dataclass
class BlockMatrix:
    """A quantized `[out, in]` GGUF matrix kept as its codes, multiplied as llama.cpp's CPU backend does."""

    qtype: gguf.GGMLQuantizationType
    """Q4_0, Q8_0 or Q6_K."""
    lane_weights: torch.Tensor
    """Q4_0/Q8_0: codes grouped by lane, [in/4 lane groups, 4, out] float32 integers. Q6_K: each unsigned code
    (0..63) times its sub-block scale, split as `64 * high + low` into int8 [2, blocks, out, 256], each block's
    [out, 256] contiguous for `torch._int_mm`."""
    scale: torch.Tensor
    """Per block f16 scale as float32, [out, blocks]."""
    sub_scales: torch.Tensor | None
    """Q6_K: the int8 sub-block scales as float32, [blocks, 16, out]."""
    repacked: bool = False
    """Q4_0 base weights that llama.cpp repacks for its x86 kernels (`block_q4_0x8`, out features a multiple of 8):
    whole-block integer sums, each added by `fma(float(sum), d_w * d_x, acc)`."""

    @property
    def out_features(self) -> int:
        """Output width."""
        return int(self.lane_weights.shape[2] if self.qtype == gguf.GGMLQuantizationType.Q6_K else self.lane_weights.shape[-1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (the kernel depends on n for Q6_K)."""
        if self.qtype == gguf.GGMLQuantizationType.Q6_K and x.shape[0] >= TILED_MIN_ROWS:
            return self._q6_k_tiled(x)
        return self.rows(x)  # the repacked Q4_0 kernels (gemm for rows by 4, gemv for the rest) round alike

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row kernels): a row's result never depends on the others."""
        if self.qtype == gguf.GGMLQuantizationType.Q6_K:
            return self._q6_k_rows(x)
        if self.repacked:
            return self._q4_0_repacked(x)
        return self._q0_rows(x)

    def _q0_lanes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` as Q8_0 times the Q4_0/Q8_0 codes: the activation scales [n, blocks] and every block's 8 lane sums of
        4 products, [blocks, 8, n, out] (exact: 4 products of |code| <= 127)."""
        n, out = x.shape[0], self.out_features
        codes, x_scale = quantize_q8_0(x.float())
        blocks = codes.shape[1]
        groups = codes.reshape(n, blocks * _LANES, 4).transpose(0, 1)  # [lanes, n, 4]
        return x_scale, torch.bmm(groups, self.lane_weights).reshape(blocks, _LANES, n, out)

    def _block_scales(self, x_scale: torch.Tensor) -> torch.Tensor:
        """`d_x * d_w` per block, input row and output, [blocks, n, out]: one float32 rounding."""
        return x_scale.t().unsqueeze(-1) * self.scale.t().unsqueeze(1)

    def _q4_0_repacked(self, x: torch.Tensor) -> torch.Tensor:
        x_scale, lanes = self._q0_lanes(x)
        sums = lanes.sum(dim=1)  # [blocks, n, out], exact: |sum| <= 32 * 8 * 127
        return _fma_chain(sums, self._block_scales(x_scale))

    def _q0_rows(self, x: torch.Tensor) -> torch.Tensor:
        x_scale, lanes = self._q0_lanes(x)
        return self._sum_lanes(x_scale, lanes.permute(0, 2, 3, 1))  # [blocks, n, out, 8]

    def _sum_lanes(self, x_scale: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
        """The one-row kernels' float steps: each of the 8 lanes [blocks, n, out, 8] accumulates
        `fma(d_x * d_w, lane, acc)` over the blocks in order; then the lanes are summed (hsum_float_8)."""
        return sum_halves(_fma_chain(self._block_scales(x_scale).unsqueeze(-1), lanes))

    def _block_sums(self, block: int, codes: torch.Tensor) -> torch.Tensor:
        """`codes` [m, 256] (int8) times block `block` of every row: exact int32 [m, out] (int8 products summed in
        int32 by `torch._int_mm`, the split weight's two halves joined in int32)."""
        high = int8_mm(codes, self.lane_weights[0, block].t())
        low = int8_mm(codes, self.lane_weights[1, block].t())
        return high * 64 + low

    def _q6_k_rows(self, x: torch.Tensor) -> torch.Tensor:
        n, out = x.shape[0], self.out_features
        codes, x_scale, sums = quantize_q8_k(x.float())
        blocks = codes.shape[1]
        # lane L of a block holds offsets 4L..4L+3 of each of its 8 runs of 32: one row per lane, zeros elsewhere
        spread = (codes.to(torch.int8).unsqueeze(2) * _LANE_MASK.to(x.device)).reshape(n, blocks, _LANES * 256)
        unsigned = torch.stack(
            [self._block_sums(block, spread[:, block].reshape(n * _LANES, 256)).reshape(n, _LANES, out) for block in range(blocks)]
        )  # [blocks, n, 8, out]: each lane's sum of unsigned code * scale * x
        # the kernel then takes 32 * (bsum[2L]*scale[2L] + bsum[2L+1]*scale[2L+1]) from lane L
        pairs = sums.transpose(0, 1).unsqueeze(2) * _PAIR_MASK.to(x.device)  # [blocks, n, 8, 16]
        terms = self._times_sub_scales(pairs.reshape(blocks, n * _LANES, 16)).reshape(blocks, n, _LANES, out)
        lanes = unsigned - 32 * terms.to(torch.int32)
        return self._sum_lanes(x_scale, lanes.transpose(2, 3).float())  # int32 lanes, then cvtepi32_ps

    def _times_sub_scales(self, weights: torch.Tensor) -> torch.Tensor:
        """[blocks, m, 16] integers times each block's sub-block scales: [blocks, m, out], exact (below 2**23)."""
        if self.sub_scales is None:
            raise ValueError("a Q6_K matrix needs its sub-block scales")
        return torch.bmm(weights, self.sub_scales)

    def _q6_k_tiled(self, x: torch.Tensor) -> torch.Tensor:
        codes, x_scale, sums = quantize_q8_k(x.float())
        codes = codes.to(torch.int8)
        # the exact block sums of signed codes: the unsigned ones less 32 * sum over sub-blocks of bsum * scale
        offsets = 32 * self._times_sub_scales(sums.transpose(0, 1).contiguous()).to(torch.int32)  # [blocks, n, out]
        acc = torch.zeros((x.shape[0], self.out_features), dtype=torch.float32, device=x.device)
        for block in range(codes.shape[1]):
            exact = self._block_sums(block, codes[:, block]) - offsets[block]
            acc = fma32(exact.float() * self.scale[:, block].unsqueeze(0), x_scale[:, block : block + 1], acc)
        return acc

    def all_finite(self) -> bool:
        """No NaN or infinity among the block scales (the codes are integers)."""
        return bool(torch.isfinite(self.scale.float()).all())

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step's rows, all at once."""
        return self(x)

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self(x)`, the product and the scaling rounded apart."""
        y += self(x) * torch.tensor(alpha, dtype=torch.float32)

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self.rows(x)`, the product and the scaling rounded apart."""
        y += self.rows(x) * torch.tensor(alpha, dtype=torch.float32)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).float().squeeze(-1).contiguous()


def q0_codes(
    raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int
) -> tuple[gguf.GGMLQuantizationType, torch.Tensor, torch.Tensor] | None:
    """A Q4_0 or Q8_0 matrix's type, signed codes int8 [out, blocks, 32] and block scales float32 [out, blocks] from
    its bytes `raw`; None for another type."""
    if qtype not in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        return None
    data = torch.as_tensor(np.array(raw, dtype=np.uint8).reshape(out_features, -1))
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        blocks = data.reshape(out_features, -1, _Q8_0_BYTES)
        return gguf.GGMLQuantizationType.Q8_0, blocks[:, :, 2:].contiguous().view(torch.int8), _f16(blocks[:, :, :2])
    blocks = data.reshape(out_features, -1, _Q4_0_BYTES)
    packed = blocks[:, :, 2:]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(torch.int8) - 8  # low nibbles first
    return gguf.GGMLQuantizationType.Q4_0, codes.contiguous(), _f16(blocks[:, :, :2])


def repacked_by_llamacpp(qtype: gguf.GGMLQuantizationType, base_layer: bool, out_features: int) -> bool:
    """Whether llama.cpp repacks this matrix for its x86 kernels (`BlockMatrix.repacked`)."""
    return qtype == gguf.GGMLQuantizationType.Q4_0 and base_layer and out_features % 8 == 0


def block_matrix(raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool = False) -> BlockMatrix | None:
    """The codes of a GGUF matrix (its bytes `raw`, `out_features` rows) for the torch emulation, or None for a type
    not emulated here. `base_layer`: a base model's layer weight, which llama.cpp may repack (an adapter's or the
    embeddings' it does not). `native_blocks.native_block_matrix` keeps them for the C kernels."""
    q0 = q0_codes(raw, qtype, out_features)
    if q0 is not None:
        qtype, codes, scale = q0
        return BlockMatrix(qtype, _q0_lanes(codes.float()), scale, None, repacked_by_llamacpp(qtype, base_layer, out_features))
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        data = torch.as_tensor(np.array(raw, dtype=np.uint8).reshape(out_features, -1))
        blocks = data.reshape(out_features, -1, Q6_K_BYTES)
        n_blocks = blocks.shape[1]
        signed, sub_scales, d = q6_k_parts(blocks.reshape(-1, Q6_K_BYTES))
        scale = d.reshape(out_features, n_blocks)
        unsigned = signed.to(torch.int16).reshape(out_features, n_blocks, 256) + 32  # 0..63, as the kernels read them
        sub = sub_scales.reshape(out_features, n_blocks, 16)
        return BlockMatrix(gguf.GGMLQuantizationType.Q6_K, _split_weighted(unsigned, sub), scale, sub.to(torch.float32).permute(1, 2, 0).contiguous())
    return None


def _split_weighted(unsigned: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Unsigned Q6_K codes [out, blocks, 256] (0..63) times their sub-block scales [out, blocks, 16] (-8064..8001) as
    `64 * high + low`, int8 [2, blocks, out, 256] (high -126..125, low 0..63), each block's [out, 256] contiguous for
    `torch._int_mm`."""
    out_features, n_blocks = unsigned.shape[0], unsigned.shape[1]
    weighted = (unsigned.to(torch.int16).reshape(out_features, n_blocks, 16, 16) * sub.to(torch.int16).unsqueeze(-1)).reshape(
        out_features, n_blocks, 256
    )
    halves = torch.stack([weighted >> 6, weighted & 63])  # an arithmetic shift: floor division by 64
    return halves.to(torch.int8).transpose(1, 2).contiguous()


def _fma_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`acc = fma(a[i], b[i], acc)` over the first axis from `acc = 0` (broadcast otherwise), rounded to float32 at
    each step as the kernels' FMA: the products exact in float64, the sequential sums in numpy (the mode runs on
    the CPU, and numpy's per-call cost is a fraction of torch's on these small arrays)."""
    first = a[0] * b[0]  # fma(a, b, 0): the product rounded once
    if a.shape[0] == 1:
        return first
    products = (a[1:].double() * b[1:].double()).contiguous().numpy()
    acc = first.double().numpy()
    for step in products:
        acc = (step + acc).astype(np.float32).astype(np.float64)
    return torch.as_tensor(acc.astype(np.float32))


def _q0_lanes(codes: torch.Tensor) -> torch.Tensor:
    """[out, blocks, 32] codes as [blocks * 8 lanes, 4, out]."""
    out, blocks = codes.shape[0], codes.shape[1]
    return codes.reshape(out, blocks * _LANES, 4).permute(1, 2, 0).contiguous()
