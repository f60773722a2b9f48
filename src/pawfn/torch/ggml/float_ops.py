"""llama.cpp's CPU float operations in torch, beside its block products (`blocks`): the float32 steps GCC compiles
(`fma32` for a contracted multiply-add, `sum_halves` for a vector's lanes), `expf` on whole vectors, the C
library's `cosf`/`sinf`/`powf` (`c_math`), RMS and layer norms, rotary tables and rotation, the f16 GELU table,
SwiGLU, f16 dots and the attention of llama.cpp's non-flash path on its f16 cache. Each is the torch reference
of a C kernel (`c_kernels`) and the fallback where those do not build.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Protocol, cast

import numpy as np
import torch

from .c_kernels import native_rope_table
from .library import NativeKernels

__all__ = [
    "Libm",
    "c_math",
    "f32",
    "fma32",
    "ggml_attention",
    "ggml_dot_f16",
    "ggml_expf",
    "ggml_gelu",
    "ggml_gelu_table",
    "ggml_layer_norm",
    "ggml_rms_norm",
    "ggml_rope",
    "ggml_rope_table",
    "ggml_silu_mul",
    "native_rope_table_for",
    "sqrtf",
    "sum_accumulators",
    "sum_halves",
]

_ATTENTION_VALUES = 1 << 24  # float32 values of elementwise products per attention pass (64 MB)


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
