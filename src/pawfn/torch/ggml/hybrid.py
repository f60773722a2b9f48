"""llama.cpp's CPU arithmetic for Qwen3.5's own operations, in torch: `numerics="llamacpp"` on the qwen35 family.
Each `ggml_*` function is the torch reference (and the fallback where the C kernels do not build); each `native_*`
one computes the same numbers on the C kernels (`c_kernels`). The AVX-512 paths were checked against llama.cpp here; the AVX2 ones
(`width` 8) are written from the same sources.

Read from ggml's CPU sources and the compiled library (llama-cpp-python 0.3.36, x86 with AVX2 or AVX-512), for what
the official vision runtime runs (flash attention, an f16 cache, batches of 128, 2 threads):

- `ssm_conv`: per channel, the window's products summed in order from 0. GCC builds `sumf += s * c` differently by
  CPU: with AVX-512 as an FMA chain; with AVX2 it vectorizes by 4 and 8 taps (`vmulps`, then `vaddss` in order),
  so the first K - K % 4 products are rounded before they are added and only the tail is fused.
- `silu`: `ggml_v_silu` (`x / (1 + ggml_v_expf(-x))`) on whole vectors, `x / (1 + expf(-x))` on the rest;
  `sigmoid` `1 / (1 + expf(-x))`, `softplus` `logf(1 + expf(x))` (x itself above 20), the C library's `expf`/`logf`.
- The Gated DeltaNet key/query norm: `rms_norm` with eps / n, then a scale by `1/sqrtf(n)`.
- `GATED_DELTA_NET` (the fused op; one token at a time per head): the state times `expf(g)`; per value column,
  `ggml_vec_dot_f32` with the key (4 accumulators of FMAs over each 4 vectors, then the lanes; the last n % (4 *
  lanes) products rounded and added in order), the delta `(v - dot) * beta`; the state plus key times delta by FMA;
  the output `dot(column, q) * (1/sqrtf(S))`.
- Flash attention on the f16 cache, by the shape of llama.cpp's batch (`ggml_flash_attention`): one query row's
  scores in f16 dots with online softmax and V summed in f16 (batches under 64 rows); 64 rows or more tiled with
  float32 FMA chains and `ggml_v_expf` softmax; a lone row over 512 cache cells or more split across the threads
  and the partial results merged.
"""

from __future__ import annotations

import functools
from typing import Literal
from collections.abc import Callable

import torch

from .float_ops import f32, fma32, sum_accumulators, sum_halves, c_math, sqrtf, ggml_dot_f16, ggml_expf, ggml_rope_table
from .activations import native_silu
from .c_kernels import NativeKernels, native_flash_online, native_flash_tiled, native_rms_norm, native_ssm_conv

__all__ = [
    "ggml_dot_f32",
    "ggml_flash_attention",
    "ggml_gated_delta_net",
    "ggml_l2_norm",
    "ggml_mrope_table",
    "ggml_sigmoid",
    "ggml_silu",
    "ggml_softplus",
    "ggml_ssm_conv",
    "libm_expf",
    "native_flash_attention",
    "native_l2_norm",
    "native_silu",
    "native_ssm_conv_for",
    "rounded_taps",
]

FA_TILE = 64
"""Query rows from which llama.cpp's CPU flash attention runs tiled, and the tiles' width in cache cells."""
SPLIT_KV_CELLS = 512
"""Cache cells from which a one-row batch's flash attention is split across threads."""


def _elementwise(name: Literal["expf", "logf"], x: torch.Tensor) -> torch.Tensor:
    """The C library's float32 function `name` on every value (from float64 where none loads)."""
    library = c_math()
    if library is None:
        wide = x.double()
        return (torch.exp(wide) if name == "expf" else torch.log(wide)).float()
    function = library.expf if name == "expf" else library.logf
    values = [function(float(v)) for v in x.detach().cpu().flatten().numpy()]
    return torch.tensor(values, dtype=torch.float32).reshape(x.shape).to(x.device)


def libm_expf(x: torch.Tensor) -> torch.Tensor:
    """`expf` of every value, as llama.cpp's scalar code calls it."""
    return _elementwise("expf", x)


