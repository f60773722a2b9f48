"""The base weights of one interpreter read onto a device in one of the modes: float (`native`), compact on fbgemm's
kernels (`weight_dtype`, through the converted-weights file) or as GGUF blocks multiplied as llama.cpp does
(`numerics="llamacpp"`).

Weights keep their GGUF names and `[out, in]` orientation, so a LoRA tensor `blk.N.M.weight.lora_a` adapts the
weight `blk.N.M.weight` directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import torch

from ...core.errors import BaseModelError, ConfigError
from ...core.options import Numerics, ResolvedNumerics, WeightDType
from ...core.progress import track
from ..model.arithmetic import Arithmetic, LlamaCppArithmetic, Product, TorchArithmetic
from .converted import ConvertedStore, CorruptStoreError
from ..ggml.dequant import RowTable
from ..model.families.base import Family, check_architecture
from ..ggml.blocks import BlockMatrix, block_matrix
from ..ggml.floats import NativeFloatMatrix, float_matrix
from ..ggml.c_kernels import NativeBlockMatrix, join_blocks, native_kernels
from ..model.packed import Matrix, check_kernel, compress, concat_stored, cpu_flags, pack, plain, stored_names
from .reader import BaseWeights, non_finite

__all__ = ["LoadedBase", "Product", "check_llamacpp_numerics", "llamacpp_numerics_problem", "torch_dtype"]

_LOG = logging.getLogger("pawfn")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EMBEDDINGS = frozenset({"token_embd.weight", "position_embd.weight"})


def llamacpp_numerics_problem(device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> str | None:
    """Why llama.cpp's arithmetic cannot run with these settings on this machine (None: it can)."""
    if device.type != "cpu" or dtype != torch.float32 or weight_dtype is not None:
        return (
            f"it runs on the CPU with dtype='float32' and no weight_dtype (it emulates llama.cpp's CPU arithmetic), not on "
            f"{device.type} with {str(dtype).removeprefix('torch.')}{'' if weight_dtype is None else f' and weight_dtype={weight_dtype!r}'}"
        )
    if not {"avx2", "fma"} <= cpu_flags():
        return (
            "it reproduces llama.cpp's x86 CPU kernels (AVX2 or AVX-512 with FMA), and /proc/cpuinfo lists neither here "
            "(an ARM CPU's llama.cpp rounds differently; other systems are not read)"
        )
    return None


def _family_problem(family: Family, head_dim: int, simd_width: int, source: object) -> str | None:
    if not family.llamacpp_numerics:
        return f"it does not cover the {family.name} family's operations yet"
    if head_dim % simd_width:  # llama.cpp then leaves tinyBLAS for other loops
        return f"it needs an attention head size that is a multiple of {simd_width} on this CPU, and {source}'s is {head_dim}"
    return None


