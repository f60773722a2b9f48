"""The interpreter's forward pass in plain torch, with LoRA side paths and a reusable KV cache.

Weights keep their GGUF names and `[out, in]` orientation, so a LoRA tensor `blk.N.M.weight.lora_a` adapts the
weight `blk.N.M.weight` directly. The per-architecture parts (embedding, block, final norm) come from the
model's family module; this module holds what every family shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..adapter import LoraAdapter
from ..errors import AdapterError, BaseModelError, ConfigError
from ..options import WeightDType
from ..progress import track
from .families import Architecture
from .weights import BaseWeights

__all__ = ["DeviceAdapter", "KVCache", "LoraWeights", "PrefixState", "TorchInterpreter", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EMBEDDINGS = frozenset({"token_embd.weight", "position_embd.weight"})
_CACHE_GRANULE = 256  # tokens; the KV buffer grows in steps of this size


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a `PawConfig.dtype` name."""
    return _DTYPES[name]


def _check_fp16_kernel(device: torch.device, dtype: torch.dtype) -> None:
    if device.type != "cpu" or dtype != torch.float32:
        raise ConfigError(
            f"weight_dtype='float16' runs on the CPU with dtype='float32' (fbgemm's fp16 kernel), not on "
            f"{device.type} with {dtype}; on a GPU use dtype='float16' or 'bfloat16' instead"
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ConfigError("weight_dtype='float16' needs torch's fbgemm kernels (x86 CPUs); leave weight_dtype unset")


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


class TorchInterpreter:
    """Base weights of one interpreter on one device; read-only, shared by every program and model copy."""

    def __init__(
        self, weights: BaseWeights, device: torch.device, dtype: torch.dtype, progress: bool | None = False,
        weight_dtype: WeightDType | None = None,
    ) -> None:
        """Convert `weights` to `dtype` on `device`; `progress` as `PawConfig.progress` (a bar while tensors load);
        `weight_dtype` "float16" keeps the matrices in float16 (CPU, fbgemm; see `PawConfig.weight_dtype`)."""
        self.architecture = weights.architecture
        self.family = weights.family
        self.codec = weights.codec
        self.device = device
        self.dtype = dtype
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.packed: dict[str, torch.Tensor] = {}
        """Matrices packed for fbgemm's fp16 kernel (weight_dtype float16), by GGUF name."""
        compact = weight_dtype == "float16"
        if compact:
            _check_fp16_kernel(device, dtype)
        tied_output: torch.Tensor | None = None
        for name, array in track(weights.tensors(), f"loading {weights.source.name}", None, progress):
            tensor = torch.as_tensor(array)
            self.shapes[name] = tuple(tensor.shape)
            if compact and name in _EMBEDDINGS:
                self.tensors[name] = tensor.to(torch.float16)  # rows are looked up, then widened exactly
                if name == "token_embd.weight":  # packed now, while its float32 values are at hand
                    tied_output = torch.ops.quantized.linear_prepack_fp16(tensor.float(), None)
            elif compact and tensor.ndim == 2:
                self.packed[name] = torch.ops.quantized.linear_prepack_fp16(tensor.float(), None)
            else:
                self.tensors[name] = tensor.to(device=device, dtype=dtype)
            del tensor, array  # one float32 tensor at a time: the peak stays near the stored weights
        self._check_tensors(weights)
        if "output.weight" not in self.shapes:  # tied embeddings
            self.shapes["output.weight"] = self.shapes["token_embd.weight"]
            if tied_output is not None:
                self.packed["output.weight"] = tied_output
            else:
                self.tensors["output.weight"] = self.tensors["token_embd.weight"]
        self.rope_frequencies = self.family.rope_frequencies(self.architecture)

    def _check_tensors(self, weights: BaseWeights) -> None:
        arch = self.architecture
        shapes = self.family.expected_shapes(arch)
        if "output.weight" in self.shapes:
            shapes["output.weight"] = (arch.vocab_size, arch.hidden_size)
        for name, shape in shapes.items():
            found = self.shapes.get(name)
            if found is None:
                raise BaseModelError(weights.source, f"base weights lack tensor {name}")
            if found != shape:
                raise BaseModelError(weights.source, f"tensor {name} has shape {found}, expected {shape}")

    def matmul(self, x: torch.Tensor, name: str, bias: str | None = None) -> torch.Tensor:
        """`x @ W.T (+ bias)` for base matrix `name`, on its packed fp16 kernel when it has one."""
        packed = self.packed.get(name)
        if packed is None:
            return F.linear(x, self.tensors[name], None if bias is None else self.tensors[bias])
        y: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x, packed)
        return y if bias is None else y + self.tensors[bias]

    def attach(self, adapter: LoraAdapter) -> DeviceAdapter:
        """Check `adapter` against these weights and move it to the device."""
        pairs: dict[str, LoraWeights] = {}
        for name, pair in adapter.pairs.items():
            shape = self.shapes.get(name)
            if shape is None or len(shape) != 2:
                raise AdapterError(adapter.path, f"adapts {name}, which the base model does not have")
            out_features, in_features = shape
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
        arch, n = self.architecture, len(token_ids)
        logits: torch.Tensor | None = None
        if n:
            logits = self.forward(token_ids, 0, cache, adapter).clone()
            keys = tuple(cache.keys[layer][:, :n].clone() for layer in range(arch.n_layers))
            values = tuple(cache.values[layer][:, :n].clone() for layer in range(arch.n_layers))
        else:
            empty = torch.empty((arch.n_kv_heads, 0, arch.head_dim), device=self.device, dtype=self.dtype)
            keys = values = tuple(empty for _ in range(arch.n_layers))
        return PrefixState(token_ids=tuple(token_ids), keys=keys, values=values, last_logits=logits)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], start: int, cache: KVCache, adapter: DeviceAdapter) -> torch.Tensor:
        """Evaluate `token_ids` at positions `start...` into `cache`; returns the last position's logits [vocab]."""
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(token_ids), device=self.device)
        cache.reserve(start + len(token_ids))
        ops = _ForwardPass(self, adapter, cache, start)
        hidden = self.family.embed(ops, ids, positions)
        for layer in range(self.architecture.n_layers):
            hidden = self.family.block(ops, layer, hidden, positions)
        last = self.family.final_norm(ops, hidden[-1:])
        return self.matmul(last, "output.weight")[0].float()


