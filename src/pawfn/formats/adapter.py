"""GGUF LoRA adapters: read, validate against the interpreter's module map, dequantize to float32 when asked."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from ..core.errors import AdapterError
from .ggufio import SUPPORTED_TENSOR_TYPES, GGUFFile, GGUFFormatError, dequantize_bytes
from ..core.models import InterpreterModel

__all__ = ["LoraAdapter", "LoraHalf", "LoraPair", "check_adapter_fits", "read_lora_adapter"]

_FLOAT_TYPES = frozenset({gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16})
_LORA_TENSOR = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])$")
_Q = gguf.GGMLQuantizationType
_BLOCK_SCALES: dict[gguf.GGMLQuantizationType, tuple[int, tuple[int, ...]]] = {
    _Q.Q4_0: (18, (0,)),
    _Q.Q8_0: (34, (0,)),
    _Q.Q5_0: (22, (0,)),
    _Q.Q4_1: (20, (0, 2)),
    _Q.Q5_1: (24, (0, 2)),
}
"""Block bytes and the offsets of its float16 scale (and minimum): a block's values are finite exactly when these
are, as the rest are small integer codes."""


@dataclass(frozen=True, eq=False)
class LoraHalf:
    """One LoRA tensor as the file stores it: its bytes (a copy), GGML type and numpy shape; `values` dequantizes
    on first use (llama.cpp's arithmetic multiplies the blocks and never needs them)."""

    data: npt.NDArray[np.uint8]
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, int]

    @cached_property
    def values(self) -> npt.NDArray[np.float32]:
        """The tensor dequantized to float32, `[rows, columns]`."""
        return dequantize_bytes(self.data, self.qtype, self.shape)

    @property
    def is_float(self) -> bool:
        """Stored as F32 or F16 (no blocks to keep)."""
        return self.qtype in _FLOAT_TYPES

    def all_finite(self) -> bool:
        """No NaN or infinity among the values, checked on the block scales where that suffices."""
        scales = _BLOCK_SCALES.get(self.qtype)
        if scales is None:
            return bool(np.isfinite(self.values).all())
        size, offsets = scales
        blocks = self.data.reshape(-1, size)
        return all(bool(np.isfinite(blocks[:, offset : offset + 2].copy().view(np.float16)).all()) for offset in offsets)


@dataclass(frozen=True)
class LoraPair:
    """One adapted weight: delta W = scale * (b @ a), `a` is `[rank, in]`, `b` is `[out, rank]`."""

    a_half: LoraHalf
    b_half: LoraHalf
    scale: float

    @property
    def a(self) -> npt.NDArray[np.float32]:
        """`lora_a` in float32 (dequantized on first use)."""
        return self.a_half.values

    @property
    def b(self) -> npt.NDArray[np.float32]:
        """`lora_b` in float32 (dequantized on first use)."""
        return self.b_half.values

    @property
    def quantized(self) -> bool:
        """Either half is stored in blocks (Q4_0, Q8_0, ...): what llama.cpp's arithmetic multiplies as stored."""
        return not (self.a_half.is_float and self.b_half.is_float)

    @property
    def rank(self) -> int:
        """LoRA rank (rows of `a`)."""
        return self.a_half.shape[0]


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter keyed by the GGUF name of the weight it adapts (e.g. ``blk.0.attn_q.weight``)."""

    path: Path
    alpha: float | None
    pairs: dict[str, LoraPair]
    tensor_types: frozenset[str]

    @classmethod
    def none(cls) -> LoraAdapter:
        """No adapter: a bare interpreter's (the base alone)."""
        return cls(Path("no adapter"), None, {}, frozenset())

    @property
    def rank(self) -> int:
        """The largest rank over the adapted weights (0 for an empty adapter)."""
        return max((pair.rank for pair in self.pairs.values()), default=0)

    @property
    def n_parameters(self) -> int:
        """Number of LoRA parameters."""
        return sum(math.prod(pair.a_half.shape) + math.prod(pair.b_half.shape) for pair in self.pairs.values())


