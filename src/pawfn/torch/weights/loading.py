"""The base weights of one interpreter read onto a device (`DeviceWeights`), kept as the arithmetic chosen for them
multiplies them: floats (torch's arithmetic), compact on fbgemm's kernels (`weight_dtype`, through the
converted-weights file) or GGUF blocks multiplied as llama.cpp does (llama.cpp's arithmetic).

Weights keep their GGUF names and `[out, in]` orientation, so a LoRA tensor `blk.N.M.weight.lora_a` adapts the
weight `blk.N.M.weight` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from ...core.errors import BaseModelError
from ...core.models import InterpreterModel
from ...core.options import Numerics, WeightDType
from ...core.progress import track
from ...formats.ggufio import GGUFFile, GGUFFormatError
from ...formats.tokenizer import TextCodec
from ..ggml.native_blocks import NativeBlockMatrix, join_blocks
from ..ggml.dequant import RowTable
from ..model.arithmetic import Arithmetic, Product, open_arithmetic
from ..model.families import family_for
from ..model.families.base import check_architecture
from ..model.packed import Matrix, check_kernel, compress, concat_stored, pack, plain, stored_names
from .converted import ConvertedStore, CorruptStoreError
from .reader import BaseWeights, non_finite

__all__ = ["DeviceWeights", "Product", "load_device_weights", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EMBEDDINGS = frozenset({"token_embd.weight", "position_embd.weight"})


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a `PawConfig.dtype` name."""
    return _DTYPES[name]


def gguf_head_dim(source: Path, model: type[InterpreterModel]) -> int | None:
    """The attention head size a GGUF base's header gives `model` (None where it cannot be read: its load says why)."""
    try:
        stat = source.stat()
        return _gguf_head_dim(source, stat.st_mtime_ns, stat.st_size, model)
    except (OSError, GGUFFormatError, BaseModelError, KeyError, ValueError):
        return None


_HEAD_DIMS: dict[tuple[Path, int, int, str], int] = {}


def _gguf_head_dim(source: Path, mtime_ns: int, size: int, model: type[InterpreterModel]) -> int:
    """The attention head size in a GGUF base's header (kept while the file is unchanged: a header holds the vocabulary)."""
    key = (source, mtime_ns, size, model.__name__)
    if key not in _HEAD_DIMS:
        file = GGUFFile(source)
        _HEAD_DIMS[key] = family_for(model).architecture_from_gguf(file, file.tensor_shape("token_embd.weight")[0]).head_dim
    return _HEAD_DIMS[key]


def load_device_weights(
    weights: BaseWeights,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool | None = False,
    weight_dtype: WeightDType | None = None,
    store: ConvertedStore | None = None,
    numerics: Numerics = "native",
) -> DeviceWeights:
    """`weights` on `device`: shapes checked, the arithmetic chosen (`PawConfig.numerics`; `auto` decided here),
    every matrix kept as that arithmetic multiplies it; `progress` as `PawConfig.progress`; `weight_dtype` keeps the
    matrices compact on fbgemm's kernels (CPU), their converted form read from and written to `store` when given."""
    loaded = DeviceWeights(weights, device, dtype, weight_dtype)

    def held() -> str:  # the file's matrix types, for the log line of a fallback only
        names = [name for name in loaded.matrix_names if not (loaded.tied and name == "output.weight")]
        return "/".join(sorted({stored[1].name for name in names if (stored := weights.raw(name)) is not None}))

    arithmetic = open_arithmetic(numerics, weights.family, weights.architecture.head_dim, weights.source, device, dtype, weight_dtype, held)
    arithmetic.keep(_BaseStorage(loaded, weights, arithmetic, progress, store))
    loaded.arithmetic = arithmetic
    return loaded