def ggml_silu(x: torch.Tensor, width: int = 16) -> torch.Tensor:
    """`ggml_vec_silu_f32` along the last axis: whole vectors of `width` lanes by `ggml_v_silu`, the rest by `expf`
    (`native_silu` in C)."""
    n = x.shape[-1]
    whole = n - n % width
    head = torch.div(x[..., :whole], 1.0 + ggml_expf(-x[..., :whole], width=width))
    if whole == n:
        return head
    tail = x[..., whole:]
    return torch.cat((head, torch.div(tail, 1.0 + libm_expf(-tail))), dim=-1)


def ggml_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """`ggml_sigmoid`: `1 / (1 + expf(-x))` per value (`native_libm(kernels, LibmOp.SIGMOID, x)` in C)."""
    return torch.div(f32(1.0), 1.0 + libm_expf(-x))


def ggml_softplus(x: torch.Tensor) -> torch.Tensor:
    """`ggml_softplus`: `logf(1 + expf(x))`, or x above 20 (`native_libm(kernels, LibmOp.SOFTPLUS, x)` in C)."""
    return torch.where(x > 20.0, x, _elementwise("logf", 1.0 + libm_expf(torch.clamp(x, max=20.0))))


def rounded_taps(taps: int, width: int) -> int:
    """How many of a convolution's `taps` products llama.cpp's build for `width` lanes rounds before adding (the
    module docstring): the rest are fused."""
    return taps - taps % 4 if width == 8 else 0


def native_ssm_conv_for(
    kernels: NativeKernels, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor, width: int, silu: bool = False
) -> torch.Tensor:
    """`ggml_ssm_conv` on the C kernels, the window by time: `window` [K - 1, channels] then `rows` [T, channels];
    `silu`: then `ggml_silu` of its outputs in the same pass."""
    return native_ssm_conv(kernels, window, rows, kernel, rounded_taps(kernel.shape[1], width), width if silu else None)


def ggml_ssm_conv(window: torch.Tensor, kernel: torch.Tensor, width: int) -> torch.Tensor:
    """`ggml_ssm_conv`: the causal convolution of `window` [channels, K - 1 + T] with `kernel` [channels, K], [T,
    channels], as llama.cpp's build for `width` float32 lanes sums each output's K products (module docstring)."""
    taps_count = kernel.shape[1]
    rounded = rounded_taps(taps_count, width)
    windows = window.unfold(1, taps_count, 1)  # [channels, T, K]
    taps = kernel.unsqueeze(1).expand_as(windows)
    total = torch.zeros_like(windows[..., 0])
    for index in range(taps_count):
        if index < rounded:
            total = total + windows[..., index] * taps[..., index]
        else:
            total = fma32(windows[..., index], taps[..., index], total)
    return total.T


def ggml_l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """llama.cpp's Gated DeltaNet key/query norm over the last axis: `rms_norm(x, eps / n)` scaled by `1/sqrtf(n)`."""
    n = f32(float(x.shape[-1]))
    mean = ((x * x).double().sum(dim=-1, keepdim=True) / x.shape[-1]).float()
    scale = torch.div(f32(1.0), sqrtf(mean + torch.div(f32(eps), n)))
    return (x * scale) * torch.div(f32(1.0), sqrtf(n))


def native_l2_norm(kernels: NativeKernels, x: torch.Tensor, eps: float) -> torch.Tensor:
    """`ggml_l2_norm` on the C kernels: their `rms_norm` with eps / n (in float32) and every weight `1/sqrtf(n)`,
    which computes `(x * scale) * (1/sqrtf(n))` with the same roundings."""
    n = f32(float(x.shape[-1]))
    weight = torch.div(f32(1.0), sqrtf(n)).expand(x.shape[-1])
    return native_rms_norm(kernels, x, weight, float(torch.div(f32(eps), n)))


def ggml_dot_f32(a: torch.Tensor, b: torch.Tensor, width: int = 16) -> torch.Tensor:
    """`ggml_vec_dot_f32` over the last axis of `a` and `b` (broadcast): 4 accumulators of `width` lanes, each
    an FMA chain over every 4 * `width` values, added (0+2)+(1+3), then the lanes (by halves with AVX-512, by
    `hadd` with AVX2); the remaining products rounded and added to that in order."""
    k = a.shape[-1]
    step = 4 * width
    whole = k - k % step
    total: torch.Tensor | None = None
    if whole:
        acc = fma32(a[..., :step], b[..., :step], 0.0)
        for start in range(step, whole, step):
            acc = fma32(a[..., start : start + step], b[..., start : start + step], acc)
        total = sum_accumulators(acc, width)
    products = a[..., whole:] * b[..., whole:]
    if total is None:
        total = torch.zeros(products.shape[:-1], dtype=torch.float32, device=products.device)
    for index in range(k - whole):
        total = total + products[..., index]
    return total