def check_llamacpp_numerics(device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> None:
    """Refuse `numerics="llamacpp"` where it cannot run, naming the fix."""
    problem = llamacpp_numerics_problem(device, dtype, weight_dtype)
    if problem is not None:
        raise ConfigError(f"numerics='llamacpp' cannot run: {problem}; drop those options or use numerics='native'")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a `PawConfig.dtype` name."""
    return _DTYPES[name]


class LoadedBase:
    """Base weights of one interpreter on one device, read in one mode; read-only once loaded."""

    def __init__(
        self,
        weights: BaseWeights,
        device: torch.device,
        dtype: torch.dtype,
        progress: bool | None = False,
        weight_dtype: WeightDType | None = None,
        store: ConvertedStore | None = None,
        numerics: Numerics = "native",
    ) -> None:
        """Convert `weights` to `dtype` on `device`; `progress` as `PawConfig.progress` (a bar while tensors load);
        `weight_dtype` keeps the matrices compact on fbgemm's kernels (CPU; see `PawConfig.weight_dtype`), their
        converted form read from and written to `store` when given; `numerics="llamacpp"` keeps GGUF block
        matrices as their codes, multiplied as llama.cpp does (`PawConfig.numerics`; `auto` decides here, from the
        weights' types)."""
        self.architecture = weights.architecture
        self.family = weights.family
        self.device = device
        self.dtype = dtype
        self.weight_dtype: WeightDType | None = weight_dtype
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
        matrix_names = sorted(name for name, shape in self.shapes.items() if self._multiplied(name, shape))
        flags = cpu_flags()
        self.simd_width = 16 if "avx512f" in flags else 8
        """float32 lanes of llama.cpp's vector kernels on this CPU (AVX-512: 16, AVX2: 8)."""
        self.numerics: ResolvedNumerics = numerics if numerics != "auto" else self._auto_numerics(weights, matrix_names)
        numerics = self.numerics
        fused = [group for group in self.family.fused_groups(self.architecture) if all(n in self.shapes for n in group)]
        if numerics == "llamacpp":
            fused = []  # llama.cpp multiplies each weight on its own
        self.groups = {group: [self.shapes[name][0] for name in group] for group in fused}
        """Fused groups (names) and the output width of each member."""
        self.ggml_kernels = None
        """llama.cpp's products, attention and exp in C (`numerics="llamacpp"`; None: the torch emulation)."""
        self.biases_after: dict[str, torch.Tensor] = {}
        """Biases added after the side paths rather than inside the products (llama.cpp's graph), by matrix name."""
        if numerics == "llamacpp":
            check_llamacpp_numerics(device, dtype, weight_dtype)
            problem = _family_problem(self.family, self.architecture.head_dim, self.simd_width, weights.source)
            if problem is not None:
                raise ConfigError(f"numerics='llamacpp' cannot run: {problem}; use numerics='native'")
            self.ggml_kernels = native_kernels()
            self._load_llamacpp(weights, matrix_names, progress)
            self.biases_after = {name: bias for name in matrix_names if (bias := self.bias(name)) is not None}
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
        flash = self.family.llamacpp_flash_attention
        self.arithmetic: Arithmetic = LlamaCppArithmetic(self.simd_width, self.ggml_kernels, flash) if numerics == "llamacpp" else TorchArithmetic()
        """The arithmetic the passes run (`PawConfig.numerics`, decided)."""

    def _auto_numerics(self, weights: BaseWeights, matrix_names: list[str]) -> ResolvedNumerics:
        """`numerics="auto"`: llama.cpp's arithmetic for every GGUF base where it can run (F32 files too: there llama.cpp
        still quantizes a quantized adapter's inputs and keeps an f16 cache); torch's for Hugging Face folders, which
        llama.cpp does not read, and where llama.cpp's cannot run (said once in the log, with why)."""
        if weights.source.is_dir():
            return "native"
        problem = llamacpp_numerics_problem(self.device, self.dtype, self.weight_dtype) or _family_problem(
            self.family, self.architecture.head_dim, self.simd_width, weights.source
        )
        if problem is None:
            return "llamacpp"
        in_file = [name for name in matrix_names if not (self.tied and name == "output.weight")]  # tied: the table's
        types = {stored[1].name for name in in_file if (stored := weights.raw(name)) is not None}  # for the log only
        _LOG.info(
            "numerics auto: %s holds %s matrices, but llama.cpp's arithmetic cannot run (%s): running torch's, whose tokens "
            "may differ from the official runtime's on some inputs",
            weights.source.name,
            "/".join(sorted(types)),
            problem,
        )
        return "native"

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

    def _multiplied(self, name: str, shape: tuple[int, ...]) -> bool:
        """Whether tensor `name` is a matrix some linear layer multiplies (not a vector, embedding table or kernel)."""
        return len(shape) == 2 and name not in _EMBEDDINGS and not self.family.is_table(name)

    def bias(self, matrix: str) -> torch.Tensor | None:
        """Matrix `matrix`'s bias vector, if the base has one (inside the matrix's product except with
        `numerics="llamacpp"`, which adds it after the side paths)."""
        return self.tensors.get(matrix.removesuffix(".weight") + ".bias")

    def on_device(self, array: npt.NDArray[np.float32] | torch.Tensor) -> torch.Tensor:
        """`array` as a tensor on these weights' device, in their dtype."""
        return torch.as_tensor(array).to(device=self.device, dtype=self.dtype)

    def _load_plain(self, weights: BaseWeights, matrix_names: list[str], fused: list[tuple[str, ...]], progress: bool | None) -> None:
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
        self.tensors = {name: tensor for name, tensor in loaded.items() if not self._multiplied(name, tuple(tensor.shape))}
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
                    self.tensors[name] = self.on_device(read_one(name))
            elif name != "token_embd.weight" or rows is None or name in matrices:
                self._place_llamacpp(weights, name, self.on_device(read_one(name)), matrices)

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

    def _llamacpp_blocks(self, weights: BaseWeights, name: str) -> BlockMatrix | NativeBlockMatrix | NativeFloatMatrix | None:
        """Matrix `name` as its GGUF blocks, read from the file's bytes, where emulated (F32 and F16 too, on the C
        kernels); its block scales checked."""
        stored = weights.raw(name)
        if stored is None:
            return None
        floats = float_matrix(stored[0], stored[1], self.shapes[name][0], self.simd_width, self.ggml_kernels)
        if floats is not None:
            if not floats.all_finite():
                raise non_finite(weights.source, name)
            return floats
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
        self,
        weights: BaseWeights,
        weight_dtype: WeightDType,
        matrix_names: list[str],
        fused: list[tuple[str, ...]],
        store: ConvertedStore | None,
        progress: bool | None,
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

    def _convert(self, weights: BaseWeights, weight_dtype: WeightDType, matrix_names: list[str], progress: bool | None) -> dict[str, torch.Tensor]:
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
        self,
        read: Callable[[str], torch.Tensor],
        weight_dtype: WeightDType,
        matrix_names: list[str],
        fused: list[tuple[str, ...]],
        progress: bool | None,
        label: str,
    ) -> None:
        """Build every tensor and packed matrix from stored forms that `read` hands over (once each)."""
        for name, shape in self.shapes.items():
            if not self._multiplied(name, shape) and name not in self.rows:
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