class DeviceWeights:
    """Base weights of one interpreter on one device, kept for their arithmetic; read-only once loaded
    (`load_device_weights` fills them)."""

    def __init__(self, weights: BaseWeights, device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> None:
        """Shapes checked against the family's, before anything is converted."""
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
        """Embedding tables decoded row by row from the base file (compact modes, llama.cpp's arithmetic)."""
        self.matrices: dict[str, Product] = {}
        """Every matrix a linear layer multiplies, by GGUF name; a fused group under its first member's name."""
        self.matrix_names = sorted(name for name, shape in self.shapes.items() if self.multiplied(name, shape))
        self.groups: dict[tuple[str, ...], list[int]] = {}
        """Fused groups (names) and the output width of each member."""
        self.biases_after: dict[str, torch.Tensor] = {}
        """Biases added after the side paths rather than inside the products (llama.cpp's graph), by matrix name."""
        self.rope_frequencies = self.family.rope_frequencies(self.architecture)
        if self.rope_frequencies is not None:
            self.rope_frequencies = self.rope_frequencies.to(device)
        self.arithmetic: Arithmetic = Arithmetic()
        """The arithmetic the passes run (`PawConfig.numerics`, decided at the load)."""
        self._pending_codec = weights.pending_codec  # built meanwhile on a thread of its own: waited for when asked

    @property
    def codec(self) -> TextCodec:
        """The base's tokenizer (raises its `TokenizerError` if it could not be built)."""
        return self._pending_codec.result()

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

    def multiplied(self, name: str, shape: tuple[int, ...]) -> bool:
        """Whether tensor `name` is a matrix some linear layer multiplies (not a vector, embedding table or kernel)."""
        return len(shape) == 2 and name not in _EMBEDDINGS and not self.family.is_table(name)

    def bias(self, matrix: str) -> torch.Tensor | None:
        """Matrix `matrix`'s bias vector, if the base has one (inside the matrix's product in torch's arithmetic;
        llama.cpp's adds it after the side paths: `biases_after`)."""
        return self.tensors.get(matrix.removesuffix(".weight") + ".bias")

    def on_device(self, array: npt.NDArray[np.float32] | torch.Tensor) -> torch.Tensor:
        """`array` as a tensor on these weights' device, in their dtype."""
        return torch.as_tensor(array).to(device=self.device, dtype=self.dtype)

    def fusable_groups(self) -> list[tuple[str, ...]]:
        """The family's groups of matrices that read one input, where the base has every member."""
        return [group for group in self.family.fused_groups(self.architecture) if all(name in self.shapes for name in group)]


@dataclass
class _BaseStorage:
    """The base's matrices kept as its arithmetic says (`Arithmetic.keep`)."""

    loaded: DeviceWeights
    weights: BaseWeights
    arithmetic: Arithmetic
    progress: bool | None
    store: ConvertedStore | None

    def floats(self) -> None:
        """Float matrices, fused groups joined; compact on fbgemm's kernels with `weight_dtype`."""
        loaded = self.loaded
        fused = loaded.fusable_groups()
        loaded.groups = {group: [loaded.shapes[name][0] for name in group] for group in fused}
        if loaded.weight_dtype is None:
            _load_plain(loaded, self.weights, fused, self.progress)
        else:
            check_kernel(loaded.weight_dtype, loaded.device, loaded.dtype)
            _load_compact(loaded, self.weights, loaded.weight_dtype, fused, self.store, self.progress)

    def as_stored(self) -> None:
        """Each matrix as its GGUF blocks or F32/F16 values, biases after the side paths, groups joined only where
        the C kernels join them exactly."""
        loaded = self.loaded
        _load_blocks(loaded, self.weights, self.arithmetic, self.progress, loaded.family.fused_groups(loaded.architecture))
        loaded.biases_after = {name: bias for name in loaded.matrix_names if (bias := loaded.bias(name)) is not None}


def _load_plain(loaded: DeviceWeights, weights: BaseWeights, fused: list[tuple[str, ...]], progress: bool | None) -> None:
    read: dict[str, torch.Tensor] = {}
    group_of = {name: group for group in fused for name in group}
    pending: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}
    for name, array in track(weights.tensors(), f"loading {weights.source.name}", None, progress):
        tensor = loaded.on_device(array)
        del array  # one float32 array at a time: the peak stays near the stored weights
        group = group_of.get(name)
        if group is None:
            read[name] = tensor
            continue
        parts = pending.setdefault(group, {})
        parts[name] = tensor
        del tensor
        if len(parts) == len(group):  # fused as soon as complete, so the parts' memory is reused at once
            # fusing rows is exact: each output is the same dot product
            loaded.matrices[group[0]] = plain(torch.cat([parts[member] for member in group]), None)
            del pending[group], parts
    loaded.tensors = {name: tensor for name, tensor in read.items() if not loaded.multiplied(name, tuple(tensor.shape))}
    read.setdefault("output.weight", read["token_embd.weight"])
    for name in loaded.matrix_names:
        if name in read:
            loaded.matrices[name] = plain(read[name], loaded.bias(name))