def ggml_gated_delta_net(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor, width: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's fused `GATED_DELTA_NET` on one sequence: q, k [T, heads, S] (normed, one per value head), v [T,
    heads, S], the log decay g and beta [T, heads], the state [heads, key, value]. Returns the outputs [T, heads, S]
    (scaled by `1/sqrtf(S)`) and the new state (`native_gated_delta_net` in C)."""
    size = v.shape[-1]
    scale = torch.div(f32(1.0), sqrtf(f32(float(size))))
    columns = state.transpose(1, 2).contiguous()  # [heads, value j, key i]: ggml keeps the state transposed
    decays = libm_expf(g)
    outputs: list[torch.Tensor] = []
    for t in range(v.shape[0]):
        columns = columns * decays[t].reshape(-1, 1, 1)
        recalled = ggml_dot_f32(columns, k[t].unsqueeze(1), width)  # [heads, value]
        delta = (v[t] - recalled) * beta[t].unsqueeze(1)
        columns = fma32(k[t].unsqueeze(1), delta.unsqueeze(2), columns)
        outputs.append(ggml_dot_f32(columns, q[t].unsqueeze(1), width) * scale)
    return torch.stack(outputs), columns.transpose(1, 2).contiguous()


RopeTable = Callable[[torch.Tensor, int, float], tuple[torch.Tensor, torch.Tensor]]
"""cos and sin of positions [T] for a head size and a base: `ggml_rope_table`, or its C twin."""


def ggml_mrope_table(
    positions: torch.Tensor, rotated: int, base: float, pair_sections: list[int], table: RopeTable = ggml_rope_table
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, rotated/2] of M-RoPE positions [T, 4] as `ggml_mrope_cache_init`: each section's angle
    advances by its own repeated float32 products from its position, and each pair takes its section's (each
    section's `table`)."""
    used = sorted(set(pair_sections))  # a section no pair turns with needs no table (each costs cosf/sinf calls)
    tables = [table(positions[:, section], rotated, base) for section in used]
    index = torch.tensor([used.index(section) for section in pair_sections], device=positions.device)
    cos = torch.stack([cos for cos, _ in tables], dim=-1)  # [T, 1, pairs, sections]
    sin = torch.stack([sin for _, sin in tables], dim=-1)
    pick = index.reshape(1, 1, -1, 1).expand(*cos.shape[:-1], 1)
    return cos.gather(-1, pick).squeeze(-1), sin.gather(-1, pick).squeeze(-1)


def ggml_flash_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch_rows: int, cells: int, threads: int, width: int = 16
) -> torch.Tensor:
    """llama.cpp's CPU flash attention on its f16 cache: q [n, H, D] float32, the last n of the L positions of
    `keys`/`values` [KV, L, D] (causal), from a batch of `batch_rows` rows over a cache view of `cells` cells, on
    `threads` threads. Returns [n, H * D]."""
    n, heads, dim = q.shape
    scale = torch.div(f32(1.0), sqrtf(f32(float(dim))))
    positions = torch.arange(keys.shape[1] - n, keys.shape[1], device=q.device)
    shared = torch.arange(heads, device=q.device) // (heads // keys.shape[0])
    k, v = keys[shared], values[shared]  # [H, L, D] f16
    if batch_rows >= FA_TILE:
        return _tiled(q, k, v, positions, scale, width).reshape(n, heads * dim)
    return _in_chunks(functools.partial(_online, q, k, v, positions, scale, width=width), q, keys.shape[1], batch_rows, cells, threads)


def native_flash_attention(
    kernels: NativeKernels, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch_rows: int, cells: int, threads: int, width: int
) -> torch.Tensor:
    """`ggml_flash_attention` on the C kernels."""
    n, heads, dim = q.shape
    scale = float(torch.div(f32(1.0), sqrtf(f32(float(dim)))))
    offset = keys.shape[1] - n  # the new rows are the cache's last
    if batch_rows >= FA_TILE:
        return native_flash_tiled(kernels, q, keys, values, scale, width, offset).reshape(n, heads * dim)
    online = functools.partial(native_flash_online, kernels, q, keys, values, scale=scale, width=width, offset=offset)
    return _in_chunks(online, q, keys.shape[1], batch_rows, cells, threads)


