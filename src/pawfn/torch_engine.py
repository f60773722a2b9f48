"""The interpreter's forward pass in plain torch, with LoRA side paths and a reusable KV cache.

Weights keep their GGUF names and `[out, in]` orientation, so a LoRA tensor `blk.N.M.weight.lora_a`
adapts the weight `blk.N.M.weight` directly. The math follows llama.cpp's graphs for qwen3 and gpt2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .adapter import LoraAdapter
from .errors import AdapterError, BaseModelError
from .weights import Architecture, BaseWeights

__all__ = ["DeviceAdapter", "KVCache", "PrefixState", "TorchInterpreter", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CACHE_GRANULE = 256  # tokens; the KV buffer grows in steps of this size


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a `PawConfig.dtype` name."""
    return _DTYPES[name]


@dataclass(frozen=True)
class LoraWeights:
    """One LoRA side path on the device: y += scale * (x @ a.T) @ b.T."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float


class DeviceAdapter:
    """A program's LoRA adapter moved to the interpreter's device and dtype."""

    def __init__(self, pairs: Mapping[str, LoraWeights]) -> None:
        self.pairs = dict(pairs)

    def get(self, name: str) -> LoraWeights | None:
        """The side path of weight `name`, if adapted."""
        return self.pairs.get(name)

    def release(self) -> None:
        """Drop the adapter's tensors."""
        self.pairs.clear()


