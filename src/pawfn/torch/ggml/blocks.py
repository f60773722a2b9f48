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
multiply-add (the product of two float32 values is exact in float64). Elementwise steps follow GCC's code for
them (it contracts `a*b + c` into FMA), and `cosf`, `sinf` and `powf` are the C library's own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import gguf
import numpy as np
import numpy.typing as npt
import torch

from .dequant import q6_k_parts
from .c_kernels import TILED_MIN_ROWS, NativeKernels, int8_mm, native_rope_table

__all__ = [
    "BlockMatrix",
    "c_math",
    "f32",
    "fma32",
    "sqrtf",
    "sum_accumulators",
    "sum_halves",
    "block_matrix",
    "ggml_attention",
    "ggml_layer_norm",
    "ggml_rms_norm",
    "ggml_rope",
    "ggml_rope_table",
    "ggml_dot_f16",
    "ggml_expf",
    "ggml_gelu",
    "ggml_silu_mul",
    "quantize_q8_0",
    "quantize_q8_k",
]

_PAIR_MASK = (torch.arange(16).unsqueeze(0) // 2 == torch.arange(8).unsqueeze(1)).float()
"""[lane, sub-block]: the one-row Q6_K kernel corrects lane L with sub-blocks 2L and 2L+1."""
_LANE_MASK = (torch.arange(256).unsqueeze(0) % 32 // 4 == torch.arange(8).unsqueeze(1)).to(torch.int8)
"""[lane, element]: a Q6_K block's elements the one-row kernel's lane L sums (offsets 4L..4L+3 of each run of 32)."""
_ATTENTION_VALUES = 1 << 24  # float32 values of elementwise products per attention pass (64 MB)
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

    kind: Literal["q4_0", "q8_0", "q6_k"]
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
        return int(self.lane_weights.shape[2] if self.kind == "q6_k" else self.lane_weights.shape[-1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` for `x` [n, in] evaluated in one graph of n rows (the kernel depends on n for Q6_K)."""
        if self.kind == "q6_k" and x.shape[0] >= TILED_MIN_ROWS:
            return self._q6_k_tiled(x)
        return self.rows(x)  # the repacked Q4_0 kernels (gemm for rows by 4, gemv for the rest) round alike

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every row as if multiplied alone (one-row kernels): a row's result never depends on the others."""
        if self.kind == "q6_k":
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


Q0Kind = Literal["q4_0", "q8_0"]


def q0_codes(raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int) -> tuple[Q0Kind, torch.Tensor, torch.Tensor] | None:
    """A Q4_0 or Q8_0 matrix's kind, signed codes int8 [out, blocks, 32] and block scales float32 [out, blocks] from
    its bytes `raw`; None for another type."""
    if qtype not in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        return None
    data = torch.as_tensor(np.array(raw, dtype=np.uint8).reshape(out_features, -1))
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        blocks = data.reshape(out_features, -1, _Q8_0_BYTES)
        return "q8_0", blocks[:, :, 2:].contiguous().view(torch.int8), _f16(blocks[:, :, :2])
    blocks = data.reshape(out_features, -1, _Q4_0_BYTES)
    packed = blocks[:, :, 2:]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(torch.int8) - 8  # low nibbles first
    return "q4_0", codes.contiguous(), _f16(blocks[:, :, :2])


def repacked_by_llamacpp(kind: str, base_layer: bool, out_features: int) -> bool:
    """Whether llama.cpp repacks this matrix for its x86 kernels (`BlockMatrix.repacked`)."""
    return kind == "q4_0" and base_layer and out_features % 8 == 0


def block_matrix(raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool = False) -> BlockMatrix | None:
    """The codes of a GGUF matrix (its bytes `raw`, `out_features` rows) for the torch emulation, or None for a type
    not emulated here. `base_layer`: a base model's layer weight, which llama.cpp may repack (an adapter's or the
    embeddings' it does not). `native_blocks.native_block_matrix` keeps them for the C kernels."""
    q0 = q0_codes(raw, qtype, out_features)
    if q0 is not None:
        kind, codes, scale = q0
        return BlockMatrix(kind, _q0_lanes(codes.float()), scale, None, repacked_by_llamacpp(kind, base_layer, out_features))
    if qtype == gguf.GGMLQuantizationType.Q6_K:
        data = torch.as_tensor(np.array(raw, dtype=np.uint8).reshape(out_features, -1))
        blocks = data.reshape(out_features, -1, Q6_K_BYTES)
        n_blocks = blocks.shape[1]
        signed, sub_scales, d = q6_k_parts(blocks.reshape(-1, Q6_K_BYTES))
        scale = d.reshape(out_features, n_blocks)
        unsigned = signed.to(torch.int16).reshape(out_features, n_blocks, 256) + 32  # 0..63, as the kernels read them
        sub = sub_scales.reshape(out_features, n_blocks, 16)
        return BlockMatrix("q6_k", _split_weighted(unsigned, sub), scale, sub.to(torch.float32).permute(1, 2, 0).contiguous())
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


def f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def sqrtf(x: torch.Tensor) -> torch.Tensor:
    """`sqrtf`, correctly rounded: torch's float32 sqrt is not always (1 ulp off on this Xeon); from float64 it is."""
    return torch.sqrt(x.double()).float()


def ggml_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`ggml_rms_norm` then `ggml_mul`: squares summed in double, `1/sqrtf(mean + eps)` in float32, `x*scale*w`."""
    mean = ((x * x).double().sum(dim=-1, keepdim=True) / x.shape[-1]).float()
    scale = torch.div(f32(1.0), sqrtf(mean + f32(eps)))
    return x * scale * weight


def ggml_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, lanes: int = 16) -> torch.Tensor:
    """`ggml_norm` then `ggml_mul` and `ggml_add`: the mean from a double sum; the variance from float32 sums of
    `lanes` squares (AVX-512: 16, AVX2: 8, each reduced by halves), added in double."""
    n = x.shape[-1]
    mean = torch.div(x.double().sum(dim=-1, keepdim=True).float(), f32(float(n)))
    centered = x - mean
    squares = centered * centered
    whole = n - n % lanes
    chunks = sum_halves(squares[..., :whole].reshape(*squares.shape[:-1], whole // lanes, lanes))
    total = chunks.double().sum(dim=-1, keepdim=True) + squares[..., whole:].double().sum(dim=-1, keepdim=True)
    variance = (total / n).float()
    scale = torch.div(f32(1.0), sqrtf(variance + f32(eps)))
    return centered * scale * weight + bias


def _rope_step(libm: Libm | None, head_dim: int, base: float) -> torch.Tensor:
    """`s = powf(base, -2/D)`, the C library's (correctly rounded from float64 where none loads)."""
    if libm is None:
        return torch.pow(torch.tensor(base, dtype=torch.float64), -2.0 / head_dim).float()
    return f32(libm.powf(base, -2.0 / head_dim))


def native_rope_table_for(kernels: NativeKernels, positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`ggml_rope_table` with the products and calls in C (the same library's functions), ~100x faster than one
    call at a time; in torch where the C library cannot be loaded."""
    libm = c_math()
    if libm is None:
        return ggml_rope_table(positions, head_dim, base)
    return native_rope_table(kernels, positions, head_dim // 2, float(_rope_step(libm, head_dim, base)))


def ggml_rope_table(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, D/2] as `ggml_rope_cache_init`: angle `p * s**i` by repeated float32 products with
    `s = powf(base, -2/D)`, then `cosf`/`sinf`: the C library's own (llama.cpp calls them; glibc's differ from the
    correctly rounded values on ~1.5% of angles), or correctly rounded from float64 where none can be loaded."""
    libm = c_math()
    step = _rope_step(libm, head_dim, base)
    theta = positions.to(torch.float32).unsqueeze(1)
    angles = [theta]
    for _ in range(head_dim // 2 - 1):
        theta = theta * step
        angles.append(theta)
    table = torch.cat(angles, dim=1)
    if libm is None:
        return torch.cos(table.double()).float().unsqueeze(1), torch.sin(table.double()).float().unsqueeze(1)
    values = [float(v) for v in table.cpu().flatten().numpy()]
    cos = torch.tensor([libm.cosf(v) for v in values], dtype=torch.float32).reshape(table.shape)
    sin = torch.tensor([libm.sinf(v) for v in values], dtype=torch.float32).reshape(table.shape)
    return cos.to(table.device).unsqueeze(1), sin.to(table.device).unsqueeze(1)


def ggml_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`rotate_pairs` (NeoX halves): `x0*cos - x1*sin` and `x0*sin + x1*cos`, the first product of each fused by
    GCC into an FMA with the rounded second."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((fma32(x0, cos, -(x1 * sin)), fma32(x0, sin, x1 * cos)), dim=-1)


class Libm(Protocol):
    def cosf(self, x: float, /) -> float: ...
    def sinf(self, x: float, /) -> float: ...
    def powf(self, x: float, y: float, /) -> float: ...
    def expf(self, x: float, /) -> float: ...
    def logf(self, x: float, /) -> float: ...


@functools.cache
def c_math() -> Libm | None:
    """The C library's float32 `cosf`, `sinf`, `powf`, `expf` and `logf` (what llama.cpp links), or None where none is found."""
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
        for function, arguments in (("cosf", 1), ("sinf", 1), ("powf", 2), ("expf", 1), ("logf", 1)):
            getattr(library, function).restype = ctypes.c_float
            getattr(library, function).argtypes = [ctypes.c_float] * arguments
    except (OSError, AttributeError):
        return None
    return cast(Libm, library)  # ctypes resolves the functions by name at run time: the Protocol names them


def ggml_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, width: int = 16) -> torch.Tensor:
    """llama.cpp's attention without flash attention on an f16 cache: q [n, H, D] (the last n of the cache's L
    positions, causal) over keys/values [KV, L, D] float16. Q is rounded to f16 for the K product; the scores are
    scaled, masked and softmaxed in float32 (`ggml_v_expf`, sums of `width` lanes added in double); the
    probabilities are rounded to f16 for the V product; both products sum as `ggml_dot_f16`. Returns [n, H * D]."""
    n, heads, dim = q.shape
    group = heads // keys.shape[0]
    length = keys.shape[1]
    padded = -(-length // (4 * width)) * (4 * width)  # llama.cpp pads its KV view; masked positions weigh 0
    scale = torch.div(f32(1.0), sqrtf(f32(float(dim))))
    queries = q.half().transpose(0, 1)  # [H, n, D]
    hidden = torch.arange(padded, device=q.device).unsqueeze(0) > torch.arange(length - n, length, device=q.device).unsqueeze(1)
    # heads a pass at a time: the elementwise products of the f16 dots take heads * n * L * D floats
    per_pass = max(1, _ATTENTION_VALUES // max(1, n * padded * dim))
    out = torch.empty((heads, n, dim), dtype=torch.float32, device=q.device)
    for first in range(0, heads, per_pass):
        last = min(heads, first + per_pass)
        shared = torch.arange(first, last, device=q.device) // group  # the KV head of each query head
        k = keys[shared]
        v = torch.zeros((last - first, padded, dim), dtype=torch.float16, device=q.device)
        v[:, :length] = values[shared]
        scores = torch.full((last - first, n, padded), -torch.inf, dtype=torch.float32, device=q.device)
        scores[..., :length] = ggml_dot_f16(queries[first:last].unsqueeze(2), k.unsqueeze(1), one_row=n == 1, width=width)
        scores = (scores * scale).masked_fill(hidden, -torch.inf)
        top = scores.amax(dim=-1, keepdim=True)
        weights = ggml_expf(scores - top, width)
        chunk_sums = sum_halves(weights.reshape(last - first, n, padded // width, width))
        inverse = torch.div(torch.ones((), dtype=torch.float64), chunk_sums.double().sum(dim=-1, keepdim=True)).float()
        probabilities = (weights * inverse).half()  # [heads, n, padded]
        out[first:last] = ggml_dot_f16(probabilities.unsqueeze(2), v.transpose(1, 2).unsqueeze(1), one_row=n == 1, width=width)
    return out.transpose(0, 1).reshape(n, heads * dim)


def _h(literal: str) -> float:
    """A C hexadecimal float literal (ggml's constants)."""
    return float.fromhex(literal)


def fma32(a: torch.Tensor | float, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """float32 fused multiply-add of float32 operands: the exact product plus `c` in float64, then float32 (that
    double rounding differs from one rounding only where the float64 sum lands exactly halfway between two float32
    values, about 2**-29 of sums)."""

    def wide(v: torch.Tensor | float) -> torch.Tensor:
        return v.double() if isinstance(v, torch.Tensor) else torch.tensor(np.float32(v).item(), dtype=torch.float64)

    return (wide(a) * wide(b) + wide(c)).float()


def ggml_expf(x: torch.Tensor, width: int = 16) -> torch.Tensor:
    """`ggml_v_expf`: exp by a range reduction and a degree-5 polynomial in float32 FMAs. Its AVX-512 form
    (`width` 16) scales `1 + p(b)` by `2**n`; its AVX2 form (`width` 8) adds the 1 in the last FMA instead,
    `fma(p(b), 2**n, 2**n)`, and scales the far ranges in two steps: the results round differently."""
    shifter = _h("0x1.8p23")
    z = fma32(x, _h("0x1.715476p+0"), shifter)
    n = z - torch.tensor(shifter, dtype=torch.float32)
    b = fma32(-n, _h("0x1.7f7d1cp-20"), fma32(-n, _h("0x1.62e4p-1"), x))
    u = b * b
    high = fma32(fma32(_h("0x1.0e4020p-7"), b, _h("0x1.573e2ep-5")), u, fma32(_h("0x1.555e66p-3"), b, _h("0x1.fffdb6p-2")))
    if width == 16:
        j = fma32(high, u, fma32(_h("0x1.ffffecp-1"), b, 1.0))
        result = torch.ldexp(j.double(), n.double()).float()
        special = n.abs() > 192
        return torch.where(special, torch.where(n <= 0, torch.zeros_like(x), torch.full_like(x, torch.inf)), result)
    j = fma32(high, u, _h("0x1.ffffecp-1") * b)
    power = torch.ldexp(torch.ones_like(n), n)  # 2**n, exact for |n| <= 126
    near = fma32(j, power, power)
    # |n| > 126: (2**(n - e) * (1 + j), rounded) * 2**e with e = -125 (n <= 0) or 127, rounded again
    shift = torch.where(n <= 0, torch.full_like(n, -125.0), torch.full_like(n, 127.0))
    scaled = torch.ldexp(torch.ones_like(n), n - shift)
    far = (fma32(scaled, j, scaled).double() * torch.ldexp(torch.ones_like(n, dtype=torch.float64), shift.double())).float()
    beyond = torch.where(n <= 0, torch.zeros_like(x), torch.full_like(x, torch.inf))
    return torch.where(n.abs() > 192, beyond, torch.where(n.abs() > 126, far, near))


def sum_halves(lanes: torch.Tensor) -> torch.Tensor:
    """A SIMD register's horizontal sum (last axis): halves added until one lane is left."""
    while lanes.shape[-1] > 1:
        half = lanes.shape[-1] // 2
        lanes = lanes[..., half:] + lanes[..., :half]
    return lanes.squeeze(-1)


def sum_accumulators(acc: torch.Tensor, width: int) -> torch.Tensor:
    """ggml's one-row dots' 4 accumulators of `width` lanes (`acc` [..., 4 * width]) as one sum: added (0+2)+(1+3),
    then the lanes, by halves with AVX-512, by GGML_F32x8_REDUCE with AVX2 (halves to 4, then (a0+a1) + (a2+a3))."""
    parts = acc.reshape(*acc.shape[:-1], 4, width)
    lanes = (parts[..., 0, :] + parts[..., 2, :]) + (parts[..., 1, :] + parts[..., 3, :])
    if width == 16:
        return sum_halves(lanes)
    quarter = lanes[..., :4] + lanes[..., 4:]
    return (quarter[..., 0] + quarter[..., 1]) + (quarter[..., 2] + quarter[..., 3])


def ggml_dot_f16(a: torch.Tensor, b: torch.Tensor, one_row: bool, width: int = 16) -> torch.Tensor:
    """Dot products over the last axis of f16 values `a` [..., K] and `b` [..., K] (broadcast), as llama.cpp sums
    them in float32: llamafile's tinyBLAS for products of 2 rows or more (`width` lanes each summing one element of
    every `width` in order, then the lanes), `ggml_vec_dot_f16` for one row (4 accumulators of `width` lanes, added
    (0+2)+(1+3), then the lanes: by halves with AVX-512, by `hadd` with AVX2; the last K % (4 * width) products
    added to that in double). For two rows or more K must be a multiple of `width`."""
    a, b = a.float(), b.float()  # f16 x f16 is exact in float32: each step adds an exact product, rounded once
    k = a.shape[-1]
    if one_row:
        step = 4 * width
        whole = k - k % step
        first = a[..., :1] * b[..., :1]  # the broadcast shape, one value wide
        acc = torch.zeros((*first.shape[:-1], step), dtype=torch.float32, device=a.device)
        for start in range(0, whole, step):
            acc = torch.addcmul(acc, a[..., start : start + step], b[..., start : start + step])
        reduced = sum_accumulators(acc, width)
        if whole == k:
            return reduced
        leftovers = (a[..., whole:] * b[..., whole:]).double()  # ggml's leftover loop sums in double
        total = reduced.double()
        for index in range(k - whole):
            total = total + leftovers[..., index]
        return total.float()
    acc = a[..., :width] * b[..., :width]
    for start in range(width, k, width):
        acc = torch.addcmul(acc, a[..., start : start + width], b[..., start : start + width])
    return sum_halves(acc)


def ggml_silu_mul(gate: torch.Tensor, up: torch.Tensor, width: int = 16) -> torch.Tensor:
    """`ggml_swiglu`: `gate / (1 + expf(-gate)) * up` with `ggml_v_expf` (`width` float32 lanes)."""
    return torch.div(gate, 1.0 + ggml_expf(-gate, width)) * up


@functools.cache
def ggml_gelu_table() -> torch.Tensor:
    """`ggml_table_gelu_f16`: the tanh GELU of every f16 value (float32 steps, `tanhf` from float64), as f16. GCC
    contracts `1 + a*x*x` into one FMA (its default for C): one entry of the 65536 depends on it."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    c, a = f32(0.79788456080286535587989211986876), f32(0.044715)
    inner = c * values * fma32(a * values, values, 1.0)
    return (0.5 * values * (1.0 + torch.tanh(inner.double()).float())).half().float()


def ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """`ggml_gelu` (GGML_GELU_FP16): 0 at or below -10, x at or above 10, else the table's value at x's f16
    (`native_gelu(kernels, x, ggml_gelu_table())` in C)."""
    index = x.half().view(torch.int16).int() & 0xFFFF  # int32 indices, the where in place: 2.4x the int64 gather's speed
    looked_up = ggml_gelu_table().index_select(0, index.view(-1)).view(x.shape)
    return torch.where(x >= 10.0, x, looked_up).masked_fill_(x <= -10.0, 0.0)