def read_lora_adapter(path: Path, model: type[InterpreterModel]) -> LoraAdapter:
    """Read a GGUF LoRA for `model`; the scale is alpha / rank like llama.cpp (1.0 when alpha is 0 or absent)."""
    try:
        file = GGUFFile(path)
        architecture = file.string("general.architecture")
        file_type = file.string("general.type")
        adapter_type = file.string("adapter.type")
        alpha = file.number("adapter.lora.alpha")
    except GGUFFormatError as exc:
        raise AdapterError(path, str(exc)) from exc
    if alpha is not None and not math.isfinite(alpha):
        raise AdapterError(path, f"adapter.lora.alpha is {alpha}, not a finite number; the adapter file is damaged")

    if architecture != model.gguf_architecture:
        raise AdapterError(
            path,
            f"adapter is for architecture {architecture!r}, but {model.__name__} needs {model.gguf_architecture!r}: the "
            f"program contradicts itself (its meta.json names interpreter {model.interpreter_id!r}, which {model.__name__} "
            f"runs, while its adapter.gguf was made for a {architecture!r} model); recompile the program or download it again",
        )
    if file_type is not None and file_type != "adapter":
        raise AdapterError(path, f"general.type is {file_type!r}, expected 'adapter'; this is not a LoRA adapter")
    if adapter_type is not None and adapter_type != "lora":
        raise AdapterError(path, f"adapter.type is {adapter_type!r}; only 'lora' adapters are supported")

    halves: dict[str, dict[str, str]] = {}
    for name in file.tensor_names():
        match = _LORA_TENSOR.match(name)
        if match is None:
            raise AdapterError(path, f"unexpected tensor {name!r}; LoRA tensors are named blk.N.MODULE.weight.lora_a|b")
        module = match.group(2)
        if module not in model.lora_module_map:
            known = ", ".join(sorted(model.lora_module_map))
            raise AdapterError(path, f"tensor {name!r} adapts unknown module {module!r} for {model.__name__}; known: {known}")
        target = name.rsplit(".lora_", 1)[0]
        halves.setdefault(target, {})[match.group(3)] = name

    pairs: dict[str, LoraPair] = {}
    types: set[str] = set()
    for target, names in halves.items():
        if set(names) != {"a", "b"}:
            missing = "lora_b" if "a" in names else "lora_a"
            raise AdapterError(path, f"{target} has no {missing} tensor; every adapted weight needs lora_a and lora_b")
        try:
            a, b = _half(file, names["a"]), _half(file, names["b"])
        except GGUFFormatError as exc:
            raise AdapterError(path, str(exc)) from exc
        types.update((a.qtype.name, b.qtype.name))
        if a.shape[0] != b.shape[1]:
            raise AdapterError(path, f"{target}: lora_a {a.shape} and lora_b {b.shape} do not share a rank (want [r, in] and [out, r])")
        rank = a.shape[0]
        if rank == 0:
            raise AdapterError(path, f"{target}: lora_a and lora_b have rank 0 (no rows); the adapter file is damaged")
        for half, stored in (("lora_a", a), ("lora_b", b)):
            if not stored.all_finite():
                raise AdapterError(path, f"{target}.{half} holds non-finite values (NaN or infinity); the adapter file is damaged")
        pairs[target] = LoraPair(a_half=a, b_half=b, scale=alpha / rank if alpha else 1.0)
    if not pairs:
        raise AdapterError(path, "adapter holds no LoRA tensors")
    return LoraAdapter(path=path, alpha=alpha, pairs=pairs, tensor_types=frozenset(types))


def _half(file: GGUFFile, name: str) -> LoraHalf:
    """Tensor `name`'s bytes copied out of the file's map (closed with it), checked to be a 2-D matrix."""
    shape = file.tensor_shape(name)
    raw, qtype = file.raw(name)
    if qtype not in SUPPORTED_TENSOR_TYPES:
        raise GGUFFormatError(f"tensor {name} has unsupported type {qtype.name}")
    if len(shape) != 2:
        raise GGUFFormatError(f"{name} has shape {shape}; a LoRA tensor is a matrix")
    return LoraHalf(np.array(raw), qtype, (shape[0], shape[1]))


def check_adapter_fits(adapter: LoraAdapter, base_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """`AdapterError` unless every weight `adapter` adapts is a matrix of the base (`base_shapes`: its tensors'
    numpy shapes, `[out, in]`) with the adapter's `a` `[rank, in]` and `b` `[out, rank]`."""
    for name, pair in adapter.pairs.items():
        shape = base_shapes.get(name)
        if shape is None or len(shape) != 2:
            raise AdapterError(adapter.path, f"adapts {name}, which the base model does not have")
        out_features, in_features = shape
        if pair.a_half.shape[1] != in_features or pair.b_half.shape[0] != out_features:
            raise AdapterError(
                adapter.path,
                f"{name}: lora_a {pair.a_half.shape} / lora_b {pair.b_half.shape} do not fit the base weight "
                f"[{out_features}, {in_features}]; the adapter was made for another model size",
            )