def ggml_image_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int) -> torch.Tensor:
    """mtmd's flash attention over one image: q, k, v [n, H, D] float32, K and V cast to f16, no mask (each patch
    sees every patch); ggml's tiled kernel from `FA_TILE` rows, its one-chunk kernel below. Returns [n, H * D]."""
    n, heads, dim = q.shape
    scale = torch.div(f32(1.0), sqrtf(f32(float(dim))))
    keys, values = k.transpose(0, 1).half(), v.transpose(0, 1).half()  # [H, n, D]
    last_seen = torch.full((n,), n - 1, device=q.device)  # every row sees every cell
    if n >= FA_TILE:
        return _tiled(q, keys, values, last_seen, scale, width).reshape(n, heads * dim)
    sums, _, total = _online(q, keys, values, last_seen, scale, 0, n, width)
    return _normalized(sums, total).reshape(n, heads * dim)


def native_image_attention(
    kernels: NativeKernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int, keys_by_head: bool = False
) -> torch.Tensor:
    """`ggml_image_attention` on the C kernels; `k` [n, heads, D], or (`keys_by_head`) already the f16 keys [heads, n,
    D] (`native_rope`'s `f16_by_head`)."""
    n, heads, dim = q.shape
    scale = float(torch.div(f32(1.0), sqrtf(f32(float(dim)))))
    keys = k if keys_by_head else k.transpose(0, 1).half().contiguous()
    values = v.transpose(0, 1).half().contiguous()
    if n >= FA_TILE:
        return native_flash_tiled(kernels, q, keys, values, scale, width, n - 1).reshape(n, heads * dim)
    sums, _, total = native_flash_online(kernels, q, keys, values, 0, n, scale, width, n - 1)
    return _normalized(sums, total).reshape(n, heads * dim)


def _in_chunks(online: _Online, q: torch.Tensor, length: int, batch_rows: int, cells: int, threads: int) -> torch.Tensor:
    """The one-chunk kernel over all `length` cells, or a lone row over many cells split across the threads."""
    n, heads, dim = q.shape
    if batch_rows == 1 and n == 1 and cells >= SPLIT_KV_CELLS:
        out = _split(online, q, cells, threads)
    else:
        vkq, _, total = online(0, length)
        out = _normalized(vkq, total)
    return out.reshape(n, heads * dim)


