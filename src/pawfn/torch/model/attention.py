"""Attention over a sequence's own KV cache and its program's shared prefix, merged by log-sum-exp."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .families import Architecture
from ..ggml.float_ops import ggml_attention
from ..ggml.hybrid import ggml_flash_attention
from ..ggml.c_kernels import STEP_TABLE_COLUMNS, NativeKernels, native_attention, native_attention_step
from .kvcache import KVCache

SharedKV = tuple[torch.Tensor, torch.Tensor]
"""A program's prefix keys and values [KV, P, D] in one layer."""
FlashAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, int], torch.Tensor]
"""`ggml_flash_attention(q, keys, values, batch_rows, cells, threads, width)`, or its C twin."""

__all__ = [
    "FlashAttention",
    "LLAMACPP_BATCH",
    "StepSlots",
    "attend",
    "attend_batched",
    "attend_llamacpp",
    "attend_llamacpp_native",
    "attend_llamacpp_step",
    "attend_llamacpp_flash",
    "llamacpp_batches",
    "attention_by_matmul",
    "merge_attention",
    "partial_attention",
]


def attend(
    arch: Architecture, cache: KVCache, layer: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Store k/v [new, kv_heads, D] at slots `slot...` of `cache`, then attend q [new, heads, D] over the cache's own
    slots (additive `mask`) and its program's prefix, read in place, merged: [new, heads * D]."""
    end = cache.store(layer, slot, k, v)
    queries = _grouped(arch, q)
    out, lse = partial_attention(arch, queries, cache.keys[layer][None, :, :end], cache.values[layer][None, :, :end], mask)
    prefix = cache.prefix
    if prefix is not None and prefix.length:
        shared = partial_attention(arch, queries, prefix.keys[layer][None], prefix.values[layer][None], None)
        out = merge_attention(*shared, out, lse)
    return _ungrouped(arch, out)


def attend_batched(
    arch: Architecture, rows: list[tuple[KVCache, int]], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Store each row's k/v [1, kv_heads, D] at its (cache, slot) in `rows`, then attend every row's query
    (q [n, heads, D]) over its program's prefix and its own positions in one fused kernel: the keys of all rows
    padded to the longest, a mask hiding the padding. [n, heads * D]; not row-exact (the kernel rounds by shape)."""
    lengths: list[tuple[int, int]] = []
    for i, (cache, slot) in enumerate(rows):  # (prefix length, own length)
        lengths.append((cache.offset, cache.store(layer, slot, k[i : i + 1], v[i : i + 1])))
    n, longest = len(rows), max(shared + own for shared, own in lengths)
    keys = q.new_zeros((n, arch.n_kv_heads, longest, arch.head_dim))
    values = q.new_zeros((n, arch.n_kv_heads, longest, arch.head_dim))
    visible = torch.zeros((n, 1, 1, longest), dtype=torch.bool, device=q.device)
    for i, ((cache, _), (shared, own)) in enumerate(zip(rows, lengths, strict=True)):
        if shared:
            assert cache.prefix is not None
            keys[i, :, :shared] = cache.prefix.keys[layer]
            values[i, :, :shared] = cache.prefix.values[layer]
        keys[i, :, shared : shared + own] = cache.keys[layer][:, :own]
        values[i, :, shared : shared + own] = cache.values[layer][:, :own]
        visible[i, ..., : shared + own] = True
    out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=visible, scale=1.0 / math.sqrt(arch.head_dim), enable_gqa=True)
    return out.reshape(n, arch.n_heads * arch.head_dim)


def _stored(cache: KVCache, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, SharedKV | None]:
    """Store k/v at `slot...` and return the cache's keys and values up to them, with the prefix's where it has one."""
    end = cache.store(layer, slot, k, v)
    prefix = cache.prefix
    shared = (prefix.keys[layer], prefix.values[layer]) if prefix is not None and prefix.length else None
    return cache.keys[layer][:, :end], cache.values[layer][:, :end], shared


def attend_llamacpp_native(
    cache: KVCache, layer: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int, kernels: NativeKernels
) -> torch.Tensor:
    """`attend_llamacpp` on the C `kernels` (the prefix read in place)."""
    keys, values, shared = _stored(cache, layer, slot, k, v)
    return native_attention(kernels, q, shared, keys, values, width)


def attend_llamacpp(cache: KVCache, layer: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int) -> torch.Tensor:
    """`attend` as llama.cpp computes it on its f16 cache (`ggml_attention`, `width` lanes); the prefix's KV joins
    the cache's."""
    keys, values, shared = _stored(cache, layer, slot, k, v)
    if shared is not None:
        keys, values = torch.cat([shared[0], keys], dim=1), torch.cat([shared[1], values], dim=1)
    return ggml_attention(q, keys, values, width)


class StepSlots:
    """A decode step's rows as (cache, slot): where each row's new token's keys and values go. The C kernels' table
    of every layer's cache buffers is made on first use and kept for the step's other layers (the buffers were
    reserved before the step: they stay where they are until it ends)."""

    def __init__(self, rows: list[tuple[KVCache, int]]) -> None:
        self.rows = rows
        self._tables: torch.Tensor | None = None
        self.positions = sum(cache.offset + slot + 1 for cache, slot in rows)
        """The positions all rows attend over, the new ones included."""

    def native_table(self, arch: Architecture, layer: int) -> torch.Tensor:
        """Layer `layer`'s table for `native_attention_step` ([rows, STEP_TABLE_COLUMNS] int64)."""
        if self._tables is None:
            self._tables = torch.tensor([_table_rows(arch, cache, slot) for cache, slot in self.rows], dtype=torch.int64).transpose(0, 1).contiguous()
        return self._tables[layer]


def _table_rows(arch: Architecture, cache: KVCache, slot: int) -> list[list[int]]:
    """One decode row's entries in every layer's step table (see `STEP_TABLE_COLUMNS`); zeros for a layer without
    attention. Checks that the buffers are what the kernel reads (f16, rows of D contiguous, one head stride), on the
    first attending layer: a cache and a prefix make every layer's alike."""
    prefix = cache.prefix if cache.prefix is not None and cache.prefix.length else None
    length = prefix.length if prefix is not None else 0
    own_stride = shared_stride = 0
    first = next((layer for layer in range(arch.n_layers) if arch.attends(layer)), None)
    if first is not None:
        keys = cache.keys[first]
        shared = (prefix.keys[first], prefix.values[first]) if prefix is not None else (keys, cache.values[first])
        for held, other in ((keys, cache.values[first]), shared):
            if held.dtype != torch.float16 or held.stride(2) != 1 or held.stride(1) != arch.head_dim or other.stride() != held.stride():
                raise ValueError("a decode step's attention needs f16 keys and values with contiguous rows and one head stride")
        if slot >= keys.shape[1]:
            raise ValueError(f"slot {slot} lies past the cache's {keys.shape[1]} reserved positions")
        own_stride, shared_stride = keys.stride(0), shared[0].stride(0)
    entries: list[list[int]] = []
    for layer in range(arch.n_layers):
        if not arch.attends(layer):
            entries.append([0] * STEP_TABLE_COLUMNS)
            continue
        own = (cache.keys[layer].data_ptr(), cache.values[layer].data_ptr())
        read = (prefix.keys[layer].data_ptr(), prefix.values[layer].data_ptr()) if prefix is not None else own
        entries.append([*read, length, shared_stride, *own, slot + 1, own_stride])
    return entries


def attend_llamacpp_step(
    slots: StepSlots, arch: Architecture, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, width: int, kernels: NativeKernels
) -> torch.Tensor:
    """`attend_llamacpp` of each row of a decode step alone (row i's k/v stored at its (cache, slot) by the kernel), in
    one C call: [n, heads * D], row i's numbers those of the row by itself."""
    return native_attention_step(kernels, q, k, v, slots.native_table(arch, layer), slots.positions, width)


LLAMACPP_THREADS = 2
"""Threads the official vision runtime gives llama.cpp (its flash attention splits one row's cells by them)."""
LLAMACPP_BATCH = 128
"""Tokens the official vision runtime gives llama.cpp a batch (`n_batch`, so also its micro-batches)."""


def llamacpp_batches(n_tokens: int) -> list[int]:
    """The row counts of the batches llama.cpp evaluates `n_tokens` tokens of one chunk in."""
    return [min(LLAMACPP_BATCH, n_tokens - start) for start in range(0, n_tokens, LLAMACPP_BATCH)]


def attend_llamacpp_flash(
    cache: KVCache,
    layer: int,
    slot: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    width: int,
    batches: list[int],
    flash: FlashAttention = ggml_flash_attention,
) -> torch.Tensor:
    """`attend_llamacpp` with flash attention, as the official vision runtime runs it (`ggml_flash_attention`): the
    rows in llama.cpp's `batches` (row counts, in order), each batch over the cache view llama.cpp gives it (the
    cells used from position 0, the prefix's first, padded to 256)."""
    end = cache.store(layer, slot, k, v)
    keys, values = cache.keys[layer][:, :end], cache.values[layer][:, :end]
    prefix = cache.prefix
    if prefix is not None and prefix.length:  # the cells in llama.cpp's order: a copy, small beside a batch's products
        keys, values = torch.cat([prefix.keys[layer], keys], dim=1), torch.cat([prefix.values[layer], values], dim=1)
    outputs: list[torch.Tensor] = []
    first = 0
    for rows in batches:
        stop = keys.shape[1] - q.shape[0] + first + rows
        cells = max(256, -(-stop // 256) * 256)
        outputs.append(flash(q[first : first + rows], keys[:, :stop], values[:, :stop], rows, cells, LLAMACPP_THREADS, width))
        first += rows
    return torch.cat(outputs)


def _grouped(arch: Architecture, q: torch.Tensor) -> torch.Tensor:
    """Queries [n, heads, D] as [1, n_kv_heads, group * n, D]: the query heads that share a KV head are rows of
    one block, so K and V are never copied per head."""
    n, group = q.shape[0], arch.n_heads // arch.n_kv_heads
    return q.transpose(0, 1).reshape(1, arch.n_kv_heads, group * n, arch.head_dim)


def _ungrouped(arch: Architecture, out: torch.Tensor) -> torch.Tensor:
    """`_grouped`'s inverse for attention outputs: [1, n_kv_heads, group * n, D] as [n, heads * D]."""
    n = out.shape[2] * arch.n_kv_heads // arch.n_heads
    return out.reshape(arch.n_heads, n, arch.head_dim).transpose(0, 1).reshape(n, arch.n_heads * arch.head_dim)


def partial_attention(
    arch: Architecture, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `queries` [1, kv_heads, m, D] over some positions (`keys`/`values` [1, kv_heads, L, D],
    additive `mask` [m, L]): the output [1, kv_heads, m, D] and its log-sum-exp [1, kv_heads, m] for `merge_attention`."""
    scale = 1.0 / math.sqrt(arch.head_dim)
    if queries.device.type == "cpu":  # torch's fused CPU kernel (what scaled_dot_product_attention runs), with its lse
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(queries, keys, values, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse
    return attention_by_matmul(queries, keys, values, mask, scale)


def attention_by_matmul(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`partial_attention` in plain products, in float32 (other devices: torch has no public kernel that gives the
    log-sum-exp)."""
    scores = torch.matmul(queries.float(), keys.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), values.float()).to(queries.dtype), lse


def merge_attention(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Attention over two disjoint sets of positions, joined into attention over both: the outputs weighted by
    each set's share of the softmax mass, exp(lse1) / (exp(lse1) + exp(lse2)) for the first."""
    return torch.lerp(out2, out1, torch.sigmoid(lse1 - lse2).unsqueeze(-1).to(out1.dtype))
