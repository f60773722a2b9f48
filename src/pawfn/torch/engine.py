"""The interpreter's forward pass in plain torch, with LoRA side paths and a reusable KV cache.

Weights keep their GGUF names and `[out, in]` orientation, so a LoRA tensor `blk.N.M.weight.lora_a` adapts the
weight `blk.N.M.weight` directly. The per-architecture parts (embedding, block, final norm) come from the
model's family module; this module holds what every family shares.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from ..adapter import LoraAdapter, LoraHalf
from ..errors import AdapterError, BaseModelError, ConfigError
from ..options import Numerics, WeightDType
from ..progress import track
from .converted import ConvertedStore, CorruptStoreError
from .dequant import RowTable
from .ggml import (
    BlockMatrix, block_matrix, ggml_attention, ggml_gelu, ggml_layer_norm, ggml_rms_norm, ggml_rope, ggml_rope_table, ggml_silu_mul,
)
from .ggml_native import (
    NativeBlockMatrix, join_blocks, native_attention, native_kernels, native_rms_norm, native_rope, native_swiglu,
)
from .families import Architecture
from .families.base import check_architecture
from .kernels import Matrix, check_kernel, compress, cpu_flags, concat_stored, pack, plain, stored_names
from .weights import BaseWeights, non_finite

__all__ = [
    "DeviceAdapter", "GroupLora", "KVCache", "LoraWeights", "PrefixState", "StepRow", "TorchInterpreter", "torch_dtype",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EMBEDDINGS = frozenset({"token_embd.weight", "position_embd.weight"})
_CACHE_GRANULE = 256  # tokens; the KV buffer grows in steps of this size

Product = Matrix | BlockMatrix | NativeBlockMatrix
"""A base or LoRA matrix as multiplied: torch's arithmetic, or llama.cpp's on GGUF blocks (`numerics="llamacpp"`)."""


def check_llamacpp_numerics(device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> None:
    """Refuse `numerics="llamacpp"` where it cannot run, naming the fix."""
    if device.type != "cpu" or dtype != torch.float32 or weight_dtype is not None:
        raise ConfigError(
            f"numerics='llamacpp' runs on the CPU with dtype='float32' and no weight_dtype (it emulates llama.cpp's CPU "
            f"arithmetic), not on {device.type} with {str(dtype).removeprefix('torch.')}"
            f"{'' if weight_dtype is None else f' and weight_dtype={weight_dtype!r}'}; drop those options or use numerics='native'"
        )
    if not {"avx2", "fma"} <= cpu_flags():
        raise ConfigError(
            "numerics='llamacpp' reproduces llama.cpp's x86 CPU kernels (AVX2 or AVX-512 with FMA), and /proc/cpuinfo "
            "lists neither here (an ARM CPU's llama.cpp rounds differently; other systems are not read); use "
            "numerics='native'"
        )


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a `PawConfig.dtype` name."""
    return _DTYPES[name]


@dataclass(frozen=True)
class LoraWeights:
    """One LoRA side path on the device: y += scale * b(a(x)), `a` `[rank, in]` and `b` `[out, rank]` as matrices
    (`TorchInterpreter.attach` says which are packed)."""

    a: Product
    b: Product
    scale: float


@dataclass(frozen=True)
class GroupLora:
    """The side paths of a fused group whose members are all adapted: one product with their `a` matrices joined
    by rows, then each member's `b` on its slice."""

    a: Product
    ranks: list[int]
    b: tuple[Product, ...]
    scales: tuple[float, ...]


class DeviceAdapter:
    """A program's LoRA adapter moved to the interpreter's device and dtype."""

    def __init__(self, pairs: Mapping[str, LoraWeights], groups: Mapping[tuple[str, ...], GroupLora] | None = None) -> None:
        self.pairs = dict(pairs)
        self.groups = dict(groups or {})

    def get(self, name: str) -> LoraWeights | None:
        """The side path of weight `name`, if adapted."""
        return self.pairs.get(name)

    def release(self) -> None:
        """Drop the adapter's tensors."""
        self.pairs.clear()
        self.groups.clear()


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


@dataclass(frozen=True)
class StepRow:
    """One sequence's next token in a decode step: where it goes and the program whose side paths it takes."""

    token: int
    position: int
    cache: KVCache
    adapter: DeviceAdapter


