"""llama.cpp's block products in C (`kernels.c`), for the `numerics="llamacpp"` mode: the arithmetic of
`blocks.BlockMatrix` (bit-identical, tested against it and against llama.cpp) at llama.cpp's speed.

The C file is compiled on first use with the system's C compiler (`$CC`, else `cc`, `gcc` or `clang`) into
`<cache>/.pawfn-derived/kernels/` (or `$PAW_KERNELS_DIR`), keyed by a hash of the source and flags, and loaded with ctypes only while it is
what the build wrote (its sha256, recorded beside it, in a folder only this user can change; else it is built again,
in a private temporary folder where the cache's is not private); where no compiler works, the
mode falls back to the torch emulation (the same tokens on quantized matrices, several times slower; F32 and F16
matrices then add in torch's order, not ggml's) with one warning. Large products
and attention split their outputs across `torch.get_num_threads()` threads with OpenMP, on torch's own OpenMP
runtime where torch ships one (the library links `libgomp.so.1`, which the loader resolves to the copy torch loaded
first): a pool of our own spun against torch's threads on every core.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import warnings
from pathlib import Path

import torch

from ...core.config import default_cache_dir
from ...core.files import mark_used
from .build import build_key, build_kernels, kernels_folder, trusted_library
from .interface import AttentionCall, AttentionStepCall, FlashOnlineCall, FlashTiledCall, GatedDeltaNetCall, LibmOp, RmsNormCall
from .interface import SsmConvCall
from .library import NativeKernels

__all__ = [
    "pointer",
    "STEP_TABLE_COLUMNS",
    "TILED_MIN_ROWS",
    "ELEMENTWISE_WORK",
    "LibmOp",
    "NativeKernels",
    "int8_mm",
    "native_attention",
    "native_attention_step",
    "native_expf",
    "native_flash_online",
    "native_flash_tiled",
    "native_gated_delta_net",
    "native_libm",
    "native_ssm_conv",
    "native_kernels",
    "native_rms_norm",
    "native_layer_norm",
    "native_rope",
    "native_rope_table",
]

_LOG = logging.getLogger("pawfn")

TILED_MIN_ROWS = 8
"""ggml_tiled_min_batch: Q6_K products of this many rows or more take ggml's tiled kernel."""
ELEMENTWISE_WORK = 2  # an rms_norm or swiglu value weighs two int8 products here: a decode step's 8 rows of 1024 stay on one thread