class KVCache:
    """Keys and values of one sequence: per layer `[n_kv_heads, capacity, head_dim]`, grown on demand."""

    def __init__(self, architecture: Architecture, device: torch.device, dtype: torch.dtype) -> None:
        self._arch = architecture
        self._device = device
        self._dtype = dtype
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def reserve(self, n_tokens: int) -> None:
        """Make room for `n_tokens` positions, keeping what is stored."""
        if n_tokens <= self.capacity:
            return
        capacity = -(-n_tokens // _CACHE_GRANULE) * _CACHE_GRANULE
        shape = (self._arch.n_kv_heads, capacity, self._arch.head_dim)
        keys = [torch.empty(shape, device=self._device, dtype=self._dtype) for _ in range(self._arch.n_layers)]
        values = [torch.empty(shape, device=self._device, dtype=self._dtype) for _ in range(self._arch.n_layers)]
        for layer in range(len(self.keys)):
            keys[layer][:, : self.capacity] = self.keys[layer]
            values[layer][:, : self.capacity] = self.values[layer]
        self.keys, self.values, self.capacity = keys, values, capacity

    def load(self, prefix: PrefixState) -> None:
        """Copy a program's cached prefix into positions `[0, prefix.length)`."""
        self.reserve(max(prefix.length, 1))
        for layer in range(self._arch.n_layers):
            self.keys[layer][:, : prefix.length] = prefix.keys[layer]
            self.values[layer][:, : prefix.length] = prefix.values[layer]


@dataclass(frozen=True)
class PrefixState:
    """A program's evaluated prompt prefix: its KV per layer and the logits after its last token."""

    token_ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    last_logits: torch.Tensor | None

    @property
    def length(self) -> int:
        """Prefix length in tokens."""
        return len(self.token_ids)


class TorchInterpreter:
    """Base weights of one interpreter on one device; read-only, shared by every program and slot."""

    def __init__(self, weights: BaseWeights, device: torch.device, dtype: torch.dtype) -> None:
        self.architecture = weights.architecture
        self.codec = weights.codec
        self.device = device
        self.dtype = dtype
        arch = self.architecture
        self.tensors: dict[str, torch.Tensor] = {}
        for name, array in weights.tensors():
            self.tensors[name] = torch.as_tensor(array).to(device=device, dtype=dtype)
        self._check_tensors(weights)
        if "output.weight" not in self.tensors:
            self.tensors["output.weight"] = self.tensors["token_embd.weight"]  # tied embeddings
        if arch.family == "qwen3":
            half = arch.head_dim // 2
            inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2.0 / arch.head_dim))
            self._inv_freq = inv_freq.to(torch.float32)

    def _check_tensors(self, weights: BaseWeights) -> None:
        arch = self.architecture
        hidden, kv = arch.hidden_size, arch.n_kv_heads * arch.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (arch.vocab_size, hidden)}
        for i in range(arch.n_layers):
            block = f"blk.{i}."
            if arch.family == "qwen3":
                shapes |= {
                    block + "attn_norm.weight": (hidden,),
                    block + "attn_q.weight": (arch.n_heads * arch.head_dim, hidden),
                    block + "attn_k.weight": (kv, hidden),
                    block + "attn_v.weight": (kv, hidden),
                    block + "attn_output.weight": (hidden, arch.n_heads * arch.head_dim),
                    block + "attn_q_norm.weight": (arch.head_dim,),
                    block + "attn_k_norm.weight": (arch.head_dim,),
                    block + "ffn_norm.weight": (hidden,),
                    block + "ffn_gate.weight": (arch.ffn_size, hidden),
                    block + "ffn_up.weight": (arch.ffn_size, hidden),
                    block + "ffn_down.weight": (hidden, arch.ffn_size),
                }
            else:
                for norm in ("attn_norm", "ffn_norm"):
                    shapes |= {block + norm + ".weight": (hidden,), block + norm + ".bias": (hidden,)}
                shapes |= {
                    block + "attn_qkv.weight": (3 * hidden, hidden),
                    block + "attn_qkv.bias": (3 * hidden,),
                    block + "attn_output.weight": (hidden, hidden),
                    block + "attn_output.bias": (hidden,),
                    block + "ffn_up.weight": (arch.ffn_size, hidden),
                    block + "ffn_up.bias": (arch.ffn_size,),
                    block + "ffn_down.weight": (hidden, arch.ffn_size),
                    block + "ffn_down.bias": (hidden,),
                }
        shapes["output_norm.weight"] = (hidden,)
        if arch.family == "gpt2":
            shapes["output_norm.bias"] = (hidden,)
            shapes["position_embd.weight"] = (arch.max_positions, hidden)
        for name, shape in shapes.items():
            tensor = self.tensors.get(name)
            if tensor is None:
                raise BaseModelError(weights.source, f"base weights lack tensor {name}")
            if tuple(tensor.shape) != shape:
                raise BaseModelError(
                    weights.source, f"tensor {name} has shape {tuple(tensor.shape)}, expected {shape}"
                )
        output = self.tensors.get("output.weight")
        if output is not None and tuple(output.shape) != (arch.vocab_size, hidden):
            raise BaseModelError(weights.source, f"tensor output.weight has shape {tuple(output.shape)}")

    def attach(self, adapter: LoraAdapter) -> DeviceAdapter:
        """Check `adapter` against these weights and move it to the device."""
        pairs: dict[str, LoraWeights] = {}
        for name, pair in adapter.pairs.items():
            weight = self.tensors.get(name)
            if weight is None:
                raise AdapterError(adapter.path, f"adapts {name}, which the base model does not have")
            out_features, in_features = weight.shape
            if pair.a.shape[1] != in_features or pair.b.shape[0] != out_features:
                raise AdapterError(
                    adapter.path,
                    f"{name}: lora_a {pair.a.shape} / lora_b {pair.b.shape} do not fit the base weight "
                    f"[{out_features}, {in_features}]; the adapter was made for another model size",
                )
            a = torch.as_tensor(pair.a).to(device=self.device, dtype=self.dtype)
            b = torch.as_tensor(pair.b).to(device=self.device, dtype=self.dtype)
            pairs[name] = LoraWeights(a=a, b=b, scale=pair.scale)
        return DeviceAdapter(pairs)

    def new_cache(self) -> KVCache:
        """An empty KV cache for this interpreter."""
        return KVCache(self.architecture, self.device, self.dtype)

    @torch.inference_mode()
    def prefill_prefix(self, token_ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        """Evaluate a program's prefix once and keep its KV (the adapter changes K and V, so it is per program)."""
        logits: torch.Tensor | None = None
        if token_ids:
            cache.reserve(len(token_ids))
            logits = self.forward(token_ids, 0, cache, adapter).clone()
        n = len(token_ids)
        keys = tuple(cache.keys[layer][:, :n].clone() for layer in range(self.architecture.n_layers)) if n else ()
        values = tuple(cache.values[layer][:, :n].clone() for layer in range(self.architecture.n_layers)) if n else ()
        if not n:
            empty = torch.empty(
                (self.architecture.n_kv_heads, 0, self.architecture.head_dim), device=self.device, dtype=self.dtype
            )
            keys = values = tuple(empty for _ in range(self.architecture.n_layers))
        return PrefixState(token_ids=tuple(token_ids), keys=keys, values=values, last_logits=logits)

    def _linear(self, x: torch.Tensor, name: str, adapter: DeviceAdapter, bias: str | None = None) -> torch.Tensor:
        y = F.linear(x, self.tensors[name], None if bias is None else self.tensors[bias])
        lora = adapter.get(name)
        if lora is not None:
            y = y + F.linear(F.linear(x, lora.a), lora.b) * lora.scale
        return y

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, start: int, cache: KVCache
    ) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KV, D]; returns [T, H * D] attending to positions [0, start + T)."""
        n_new = q.shape[0]
        end = start + n_new
        cache.keys[layer][:, start:end] = k.transpose(0, 1)
        cache.values[layer][:, start:end] = v.transpose(0, 1)
        keys = cache.keys[layer][:, :end]
        values = cache.values[layer][:, :end]
        arch = self.architecture
        mask: torch.Tensor | None = None
        if n_new > 1:
            query_pos = torch.arange(start, end, device=q.device).unsqueeze(1)
            key_pos = torch.arange(0, end, device=q.device).unsqueeze(0)
            mask = key_pos <= query_pos
        out = F.scaled_dot_product_attention(  # enable_gqa: KV heads are shared without copying them per query head
            q.transpose(0, 1), keys, values, attn_mask=mask, scale=1.0 / math.sqrt(arch.head_dim),
            enable_gqa=arch.n_kv_heads != arch.n_heads,
        )
        return out.transpose(0, 1).reshape(n_new, arch.n_heads * arch.head_dim)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """NEOX-style rotary embedding of x: [T, heads, D] at `positions` [T]."""
        angles = positions.to(torch.float32).unsqueeze(1) * self._inv_freq.to(x.device).unsqueeze(0)
        cos = torch.cos(angles).to(x.dtype).unsqueeze(1)
        sin = torch.sin(angles).to(x.dtype).unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _rms_norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.architecture.norm_eps) * self.tensors[weight]

    def _layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(
            x, (x.shape[-1],), self.tensors[prefix + ".weight"], self.tensors[prefix + ".bias"], self.architecture.norm_eps
        )

    @torch.inference_mode()
    def forward(self, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter) -> torch.Tensor:
        """Evaluate `token_ids` at positions `start...` into `cache`; returns the last position's logits [vocab]."""
        arch = self.architecture
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(token_ids), device=self.device)
        cache.reserve(start + len(token_ids))
        hidden = F.embedding(ids, self.tensors["token_embd.weight"])
        if arch.family == "gpt2":
            hidden = hidden + F.embedding(positions, self.tensors["position_embd.weight"])
        for layer in range(arch.n_layers):
            block = f"blk.{layer}."
            if arch.family == "qwen3":
                normed = self._rms_norm(hidden, block + "attn_norm.weight")
                n = len(token_ids)
                q = self._linear(normed, block + "attn_q.weight", adapter).view(n, arch.n_heads, arch.head_dim)
                k = self._linear(normed, block + "attn_k.weight", adapter).view(n, arch.n_kv_heads, arch.head_dim)
                v = self._linear(normed, block + "attn_v.weight", adapter).view(n, arch.n_kv_heads, arch.head_dim)
                q = self._rope(self._rms_norm(q, block + "attn_q_norm.weight"), positions)
                k = self._rope(self._rms_norm(k, block + "attn_k_norm.weight"), positions)
                attended = self._attention(q, k, v, layer, start, cache)
                hidden = hidden + self._linear(attended, block + "attn_output.weight", adapter)
                normed = self._rms_norm(hidden, block + "ffn_norm.weight")
                gate = F.silu(self._linear(normed, block + "ffn_gate.weight", adapter))
                up = self._linear(normed, block + "ffn_up.weight", adapter)
                hidden = hidden + self._linear(gate * up, block + "ffn_down.weight", adapter)
            else:
                normed = self._layer_norm(hidden, block + "attn_norm")
                qkv = self._linear(normed, block + "attn_qkv.weight", adapter, block + "attn_qkv.bias")
                n = len(token_ids)
                q, k, v = (part.view(n, arch.n_heads, arch.head_dim) for part in qkv.chunk(3, dim=-1))
                attended = self._attention(q, k, v, layer, start, cache)
                hidden = hidden + self._linear(
                    attended, block + "attn_output.weight", adapter, block + "attn_output.bias"
                )
                normed = self._layer_norm(hidden, block + "ffn_norm")
                up = F.gelu(self._linear(normed, block + "ffn_up.weight", adapter, block + "ffn_up.bias"), approximate="tanh")
                hidden = hidden + self._linear(up, block + "ffn_down.weight", adapter, block + "ffn_down.bias")
        last = hidden[-1:]
        if arch.family == "qwen3":
            last = self._rms_norm(last, "output_norm.weight")
        else:
            last = self._layer_norm(last, "output_norm")
        return F.linear(last, self.tensors["output.weight"])[0].float()