class KVCache:
    """Keys and values of one sequence after its program's prefix: per layer `[n_kv_heads, capacity, head_dim]` for
    positions `prefix.length...`, grown on demand. The prefix's KV is read where it lies (every sequence of a
    program shares it; nothing is copied per sequence)."""

    def __init__(self, architecture: Architecture, device: torch.device, dtype: torch.dtype) -> None:
        self._arch = architecture
        self._device = device
        self._dtype = dtype
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.prefix: PrefixState | None = None
        """The program's prefix this sequence continues (None: the sequence starts at position 0)."""

    @property
    def offset(self) -> int:
        """The first position this cache stores (the prefix's length)."""
        return 0 if self.prefix is None else self.prefix.length

    def begin(self, prefix: PrefixState | None) -> None:
        """Start a new sequence after `prefix` (None: from position 0); what was stored is written over."""
        self.prefix = prefix

    def reserve(self, n_tokens: int) -> None:
        """Make room for `n_tokens` positions after the prefix, keeping what is stored."""
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

    def store(self, layer: int, position: int, keys: torch.Tensor, values: torch.Tensor) -> int:
        """Store `keys`/`values` [new, n_kv_heads, head_dim] of `layer` at `position...`; returns the stored length."""
        start = position - self.offset
        end = start + keys.shape[0]
        self.keys[layer][:, start:end] = keys.transpose(0, 1)
        self.values[layer][:, start:end] = values.transpose(0, 1)
        return end