def _load_blocks(loaded: DeviceWeights, weights: BaseWeights, arithmetic: Arithmetic, progress: bool | None, groups: list[tuple[str, ...]]) -> None:
    """Vectors and embeddings in float32; each matrix as its GGUF blocks (Q4_0, Q8_0, Q6_K) or F32/F16 values,
    read from the file's bytes, else in float32 (a folder of safetensors); biases stay vectors, added after the
    side paths as llama.cpp does. The token embeddings are decoded row by row from the file (ggml's get_rows)."""
    matrices = set(loaded.matrix_names)
    if loaded.tied:
        matrices.add("token_embd.weight")  # also the output matrix
    rows = weights.rows("token_embd.weight")
    if rows is not None:
        loaded.rows["token_embd.weight"] = rows

    def blocks_of(name: str) -> Product | None:
        """Matrix `name` as the file stores it, its values or block scales checked (None: not a GGUF matrix)."""
        stored = weights.raw(name)
        if stored is None:
            return None
        matrix = arithmetic.stored_matrix(stored[0], stored[1], loaded.shapes[name][0], name.startswith("blk."))
        if matrix is not None and not matrix.all_finite():
            raise non_finite(weights.source, name)
        return matrix

    def place(name: str, tensor: torch.Tensor) -> None:
        """A float32 tensor where it belongs: a matrix (its blocks where the file has them), the output matrix, or a vector."""
        if name == "token_embd.weight" and loaded.tied:
            loaded.matrices["output.weight"] = blocks_of(name) or arithmetic.float_matrix(tensor, None)
            if name not in loaded.rows:
                loaded.tensors[name] = tensor
        elif name in matrices:
            loaded.matrices[name] = blocks_of(name) or arithmetic.float_matrix(tensor, None)
        elif name not in loaded.rows:
            loaded.tensors[name] = tensor

    read_one = weights.tensor
    if read_one is None:  # a folder of safetensors: every tensor in float32
        for name, array in track(weights.tensors(), f"loading {weights.source.name}", None, progress):
            place(name, loaded.on_device(array))
        return
    names = list(weights.shapes())  # the file's own (loaded.shapes also names a tied output matrix)
    biased = {name.removesuffix(".bias") + ".weight" for name in names if name.endswith(".bias")}  # added after side paths
    group_of = {name: group for group in groups if not biased.intersection(group) for name in group}
    for name in track(names, f"loading {weights.source.name}", len(names), progress):
        blocks = blocks_of(name) if name in matrices else None
        if blocks is not None:
            loaded.matrices["output.weight" if name == "token_embd.weight" else name] = blocks
            if name == "token_embd.weight" and rows is None:
                loaded.tensors[name] = loaded.on_device(read_one(name))
        elif name != "token_embd.weight" or rows is None or name in matrices:
            place(name, loaded.on_device(read_one(name)))
        weights.release(name)  # copied: the file's pages of it need not stay resident (row tables fault theirs back in)
        group = group_of.get(name)
        if group is not None and all(member in loaded.matrices for member in group):
            # joined once its last member is in: its parts' memory is free for the next layer's (joined at the end,
            # every layer's parts stayed beside their joined copies until then: +140 MB peak on Qwen3.5-0.8B)
            _join_group(loaded, group)