@functools.cache
def native_kernels() -> NativeKernels | None:
    """The compiled kernels (built on first use, then reused from the cache), or None where they cannot be built."""
    if os.environ.get("PAW_NATIVE_KERNELS", "1").lower() in ("0", "false", "no", "off"):
        return None
    # `pawfn cache clear --derived` removes the cache's; PAW_KERNELS_DIR puts them elsewhere (as TORCH_EXTENSIONS_DIR
    # does torch's), e.g. one folder for many caches
    named = os.environ.get("PAW_KERNELS_DIR")
    folder = kernels_folder(Path(named) if named else default_cache_dir() / ".pawfn-derived" / "kernels")
    target = folder / f"ggml-{build_key()}.so"
    failure = None
    if not trusted_library(target):  # missing, or not what our build wrote: never loaded as it is
        if target.exists():
            _LOG.warning("pawfn: %s does not match the sha256 its build recorded (or is not this user's alone): building it again", target)
        failure = build_kernels(target)
    if failure is None:
        mark_used(target)
        try:
            return NativeKernels(ctypes.CDLL(str(target)), target)
        except (OSError, AttributeError) as error:
            failure = str(error)
    warnings.warn(
        f"pawfn: numerics='llamacpp' runs on its torch emulation (the same tokens on quantized matrices, several times "
        f"slower; F32/F16 matrices in torch's order): "
        f"its C kernels could not be built ({failure})",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


def int8_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int8 [m, k] times int8 [k, n] (into `out` where given), summed exactly in int32 (torch's oneDNN int8 GEMM: AMX
    or VNNI where the CPU has them; private but stable API)."""
    product: torch.Tensor = torch._int_mm(a, b, out=out)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]  # no public int8 GEMM
    return product


def pointer(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def native_attention(
    kernels: NativeKernels, q: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None, keys: torch.Tensor, values: torch.Tensor, width: int
) -> torch.Tensor:
    """`float_ops.ggml_attention` in C: q [n, H, D] over a program's prefix keys/values [KV, P, D] (f16, or None) then
    the sequence's own [KV, L, D] (f16 views whose rows are contiguous), as one cache. Returns [n, H * D]."""
    q = q.float().contiguous()
    n, heads, dim = q.shape
    kv_heads, own = keys.shape[0], keys.shape[1]
    for view in (keys, values) + (prefix or ()):
        if view.dtype != torch.float16 or view.stride(2) != 1 or view.stride(1) != dim:
            raise ValueError("attention needs f16 keys and values with contiguous rows")
    prefix_keys, prefix_values = prefix if prefix is not None else (keys, values)
    prefix_length = prefix_keys.shape[1] if prefix is not None else 0
    length = prefix_length + own
    padded = -(-length // (4 * width)) * (4 * width)  # llama.cpp pads its KV view; padded positions weigh 0
    scale = _attention_scale(dim)
    out = torch.empty((n, heads * dim), dtype=torch.float32)
    call = AttentionCall(
        q=pointer(q),
        prefix_keys=pointer(prefix_keys),
        prefix_values=pointer(prefix_values),
        keys=pointer(keys),
        values=pointer(values),
        out=pointer(out),
        prefix_length=prefix_length,
        prefix_head_stride=prefix_keys.stride(0),
        own_length=own,
        head_stride=keys.stride(0),
        rows=n,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        padded=padded,
        width=width,
        scale=scale,
    )
    kernels.run(call, heads, n * heads * length * dim)
    return out


STEP_TABLE_COLUMNS = 8
"""A decode step attention table's row: prefix keys, prefix values (addresses; a row without a prefix repeats its own),
prefix length, their head stride, own keys, own values (f16 [KV, capacity, D] buffers with contiguous rows), own
length counting the new token, their head stride."""


def native_attention_step(
    kernels: NativeKernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, positions: int, width: int
) -> torch.Tensor:
    """`native_attention` of every row of a decode step, each alone, in one call: row i's new key and value k[i], v[i]
    [KV, D] stored as f16 at its last own position, then its query q[i] [H, D] over its prefix and own positions, as
    `table` (int64 [n, STEP_TABLE_COLUMNS], its columns documented there) lays them out; rows that share a prefix
    convert it once. `positions`: the positions all rows attend over (the split across threads follows it). Needs D a
    multiple of 4 * `width` (one-row dots). Returns [n, H * D]."""
    q = q.float().contiguous()
    n, heads, dim = q.shape
    if dim % (4 * width) or table.shape != (n, STEP_TABLE_COLUMNS) or table.dtype != torch.int64 or not table.is_contiguous():
        raise ValueError(f"a step's attention needs a table row per query row and a head size that is a multiple of {4 * width}")
    k, v = (t if t.dtype == torch.float32 and t.stride(2) == 1 and t.stride(1) == dim else t.float().contiguous() for t in (k, v))
    out = torch.empty((n, heads * dim), dtype=torch.float32)
    kv_heads = k.shape[1]
    call = AttentionStepCall(
        q=pointer(q),
        table=pointer(table),
        out=pointer(out),
        k=pointer(k),
        v=pointer(v),
        rows=n,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        width=width,
        k_stride=k.stride(0),
        v_stride=v.stride(0),
        scale=_attention_scale(dim),
    )
    kernels.run(call, kv_heads, heads * positions * dim)
    return out


@functools.cache
def _attention_scale(dim: int) -> float:
    """`1.0f / sqrtf(dim)`: the square root correctly rounded (from float64), the division in float32."""
    return float(torch.div(torch.tensor(1.0), torch.sqrt(torch.tensor(float(dim), dtype=torch.float64)).float()))


def native_expf(kernels: NativeKernels, x: torch.Tensor, width: int) -> torch.Tensor:
    """`float_ops.ggml_expf` in C."""
    x = x.float().contiguous()
    y = torch.empty_like(x)
    kernels.expf(pointer(x), pointer(y), x.numel(), width)
    return y


def native_libm(kernels: NativeKernels, function: LibmOp, x: torch.Tensor) -> torch.Tensor:
    """`function` of every value of x, in C."""
    x = x.float().contiguous()
    y = torch.empty_like(x)
    kernels.libm(function, pointer(x), pointer(y), x.numel())
    return y


def native_ssm_conv(
    kernels: NativeKernels, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor, rounded: int, silu_width: int | None = None
) -> torch.Tensor:
    """`hybrid.ggml_ssm_conv` in C on the window by time, `window` [K - 1, channels] then `rows` [T, channels] (float32
    rows with contiguous columns are read in place, e.g. a wider product's), kernel [channels, K] -> [T, channels], the
    first `rounded` products of each output rounded and added, the rest by FMA; then, given `silu_width`,
    `native_silu` of the outputs with that many lanes, in the same pass."""
    window, by_tap = window.float().contiguous(), kernel.float().T.contiguous()
    if rows.dtype != torch.float32 or rows.stride(1) != 1:
        rows = rows.float().contiguous()
    (taps, channels), steps = by_tap.shape, rows.shape[0]
    out = torch.empty((steps, channels), dtype=torch.float32)
    silu = int(silu_width is not None)
    call = SsmConvCall(pointer(window), pointer(rows), pointer(by_tap), pointer(out), channels, taps, rounded, silu, silu_width or 0, rows.stride(0))
    kernels.run(call, steps, steps * channels * taps)
    return out


def native_gated_delta_net(
    kernels: NativeKernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`hybrid.ggml_gated_delta_net` in C (the heads split across threads); float32 values [T, heads, size] with each
    token's heads contiguous are read in place (the convolution's columns)."""
    q, k, g, beta = (t.float().contiguous() for t in (q, k, g, beta))
    if v.dtype != torch.float32 or v.stride(2) != 1 or v.stride(1) != v.shape[2]:
        v = v.float().contiguous()
    # ggml's layout, updated in place: a copy (the state given is never changed), returned as a view whose
    # transpose the next token's call copies without a second transposition
    columns = state.float().transpose(1, 2).clone(memory_format=torch.contiguous_format)
    steps, heads, size = v.shape
    out = torch.empty((steps, heads, size), dtype=torch.float32)
    q_at, k_at, v_at, g_at, beta_at, state_at, out_at = (pointer(t) for t in (q, k, v, g, beta, columns, out))
    call = GatedDeltaNetCall(q_at, k_at, v_at, g_at, beta_at, state_at, out_at, steps, heads, size, width, v_stride=v.stride(0))
    kernels.run(call, heads, steps * heads * size * size * 4)
    return out, columns.transpose(1, 2)


def _cache_views(keys: torch.Tensor, values: torch.Tensor) -> int:
    """The head stride of f16 cache views [KV, L, D] with contiguous rows (keys' and values' alike)."""
    dim = keys.shape[2]
    rows_contiguous = all(view.dtype == torch.float16 and view.stride(2) == 1 and view.stride(1) == dim for view in (keys, values))
    if not rows_contiguous or keys.stride(0) != values.stride(0):
        raise ValueError("flash attention needs f16 keys and values with contiguous rows and one head stride")
    return keys.stride(0)


def native_flash_online(
    kernels: NativeKernels, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int, last: int, scale: float, width: int, offset: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hybrid._online` in C: q [n, H, D], row r at position `offset + r` (it sees the cells up to it), over cells
    [first, last)."""
    q = q.float().contiguous()
    n, heads, dim = q.shape
    stride = _cache_views(keys, values)
    accumulated = torch.empty_like(q)
    high, total = torch.empty((n, heads), dtype=torch.float32), torch.empty((n, heads), dtype=torch.float32)
    call = FlashOnlineCall(
        q=pointer(q),
        keys=pointer(keys),
        values=pointer(values),
        accumulated=pointer(accumulated),
        high=pointer(high),
        total=pointer(total),
        head_stride=stride,
        rows=n,
        heads=heads,
        kv_heads=keys.shape[0],
        dim=dim,
        offset=offset,
        first=first,
        last=last,
        width=width,
        scale=scale,
    )
    kernels.run(call, n * heads, n * heads * keys.shape[1] * dim)
    return accumulated, high, total


def native_flash_tiled(
    kernels: NativeKernels, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, width: int, offset: int
) -> torch.Tensor:
    """`hybrid._tiled` in C: q [n, H, D], row r at position `offset + r` (it sees the cells up to it); returns [n, H, D]."""
    q = q.float().contiguous()
    n, heads, dim = q.shape
    out = torch.empty_like(q)
    call = FlashTiledCall(
        q=pointer(q),
        keys=pointer(keys),
        values=pointer(values),
        out=pointer(out),
        head_stride=_cache_views(keys, values),
        rows=n,
        heads=heads,
        kv_heads=keys.shape[0],
        dim=dim,
        offset=offset,
        length=keys.shape[1],
        width=width,
        scale=scale,
    )
    kernels.run(call, heads, n * heads * keys.shape[1] * dim)
    return out


def native_rms_norm(kernels: NativeKernels, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`float_ops.ggml_rms_norm` in C (the squares summed in order in double, as ggml does) over x's last axis. A float32
    view [T, n] or [T, H, n] whose rows of n are contiguous (e.g. the heads of a product split by columns) is read in
    place; rows split across threads where there are enough of them."""
    n = x.shape[-1]
    y = torch.empty(x.shape, dtype=torch.float32)
    if y.numel() == 0:
        return y
    if x.dtype == torch.float32 and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == n:
        per, stride = x.shape[1], x.stride(0)
    elif x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1:
        per, stride = 1, x.stride(0)
    else:
        x, per, stride = x.float().contiguous(), 1, n
    weight = weight.float().contiguous()
    call = RmsNormCall(pointer(x), pointer(weight), pointer(y), stride=stride, per_row=per, n=n, eps=eps)
    kernels.run(call, y.numel() // n, y.numel() * ELEMENTWISE_WORK)
    return y


def native_layer_norm(kernels: NativeKernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, width: int) -> torch.Tensor:
    """`float_ops.ggml_layer_norm` in C over x's last axis."""
    rows = x.float().contiguous().reshape(-1, x.shape[-1])
    weight, bias = weight.float().contiguous(), bias.float().contiguous()
    y = torch.empty_like(rows)
    kernels.layer_norm(pointer(rows), pointer(weight), pointer(bias), pointer(y), rows.shape[0], rows.shape[1], eps, width)
    return y.reshape(x.shape)


def native_rope(kernels: NativeKernels, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, f16_by_head: bool = False) -> torch.Tensor:
    """`float_ops.ggml_rope` in C: x [T, heads, D] (float32 heads of contiguous values read in place, e.g. a wider
    product's columns), cos/sin [T, 1, D/2]; `f16_by_head`: the result rounded to f16 as [heads, T, D] (attention's
    keys as ggml casts them), else float32 [T, heads, D]."""
    if x.dtype != torch.float32 or x.stride(2) != 1:
        x = x.float().contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    tokens, heads, dim = x.shape
    y = torch.empty((heads, tokens, dim), dtype=torch.float16) if f16_by_head else torch.empty_like(x, memory_format=torch.contiguous_format)
    y_strides = (dim, tokens * dim) if f16_by_head else (heads * dim, dim)
    kernels.rope_neox((pointer(x), x.stride(0), x.stride(1)), pointer(cos), pointer(sin), (pointer(y), *y_strides), f16_by_head, tokens, heads, dim)
    return y


def native_rope_table(kernels: NativeKernels, positions: torch.Tensor, half: int, step: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`float_ops.ggml_rope_table` in C: cos and sin [T, 1, half] of the angles `p * step**i` (repeated float32 products),
    by the C library's `cosf` and `sinf`."""
    points = positions.to(torch.float32).contiguous()
    cos = torch.empty((points.shape[0], 1, half), dtype=torch.float32)
    sin = torch.empty_like(cos)
    kernels.rope_table(pointer(points), points.shape[0], half, step, pointer(cos), pointer(sin))
    return cos.to(positions.device), sin.to(positions.device)