class _ForwardPass:
    """The `Ops` of one forward pass: the shared weights, one program's adapter and one sequence's KV cache."""

    def __init__(self, interpreter: TorchInterpreter, adapter: DeviceAdapter, cache: KVCache, start: int) -> None:
        self.architecture = interpreter.architecture
        self._interpreter = interpreter
        self._tensors = interpreter.tensors
        self._adapter = adapter
        self._cache = cache
        self._start = start

    def embedding(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        return F.embedding(ids, self._tensors[name]).to(self._interpreter.dtype)

    def linear(self, x: torch.Tensor, name: str, bias: str | None = None) -> torch.Tensor:
        y = self._interpreter.matmul(x, name, bias)
        lora = self._adapter.get(name)
        if lora is not None:
            y = y + F.linear(F.linear(x, lora.a), lora.b) * lora.scale
        return y

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        n_new, start, arch, cache = q.shape[0], self._start, self.architecture, self._cache
        end = start + n_new
        cache.keys[layer][:, start:end] = k.transpose(0, 1)
        cache.values[layer][:, start:end] = v.transpose(0, 1)
        mask: torch.Tensor | None = None
        if n_new > 1:
            query_pos = torch.arange(start, end, device=q.device).unsqueeze(1)
            mask = torch.arange(0, end, device=q.device).unsqueeze(0) <= query_pos
        out = F.scaled_dot_product_attention(  # enable_gqa: KV heads are shared without copying them per query head
            q.transpose(0, 1), cache.keys[layer][:, :end], cache.values[layer][:, :end], attn_mask=mask,
            scale=1.0 / math.sqrt(arch.head_dim), enable_gqa=arch.n_kv_heads != arch.n_heads,
        )
        return out.transpose(0, 1).reshape(n_new, arch.n_heads * arch.head_dim)

    def rms_norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.architecture.norm_eps) * self._tensors[weight]

    def layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        weight, bias = self._tensors[prefix + ".weight"], self._tensors[prefix + ".bias"]
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.architecture.norm_eps)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        frequencies = self._interpreter.rope_frequencies
        if frequencies is None:
            raise BaseModelError(None, f"family {self.architecture.family!r} has no rotary embedding")
        angles = positions.to(torch.float32).unsqueeze(1) * frequencies.to(x.device).unsqueeze(0)
        cos = torch.cos(angles).to(x.dtype).unsqueeze(1)
        sin = torch.sin(angles).to(x.dtype).unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