def _join_group(loaded: DeviceWeights, group: tuple[str, ...]) -> None:
    """A group of block matrices read by the C kernels (none with a bias: `_load_blocks` leaves those out) joined into
    one product (`join_blocks`: exact), so a layer quantizes its input once and makes fewer calls; where a member is
    not such a matrix or their kinds differ, they stay apart, as llama.cpp multiplies them."""
    members = [loaded.matrices.get(name) for name in group]
    natives = [m for m in members if isinstance(m, NativeBlockMatrix)]
    if len(natives) != len(group):
        return
    joined = join_blocks(natives)
    if joined is None:
        return
    for name in group[1:]:
        del loaded.matrices[name]
    loaded.matrices[group[0]] = joined
    loaded.groups[group] = [m.out_features for m in natives]


def _load_compact(
    loaded: DeviceWeights,
    weights: BaseWeights,
    weight_dtype: WeightDType,
    fused: list[tuple[str, ...]],
    store: ConvertedStore | None,
    progress: bool | None,
) -> None:
    rows = weights.rows("token_embd.weight")
    if rows is not None:
        loaded.rows["token_embd.weight"] = rows
    stored = None if store is None else store.open()
    if store is not None and stored is not None:
        try:
            _pack(loaded, stored.get, weight_dtype, fused, progress, weights.source.name)
            return
        except CorruptStoreError:
            store.discard()
            loaded.tensors.clear()
            loaded.matrices.clear()
    converted = _convert(loaded, weights, weight_dtype, progress)
    if store is not None:
        store.save(converted)
    _pack(loaded, converted.pop, weight_dtype, fused, progress, weights.source.name)


def _convert(loaded: DeviceWeights, weights: BaseWeights, weight_dtype: WeightDType, progress: bool | None) -> dict[str, torch.Tensor]:
    """Every tensor in its stored form: matrices compressed, the token embeddings float16 unless decoded on
    demand, the rest (vectors, GPT-2's position table) float32."""
    matrices = set(loaded.matrix_names)
    converted: dict[str, torch.Tensor] = {}
    for name, array in track(weights.tensors(), f"converting {weights.source.name}", None, progress):
        tensor = torch.as_tensor(array)
        if name in matrices:
            converted |= compress(name, tensor, weight_dtype)
        elif name == "token_embd.weight":
            if loaded.tied:
                converted |= compress("output.weight", tensor, weight_dtype)
            if name not in loaded.rows:
                converted[name] = tensor.to(torch.float16)  # rows are looked up, then widened exactly
        else:
            converted[name] = tensor.to(torch.float32)
        del tensor, array  # one float32 tensor at a time
    return converted


def _pack(
    loaded: DeviceWeights,
    read: Callable[[str], torch.Tensor],
    weight_dtype: WeightDType,
    fused: list[tuple[str, ...]],
    progress: bool | None,
    label: str,
) -> None:
    """Build every tensor and packed matrix from stored forms that `read` hands over (once each)."""
    for name, shape in loaded.shapes.items():
        if not loaded.multiplied(name, shape) and name not in loaded.rows:
            loaded.tensors[name] = read(name).to(torch.float16 if name == "token_embd.weight" else torch.float32).clone()
    in_groups = {name for group in fused for name in group}
    jobs: list[tuple[str, ...]] = [*fused, *((name,) for name in loaded.matrix_names if name not in in_groups)]

    def build(group: tuple[str, ...]) -> Matrix:
        first = group[0]
        parts = [{name: read(name) for name in stored_names(member, weight_dtype)} for member in group]
        if len(parts) == 1:
            return pack(first, parts[0], weight_dtype, loaded.bias(first))
        return pack(first, concat_stored(parts, group, weight_dtype), weight_dtype, None)

    # fbgemm's packing is single-threaded and releases the GIL: pack on every thread torch may use
    with ThreadPoolExecutor(max_workers=max(1, min(4, torch.get_num_threads()))) as pool:
        for group, matrix in track(zip(jobs, pool.map(build, jobs), strict=True), f"packing {label}", len(jobs), progress):
            loaded.matrices[group[0]] = matrix