class TorchInterpreter:
    """Base weights of one interpreter on one device; read-only, shared by every program and model copy."""

    def __init__(
        self, weights: BaseWeights, device: torch.device, dtype: torch.dtype, progress: bool | None = False,
        weight_dtype: WeightDType | None = None, store: ConvertedStore | None = None, numerics: Numerics = "native",
    ) -> None:
        """Convert `weights` to `dtype` on `device`; `progress` as `PawConfig.progress` (a bar while tensors load);
        `weight_dtype` keeps the matrices compact on fbgemm's kernels (CPU; see `PawConfig.weight_dtype`), their
        converted form read from and written to `store` when given; `numerics="llamacpp"` keeps GGUF block
        matrices as their codes, multiplied as llama.cpp does (`PawConfig.numerics`)."""
        self.architecture = weights.architecture
        self.family = weights.family
        self.device = device
        self.dtype = dtype
        self.weight_dtype = weight_dtype
        self.numerics: Numerics = numerics
        self.shapes = weights.shapes()
        self._check_shapes(weights)
        self.tied = "output.weight" not in self.shapes
        """The output matrix is the token embedding table."""
        if self.tied:
            self.shapes["output.weight"] = self.shapes["token_embd.weight"]
        self.tensors: dict[str, torch.Tensor] = {}
        """Vectors (norms, biases) and, where not decoded on demand, embedding tables, by GGUF name."""
        self.rows: dict[str, RowTable] = {}
        """Embedding tables decoded row by row from the base file (compact modes)."""
        self.matrices: dict[str, Product] = {}
        """Every matrix a linear layer multiplies, by GGUF name; a fused group under its first member's name."""
        matrix_names = sorted(name for name, shape in self.shapes.items() if len(shape) == 2 and name not in _EMBEDDINGS)
        fused = [group for group in self.family.fused_groups(self.architecture) if all(n in self.shapes for n in group)]
        if numerics == "llamacpp":
            fused = []  # llama.cpp multiplies each weight on its own
        self.groups = {group: [self.shapes[name][0] for name in group] for group in fused}
        """Fused groups (names) and the output width of each member."""
        flags = cpu_flags()
        self.simd_width = 16 if "avx512f" in flags else 8
        """float32 lanes of llama.cpp's vector kernels on this CPU (AVX-512: 16, AVX2: 8)."""
        self.ggml_kernels = None
        """llama.cpp's products, attention and exp in C (`numerics="llamacpp"`; None: the torch emulation)."""
        if numerics == "llamacpp":
            check_llamacpp_numerics(device, dtype, weight_dtype)
            if self.architecture.head_dim % self.simd_width:  # llama.cpp then leaves tinyBLAS for other loops
                raise ConfigError(
                    f"numerics='llamacpp' needs an attention head size that is a multiple of {self.simd_width} on this "
                    f"CPU, and {weights.source}'s is {self.architecture.head_dim}; use numerics='native'"
                )
            self.ggml_kernels = native_kernels()
            self._load_llamacpp(weights, matrix_names, progress)
            self._join_llamacpp(self.family.fused_groups(self.architecture))
            for matrix in self.matrices.values():
                if isinstance(matrix, NativeBlockMatrix):
                    matrix.prepack()
        elif weight_dtype is None:
            self._load_plain(weights, matrix_names, fused, progress)
        else:
            check_kernel(weight_dtype, device, dtype)
            self._load_compact(weights, weight_dtype, matrix_names, fused, store, progress)
        self.rope_frequencies = self.family.rope_frequencies(self.architecture)
        if self.rope_frequencies is not None:
            self.rope_frequencies = self.rope_frequencies.to(device)
        self.codec = weights.codec  # built meanwhile on a thread of its own

    def _check_shapes(self, weights: BaseWeights) -> None:
        """Every tensor the family needs, with its shape, before anything is converted; hyperparameters no file of
        this many tensors can have are refused first, before any per-layer expectation is built."""
        arch = self.architecture
        check_architecture(arch, weights.source, len(self.shapes))
        shapes = self.family.expected_shapes(arch)
        if "output.weight" in self.shapes:
            shapes["output.weight"] = (arch.vocab_size, arch.hidden_size)
        if arch.n_kv_heads <= 0 or arch.n_heads % arch.n_kv_heads:
            raise BaseModelError(weights.source, f"{arch.n_heads} attention heads do not share {arch.n_kv_heads} KV heads evenly")
        for name, shape in shapes.items():
            found = self.shapes.get(name)
            if found is None:
                raise BaseModelError(weights.source, f"base weights lack tensor {name}")
            if found != shape:
                raise BaseModelError(weights.source, f"tensor {name} has shape {found}, expected {shape}")

    def bias(self, matrix: str) -> torch.Tensor | None:
        """Matrix `matrix`'s bias vector, if the base has one (inside the matrix's product except with
        `numerics="llamacpp"`, which adds it after the side paths)."""
        return self.tensors.get(matrix.removesuffix(".weight") + ".bias")

    def _load_plain(
        self, weights: BaseWeights, matrix_names: list[str], fused: list[tuple[str, ...]], progress: bool | None
    ) -> None:
        loaded: dict[str, torch.Tensor] = {}
        group_of = {name: group for group in fused for name in group}
        pending: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}
        for name, array in track(weights.tensors(), f"loading {weights.source.name}", None, progress):
            tensor = torch.as_tensor(array).to(device=self.device, dtype=self.dtype)
            del array  # one float32 array at a time: the peak stays near the stored weights
            group = group_of.get(name)
            if group is None:
                loaded[name] = tensor
                continue
            parts = pending.setdefault(group, {})
            parts[name] = tensor
            del tensor
            if len(parts) == len(group):  # fused as soon as complete, so the parts' memory is reused at once
                # fusing rows is exact: each output is the same dot product
                self.matrices[group[0]] = plain(torch.cat([parts[member] for member in group]), None)
                del pending[group], parts
        self.tensors = {name: tensor for name, tensor in loaded.items() if tensor.ndim != 2 or name in _EMBEDDINGS}
        loaded.setdefault("output.weight", loaded["token_embd.weight"])
        for name in matrix_names:
            if name in loaded:
                self.matrices[name] = plain(loaded[name], self.bias(name))

    def _load_llamacpp(self, weights: BaseWeights, matrix_names: list[str], progress: bool | None) -> None:
        """Vectors and embeddings in float32; each matrix as its GGUF blocks where llama.cpp's arithmetic on them is
        emulated (Q4_0, Q8_0, Q6_K), read from the file's bytes, else in float32 (F32/F16 files: llama.cpp's float
        products, which torch's float32 products already match); biases stay vectors, added after the side paths
        as llama.cpp does. The token embeddings are decoded row by row from the file (ggml's get_rows)."""
        matrices = set(matrix_names)
        if self.tied:
            matrices.add("token_embd.weight")  # also the output matrix
        rows = weights.rows("token_embd.weight")
        if rows is not None:
            self.rows["token_embd.weight"] = rows
        read_one = weights.tensor
        if read_one is None:  # a folder of safetensors: every tensor in float32
            for name, array in track(weights.tensors(), f"loading {weights.source.name}", None, progress):
                self._place_llamacpp(weights, name, torch.as_tensor(array).to(device=self.device, dtype=self.dtype), matrices)
            return
        names = list(weights.shapes())  # the file's own (self.shapes also names a tied output matrix)
        for name in track(names, f"loading {weights.source.name}", len(names), progress):
            blocks = self._llamacpp_blocks(weights, name) if name in matrices else None
            if blocks is not None:
                self.matrices["output.weight" if name == "token_embd.weight" else name] = blocks
                if name == "token_embd.weight" and rows is None:
                    self.tensors[name] = self._on_device(read_one(name))
            elif name != "token_embd.weight" or rows is None or name in matrices:
                self._place_llamacpp(weights, name, self._on_device(read_one(name)), matrices)

    def _place_llamacpp(self, weights: BaseWeights, name: str, tensor: torch.Tensor, matrices: set[str]) -> None:
        """A float32 tensor where it belongs: a matrix (its blocks where emulated), the output matrix, or a vector."""
        if name == "token_embd.weight" and self.tied:
            self.matrices["output.weight"] = self._llamacpp_blocks(weights, name) or plain(tensor, None)
            if name not in self.rows:
                self.tensors[name] = tensor
        elif name in matrices:
            self.matrices[name] = self._llamacpp_blocks(weights, name) or plain(tensor, None)
        elif name not in self.rows:
            self.tensors[name] = tensor

    def _llamacpp_blocks(self, weights: BaseWeights, name: str) -> BlockMatrix | NativeBlockMatrix | None:
        """Matrix `name` as its GGUF blocks, read from the file's bytes, where emulated; its block scales checked."""
        stored = weights.raw(name)
        if stored is None:
            return None
        blocks = block_matrix(stored[0], stored[1], self.shapes[name][0], name.startswith("blk."), self.ggml_kernels is not None)
        if blocks is not None and not bool(torch.isfinite(blocks.scale).all()):
            raise non_finite(weights.source, name)
        return blocks

    def _join_llamacpp(self, groups: list[tuple[str, ...]]) -> None:
        """Groups of block matrices read by the C kernels joined into one product each (`join_blocks`: exact), so a
        layer quantizes each input once and makes fewer calls; others stay apart, as llama.cpp multiplies them."""
        for group in groups:
            members = [self.matrices.get(name) for name in group]
            natives = [m for m in members if isinstance(m, NativeBlockMatrix)]
            if len(natives) != len(group) or any(self.bias(name) is not None for name in group):
                continue
            joined = join_blocks(natives)
            if joined is None:
                continue
            for name in group[1:]:
                del self.matrices[name]
            self.matrices[group[0]] = joined
            self.groups[group] = [m.out_features for m in natives]

    def _load_compact(
        self, weights: BaseWeights, weight_dtype: WeightDType, matrix_names: list[str], fused: list[tuple[str, ...]],
        store: ConvertedStore | None, progress: bool | None,
    ) -> None:
        rows = weights.rows("token_embd.weight")
        if rows is not None:
            self.rows["token_embd.weight"] = rows
        stored = None if store is None else store.open()
        if store is not None and stored is not None:
            try:
                self._pack(stored.get, weight_dtype, matrix_names, fused, progress, weights.source.name)
                return
            except CorruptStoreError:
                store.discard()
                self.tensors.clear()
                self.matrices.clear()
        converted = self._convert(weights, weight_dtype, matrix_names, progress)
        if store is not None:
            store.save(converted)
        self._pack(converted.pop, weight_dtype, matrix_names, fused, progress, weights.source.name)

    def _convert(
        self, weights: BaseWeights, weight_dtype: WeightDType, matrix_names: list[str], progress: bool | None
    ) -> dict[str, torch.Tensor]:
        """Every tensor in its stored form: matrices compressed, the token embeddings float16 unless decoded on
        demand, the rest (vectors, GPT-2's position table) float32."""
        matrices, tied = set(matrix_names), self.tied
        converted: dict[str, torch.Tensor] = {}
        for name, array in track(weights.tensors(), f"converting {weights.source.name}", None, progress):
            tensor = torch.as_tensor(array)
            if name in matrices:
                converted |= compress(name, tensor, weight_dtype)
            elif name == "token_embd.weight":
                if tied:
                    converted |= compress("output.weight", tensor, weight_dtype)
                if name not in self.rows:
                    converted[name] = tensor.to(torch.float16)  # rows are looked up, then widened exactly
            else:
                converted[name] = tensor.to(torch.float32)
            del tensor, array  # one float32 tensor at a time
        return converted

    def _pack(
        self, read: Callable[[str], torch.Tensor], weight_dtype: WeightDType, matrix_names: list[str],
        fused: list[tuple[str, ...]], progress: bool | None, label: str,
    ) -> None:
        """Build every tensor and packed matrix from stored forms that `read` hands over (once each)."""
        for name, shape in self.shapes.items():
            if (len(shape) != 2 or name in _EMBEDDINGS) and name not in self.rows:
                self.tensors[name] = read(name).to(torch.float16 if name == "token_embd.weight" else torch.float32).clone()
        in_groups = {name for group in fused for name in group}
        jobs: list[tuple[str, ...]] = [*fused, *((name,) for name in matrix_names if name not in in_groups)]

        def build(group: tuple[str, ...]) -> Matrix:
            first = group[0]
            parts = [{name: read(name) for name in stored_names(member, weight_dtype)} for member in group]
            if len(parts) == 1:
                return pack(first, parts[0], weight_dtype, self.bias(first))
            return pack(first, concat_stored(parts, group, weight_dtype), weight_dtype, None)

        # fbgemm's packing is single-threaded and releases the GIL: pack on every thread torch may use
        with ThreadPoolExecutor(max_workers=max(1, min(4, torch.get_num_threads()))) as pool:
            for group, matrix in track(zip(jobs, pool.map(build, jobs), strict=True), f"packing {label}", len(jobs), progress):
                self.matrices[group[0]] = matrix

    def attach(self, adapter: LoraAdapter) -> DeviceAdapter:
        """Check `adapter` against these weights and move it to the device."""
        pairs: dict[str, LoraWeights] = {}
        for name, pair in adapter.pairs.items():
            shape = self.shapes.get(name)
            if shape is None or len(shape) != 2:
                raise AdapterError(adapter.path, f"adapts {name}, which the base model does not have")
            out_features, in_features = shape
            if pair.a_half.shape[1] != in_features or pair.b_half.shape[0] != out_features:
                raise AdapterError(
                    adapter.path,
                    f"{name}: lora_a {pair.a_half.shape} / lora_b {pair.b_half.shape} do not fit the base weight "
                    f"[{out_features}, {in_features}]; the adapter was made for another model size",
                )
        groups: dict[tuple[str, ...], GroupLora] = {}
        if self.numerics == "llamacpp":
            for name, pair in adapter.pairs.items():
                pairs[name] = LoraWeights(
                    a=self._llamacpp_lora(pair.a_half, pair.quantized), b=self._llamacpp_lora(pair.b_half, pair.quantized),
                    scale=pair.scale,
                )
            for group in self.groups:
                joined_lora = _joined_lora([pairs[name] for name in group if name in pairs], len(group))
                if joined_lora is not None:
                    groups[group] = joined_lora
            return DeviceAdapter(pairs, groups)
        for group in self.groups:  # a group adapted throughout keeps its `a` matrices joined, and only so
            if all(name in adapter.pairs for name in group):
                joined = torch.cat([torch.as_tensor(adapter.pairs[name].a) for name in group])
                groups[group] = GroupLora(
                    a=self._lora_a(joined), ranks=[adapter.pairs[name].a.shape[0] for name in group],
                    b=tuple(plain(self._on_device(adapter.pairs[name].b), None) for name in group),
                    scales=tuple(adapter.pairs[name].scale for name in group),
                )
        grouped = {name for group in groups for name in group}
        for name, pair in adapter.pairs.items():
            if name not in grouped:
                pairs[name] = LoraWeights(
                    a=self._lora_a(torch.as_tensor(pair.a)), b=plain(self._on_device(pair.b), None), scale=pair.scale
                )
        return DeviceAdapter(pairs, groups)

    def _llamacpp_lora(self, half: LoraHalf, quantized: bool) -> Product:
        """One half of a side path for `numerics="llamacpp"`: its blocks where the pair is quantized, else float32
        (dequantized only then)."""
        matrix = block_matrix(half.data, half.qtype, half.shape[0], native=self.ggml_kernels is not None) if quantized else None
        return plain(self._on_device(half.values), None) if matrix is None else matrix

    def _on_device(self, array: npt.NDArray[np.float32] | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(array).to(device=self.device, dtype=self.dtype)

    def _lora_a(self, weight: torch.Tensor) -> Matrix:
        """A LoRA `a` matrix: plain in the exact mode; packed float16 in the compact ones (half of float32's memory,
        ~5 ms faster per Qwen3-0.6B decode step here). `b` matrices stay plain: fbgemm pads a packed matrix's
        64-wide input to its blocks (a packed `[3072, 64]` took 7.7x its float16 bytes)."""
        if self.weight_dtype is None:
            return plain(self._on_device(weight), None)
        return pack("lora_a", {"lora_a": weight.to(torch.float16)}, "float16", None)

    def new_cache(self) -> KVCache:
        """An empty KV cache for this interpreter (f16 with `numerics="llamacpp"`, like the official runtime's)."""
        return KVCache(self.architecture, self.device, torch.float16 if self.numerics == "llamacpp" else self.dtype)

    @torch.inference_mode()
    def prefill_prefix(self, token_ids: list[int], adapter: DeviceAdapter, cache: KVCache) -> PrefixState:
        """Evaluate a program's prefix once and keep its KV (the adapter changes K and V, so it is per program)."""
        arch, n = self.architecture, len(token_ids)
        logits: torch.Tensor | None = None
        cache.begin(None)
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
        cache.reserve(start - cache.offset + len(token_ids))
        ops = _ForwardPass(self, adapter, cache, start)
        hidden = self.family.embed(ops, ids, positions)
        for layer in range(self.architecture.n_layers):
            hidden = self.family.block(ops, layer, hidden, positions)
        last = self.family.final_norm(ops, hidden[-1:])
        return self.matrices["output.weight"](last)[0].float()

    @torch.inference_mode()
    def step(self, rows: list[StepRow]) -> torch.Tensor:
        """One decode step for several sequences (any programs): each row's token at its position into its cache;
        returns logits [rows, vocab], each row bit-identical to the row stepped alone. Rows of one program should
        be adjacent: each run of them takes the program's side paths in one product."""
        ids = torch.tensor([row.token for row in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([row.position for row in rows], dtype=torch.long, device=self.device)
        for row in rows:
            row.cache.reserve(row.position - row.cache.offset + 1)
        ops = _StepPass(self, rows)
        hidden = self.family.embed(ops, ids, positions)
        for layer in range(self.architecture.n_layers):
            hidden = self.family.block(ops, layer, hidden, positions)
        return self.matrices["output.weight"].rows(self.family.final_norm(ops, hidden)).float()


class _Pass:
    """What every pass's `Ops` share: the base's tensors, embeddings, norms, one rotary table per pass, and the
    linear layers with their side paths, taken per segment of rows of one program (`_product` multiplies)."""

    def __init__(self, interpreter: TorchInterpreter, segments: list[tuple[int, int | None, DeviceAdapter]]) -> None:
        self.architecture = interpreter.architecture
        self._interpreter = interpreter
        self._tensors = interpreter.tensors
        self._matrices = interpreter.matrices
        self._groups = interpreter.groups
        self._segments = segments
        """Runs of rows of one program: (start, end or None for all, adapter)."""
        self._rotation: tuple[torch.Tensor, torch.Tensor] | None = None
        self._llamacpp = interpreter.numerics == "llamacpp"

    _by_rows = False
    """Products row by row (`Matrix.rows`): each row's numbers independent of the other rows'."""

    def _product(self, matrix: Product, x: torch.Tensor) -> torch.Tensor:
        return matrix.rows(x) if self._by_rows else matrix(x)

    def output_rows(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """`x` [T, ...] kept to the rows whose outputs the pass returns, from the last layer's attention output on
        (llama.cpp drops the other rows there, so the feed-forward's kernels see one row; `numerics="llamacpp"`)."""
        return x

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if self._llamacpp:
            return self._llamacpp_linear(x, name)
        y = self._product(self._matrices[name], x)
        for start, end, adapter in self._segments:
            self._add_side_path(y, x, start, end, adapter, name)
        return y

    def _llamacpp_linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """llama.cpp's graph: the base product, each side path as b(a(x)) scaled then added, then the bias."""
        y = self._product(self._matrices[name], x)
        for start, end, adapter in self._segments:
            self._add_side_path(y, x, start, end, adapter, name)
        bias = self._interpreter.bias(name)
        return y if bias is None else y + bias

    def linears(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        widths = self._groups.get(names)
        if widths is None:
            return [self.linear(x, name) for name in names]
        outputs = list(torch.split(self._product(self._matrices[names[0]], x), widths, dim=-1))
        for start, end, adapter in self._segments:
            group = adapter.groups.get(names)
            if group is None:
                for y, name in zip(outputs, names, strict=True):
                    self._add_side_path(y, x, start, end, adapter, name)
                continue
            projected = torch.split(self._product(group.a, x[start:end]), group.ranks, dim=-1)
            for y, p, b, scale in zip(outputs, projected, group.b, group.scales, strict=True):
                b.accumulate(y[start:end], p, scale, self._by_rows)
        return outputs

    def _add_side_path(
        self, y: torch.Tensor, x: torch.Tensor, start: int, end: int | None, adapter: DeviceAdapter, name: str
    ) -> None:
        """Add weight `name`'s side path of `adapter`, if adapted, to rows `start:end` of its product `y`."""
        lora = adapter.get(name)
        if lora is None:
            return
        if self._llamacpp and not isinstance(lora.b, (BlockMatrix, NativeBlockMatrix)):
            # llama.cpp's graph: b(a(x)), then scaled, then added (`Matrix.accumulate` would fuse the scaling in)
            side = self._product(lora.b, self._product(lora.a, x[start:end]))
            y[start:end] = y[start:end] + side * torch.tensor(lora.scale, dtype=torch.float32)
            return
        lora.b.accumulate(y[start:end], self._product(lora.a, x[start:end]), lora.scale, self._by_rows)

    def embedding(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        rows = self._interpreter.rows.get(name)
        if rows is not None:
            decoded = rows(ids)
            if not bool(torch.isfinite(decoded).all()):  # rows decoded on demand were not checked at load
                raise BaseModelError(None, f"base tensor {name} holds non-finite values (NaN or infinity); the file is damaged")
            return decoded.to(self._interpreter.dtype)
        return F.embedding(ids, self._tensors[name]).to(self._interpreter.dtype)

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if not self._llamacpp:
            return F.silu(gate) * up
        kernels = self._interpreter.ggml_kernels
        if kernels is None:
            return ggml_silu_mul(gate, up, self._interpreter.simd_width)
        return native_swiglu(kernels, gate, up, self._interpreter.simd_width)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_gelu(x) if self._llamacpp else F.gelu(x, approximate="tanh")

    def rms_norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        if self._llamacpp:
            kernels = self._interpreter.ggml_kernels
            if kernels is not None:
                return native_rms_norm(kernels, x, self._tensors[weight], self.architecture.norm_eps)
            return ggml_rms_norm(x, self._tensors[weight], self.architecture.norm_eps)
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.architecture.norm_eps) * self._tensors[weight]

    def layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        weight, bias = self._tensors[prefix + ".weight"], self._tensors[prefix + ".bias"]
        if self._llamacpp:
            return ggml_layer_norm(x, weight, bias, self.architecture.norm_eps, self._interpreter.simd_width)
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.architecture.norm_eps)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._rotation is None:  # one table per pass: every layer rotates the same positions
            self._rotation = self._rotation_table(positions, x.dtype)
        cos, sin = self._rotation
        if self._llamacpp:
            kernels = self._interpreter.ggml_kernels
            if kernels is not None and x.dim() == 3 and cos.shape[0] == x.shape[0]:
                return native_rope(kernels, x, cos, sin)
            return ggml_rope(x, cos, sin)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _rotation_table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, D/2] of `positions` [T]."""
        frequencies = self._interpreter.rope_frequencies
        if frequencies is None:
            raise BaseModelError(None, f"family {self.architecture.family!r} has no rotary embedding")
        if self._llamacpp:
            return ggml_rope_table(positions, self.architecture.head_dim, self.architecture.rope_theta)
        angles = positions.to(torch.float32).unsqueeze(1) * frequencies.unsqueeze(0)
        return torch.cos(angles).to(dtype).unsqueeze(1), torch.sin(angles).to(dtype).unsqueeze(1)


class _ForwardPass(_Pass):
    """The `Ops` of one forward pass: the shared weights, one program's adapter and one sequence's KV cache."""

    def __init__(self, interpreter: TorchInterpreter, adapter: DeviceAdapter, cache: KVCache, start: int) -> None:
        super().__init__(interpreter, [(0, None, adapter)])
        self._cache = cache
        self._start = start
        self._mask: torch.Tensor | None = None

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        n_new, arch = q.shape[0], self.architecture
        if n_new > 1 and self._mask is None:  # one mask per pass: every layer attends over the same positions
            group, end = arch.n_heads // arch.n_kv_heads, self._start - self._cache.offset + n_new
            query_at = torch.arange(end - n_new, end, device=q.device).unsqueeze(1)
            hidden = torch.arange(0, end, device=q.device).unsqueeze(0) > query_at
            self._mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, -math.inf)
            self._mask = self._mask.repeat(group, 1)
        if self._llamacpp:
            return _attend_llamacpp(self._cache, layer, self._start, q, k, v, self._interpreter)
        return _attend(arch, self._cache, layer, self._start, q, k, v, self._mask)

    def output_rows(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return x[-1:] if self._llamacpp and layer == self.architecture.n_layers - 1 else x


class _StepPass(_Pass):
    """The `Ops` of one decode step: one new token per row, each row with its own cache, position and program.
    Every product goes through `Matrix.rows`, so a row's numbers never depend on the other rows."""

    def __init__(self, interpreter: TorchInterpreter, rows: list[StepRow]) -> None:
        segments: list[tuple[int, int | None, DeviceAdapter]] = []
        for index, row in enumerate(rows):
            if segments and segments[-1][2] is row.adapter:
                segments[-1] = (segments[-1][0], index + 1, row.adapter)
            else:
                segments.append((index, index + 1, row.adapter))
        super().__init__(interpreter, segments)
        self._rows = rows

    _by_rows = True

    def _rotation_table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # row by row: a vectorized cos/sin may round a lane differently from a lone value's
        one_row = super()._rotation_table
        tables = [one_row(positions[i : i + 1], dtype) for i in range(len(self._rows))]
        return torch.cat([cos for cos, _ in tables]), torch.cat([sin for _, sin in tables])

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """Row by row (the kernels round by shape), over the row's own positions and its program's prefix, which
        every row of the program reads in place: rows of one program after one another find it in the CPU's cache."""
        arch = self.architecture
        if self._llamacpp:
            return torch.cat([
                _attend_llamacpp(row.cache, layer, row.position, q[i : i + 1], k[i : i + 1], v[i : i + 1], self._interpreter)
                for i, row in enumerate(self._rows)
            ])
        return torch.cat([
            _attend(arch, row.cache, layer, row.position, q[i : i + 1], k[i : i + 1], v[i : i + 1], None)
            for i, row in enumerate(self._rows)
        ])


def _attend(
    arch: Architecture, cache: KVCache, layer: int, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Store k/v [new, kv_heads, D] at `position...` in `cache`, then attend q [new, heads, D] over the cache's own
    positions (additive `mask`) and its program's prefix, read in place, merged: [new, heads * D]."""
    end = cache.store(layer, position, k, v)
    queries = _grouped(arch, q)
    out, lse = partial_attention(arch, queries, cache.keys[layer][None, :, :end], cache.values[layer][None, :, :end], mask)
    prefix = cache.prefix
    if prefix is not None and prefix.length:
        shared = partial_attention(arch, queries, prefix.keys[layer][None], prefix.values[layer][None], None)
        out = merge_attention(*shared, out, lse)
    return _ungrouped(arch, out)


def _joined_lora(members: list[LoraWeights], size: int) -> GroupLora | None:
    """A fused group's side paths (`numerics="llamacpp"`, every one of its `size` members adapted) with their `a`
    halves joined on the C kernels, or None where they cannot be."""
    a_halves = [lora.a for lora in members if isinstance(lora.a, NativeBlockMatrix)]
    blocks_b = all(isinstance(lora.b, NativeBlockMatrix) for lora in members)  # their accumulate rounds as llama.cpp
    joined = join_blocks(a_halves) if len(a_halves) == size and blocks_b else None
    if joined is None:
        return None
    return GroupLora(a=joined, ranks=[a.out_features for a in a_halves], b=tuple(lora.b for lora in members),
                     scales=tuple(lora.scale for lora in members))


def _attend_llamacpp(
    cache: KVCache, layer: int, position: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    interpreter: TorchInterpreter,
) -> torch.Tensor:
    """`_attend` as llama.cpp computes it on its f16 cache (`ggml_attention`); the prefix's KV joins the cache's."""
    end = cache.store(layer, position, k, v)
    keys, values = cache.keys[layer][:, :end], cache.values[layer][:, :end]
    prefix = cache.prefix
    shared = (prefix.keys[layer], prefix.values[layer]) if prefix is not None and prefix.length else None
    if interpreter.ggml_kernels is not None:
        return native_attention(interpreter.ggml_kernels, q, shared, keys, values, interpreter.simd_width)
    if shared is not None:
        keys, values = torch.cat([shared[0], keys], dim=1), torch.cat([shared[1], values], dim=1)
    return ggml_attention(q, keys, values, interpreter.simd_width)


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
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            queries, keys, values, 0.0, False, attn_mask=mask, scale=scale
        )
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