_Online = Callable[[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""`_online` over cells [first, last): the unnormalized sums, the running maximum and the softmax sum."""


def _online(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: torch.Tensor, first: int, last: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ggml_compute_forward_flash_attn_ext_f16_one_chunk` over cells first..last-1 for every row and head: Q in
    f16, each cell's score by `ggml_vec_dot_f16`, online softmax with V accumulated in f16. Returns the unnormalized
    sums [n, H, D] (float32), the running maximum and the softmax sum [n, H]."""
    n, heads, dim = q.shape
    queries = q.half().float()
    high = torch.full((n, heads), -torch.inf, dtype=torch.float32, device=q.device)
    total = torch.zeros((n, heads), dtype=torch.float32, device=q.device)
    accumulated = torch.zeros((n, heads, dim), dtype=torch.float32, device=q.device)  # f16 values, widened
    for cell in range(first, min(last, k.shape[1])):
        active = (positions >= cell).unsqueeze(1)  # [n, 1]: the cell is not masked for this row
        if not bool(active.any()):
            continue
        score = ggml_dot_f16(queries, k[:, cell].unsqueeze(0), one_row=True, width=width) * scale  # [n, H]
        rises = score > high
        shrink = torch.where(rises, libm_expf(high - torch.where(rises, score, high)), torch.ones_like(score))
        weight = torch.where(rises, torch.ones_like(score), libm_expf(score - high))
        rescaled = torch.where(rises.unsqueeze(-1), (accumulated * shrink.unsqueeze(-1)).half().float(), accumulated)
        added = fma32(v[:, cell].float().unsqueeze(0), weight.unsqueeze(-1), rescaled).half().float()
        accumulated = torch.where(active.unsqueeze(-1), added, accumulated)
        total = torch.where(active, fma32(total, shrink, weight), total)
        high = torch.where(active & rises, score, high)
    return accumulated, high, total


def _split(online: _Online, q: torch.Tensor, cells: int, threads: int) -> torch.Tensor:
    """One row over `cells` cells split in `threads` chunks, each `online`, merged as `ggml_flash_attn_ext_reduce_partials`."""
    chunk = -(-cells // threads)
    merged = torch.zeros_like(q)
    high = torch.full(q.shape[:2], -torch.inf, dtype=torch.float32, device=q.device)
    total = torch.zeros(q.shape[:2], dtype=torch.float32, device=q.device)
    for start in range(0, cells, chunk):
        part, part_high, part_total = online(start, start + chunk)
        present = part_total != 0
        new_high = torch.maximum(high, part_high)
        old_scale, new_scale = libm_expf(high - new_high), libm_expf(part_high - new_high)
        merged = torch.where(present.unsqueeze(-1), fma32(merged, old_scale.unsqueeze(-1), part * new_scale.unsqueeze(-1)), merged)
        total = torch.where(present, fma32(total, old_scale, part_total * new_scale), total)
        high = torch.where(present, new_high, high)
    return torch.where((total == 0).unsqueeze(-1), merged, merged * torch.div(f32(1.0), total).unsqueeze(-1))


def _tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: torch.Tensor, width: int) -> torch.Tensor:
    """`ggml_compute_forward_flash_attn_ext_tiled` for every row and head: scores as float32 FMA chains over Q
    (not rounded) and K widened from f16, tiles of `FA_TILE` cells with `ggml_v_expf` softmax, V summed by FMA chains."""
    n, heads, dim = q.shape
    length = k.shape[1]
    high = torch.full((n, heads), -torch.inf, dtype=torch.float32, device=q.device)
    total = torch.zeros((n, heads), dtype=torch.float32, device=q.device)
    accumulated = torch.zeros((n, heads, dim), dtype=torch.float32, device=q.device)
    queries = q.transpose(0, 1)  # [H, n, D]
    for start in range(0, length, FA_TILE):
        stop = min(start + FA_TILE, length)
        visible = positions.unsqueeze(1) >= torch.arange(start, start + FA_TILE, device=q.device).unsqueeze(0)  # [n, tile]
        visible[:, stop - start :] = False
        if not bool(visible.any()):
            continue
        tile_keys = torch.zeros((heads, FA_TILE, dim), dtype=torch.float32, device=q.device)
        tile_keys[:, : stop - start] = k[:, start:stop].float()
        scores = torch.zeros((heads, n, FA_TILE), dtype=torch.float32, device=q.device)
        for d in range(dim):
            scores = fma32(queries[:, :, d : d + 1], tile_keys[:, :, d].unsqueeze(1), scores)
        scores = (scores * scale).transpose(0, 1).masked_fill(~visible.unsqueeze(1), -torch.inf)  # [n, H, tile]
        tile_high = scores.amax(dim=-1)
        seen = tile_high != -torch.inf
        new_high = torch.maximum(high, tile_high)
        rises = seen & (new_high > high)
        shrink = torch.where(rises, libm_expf(high - new_high), torch.ones_like(high))
        accumulated = torch.where(rises.unsqueeze(-1), accumulated * shrink.unsqueeze(-1), accumulated)
        total = torch.where(rises, total * shrink, total)
        high = torch.where(seen, new_high, high)
        weights = ggml_expf(scores - high.unsqueeze(-1), width)
        weights = torch.where(seen.unsqueeze(-1), weights, torch.zeros_like(weights))
        block_sums = sum_halves(weights.reshape(n, heads, FA_TILE // width, width)).double()
        running = torch.zeros((n, heads), dtype=torch.float64, device=q.device)
        for block in range(FA_TILE // width):
            running = running + block_sums[..., block]
        total = torch.where(seen, (total.double() + running).float(), total)
        tile_values = torch.zeros((heads, FA_TILE, dim), dtype=torch.float32, device=q.device)
        tile_values[:, : stop - start] = v[:, start:stop].float()
        for cell in range(FA_TILE):
            accumulated = fma32(weights[:, :, cell : cell + 1], tile_values[:, cell].unsqueeze(0), accumulated)
    return _normalized(accumulated, total)


def _normalized(sums: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """Flash attention's last step: the sums [n, H, D] times `1/total` (0 where the softmax sum is 0)."""
    return sums * torch.where(total == 0, torch.zeros_like(total), torch.div(f32(1.0), total)).unsqueeze(-1)
