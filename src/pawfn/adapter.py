"""GGUF LoRA adapters: read, validate against the interpreter's module map, dequantize to float32."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from .errors import AdapterError
from .ggufio import GGUFFile, GGUFFormatError
from .models import InterpreterModel

__all__ = ["LoraAdapter", "LoraPair", "read_lora_adapter"]

RawTensor = tuple[npt.NDArray[np.uint8], gguf.GGMLQuantizationType]
"""A tensor's stored bytes and its GGML type."""
_FLOAT_TYPES = frozenset({gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16})
_LORA_TENSOR = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])$")


@dataclass(frozen=True)
class LoraPair:
    """One adapted weight: delta W = scale * (b @ a), `a` is `[rank, in]`, `b` is `[out, rank]`."""

    a: npt.NDArray[np.float32]
    b: npt.NDArray[np.float32]
    scale: float
    blocks: tuple[RawTensor, RawTensor] | None = None
    """`a` and `b` as stored (bytes and GGML type) when quantized: what llama.cpp's arithmetic multiplies."""

    @property
    def rank(self) -> int:
        """LoRA rank (rows of `a`)."""
        return int(self.a.shape[0])


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter keyed by the GGUF name of the weight it adapts (e.g. ``blk.0.attn_q.weight``)."""

    path: Path
    alpha: float | None
    pairs: dict[str, LoraPair]
    tensor_types: frozenset[str]

    @property
    def rank(self) -> int:
        """The largest rank over the adapted weights (0 for an empty adapter)."""
        return max((pair.rank for pair in self.pairs.values()), default=0)

    @property
    def n_parameters(self) -> int:
        """Number of LoRA parameters."""
        return sum(pair.a.size + pair.b.size for pair in self.pairs.values())


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
            f"adapter is for architecture {architecture!r}, but {model.__name__} needs "
            f"{model.gguf_architecture!r}; load the program with the matching model type",
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
            a = file.read_f32(names["a"])
            b = file.read_f32(names["b"])
            raw_a, raw_b = file.raw(names["a"]), file.raw(names["b"])
        except GGUFFormatError as exc:
            raise AdapterError(path, str(exc)) from exc
        types.add(file.tensor_type_name(names["a"]))
        types.add(file.tensor_type_name(names["b"]))
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(
                path, f"{target}: lora_a {a.shape} and lora_b {b.shape} do not share a rank (want [r, in] and [out, r])"
            )
        rank = a.shape[0]
        if rank == 0:
            raise AdapterError(path, f"{target}: lora_a and lora_b have rank 0 (no rows); the adapter file is damaged")
        for half, values in (("lora_a", a), ("lora_b", b)):
            if not np.isfinite(values).all():
                raise AdapterError(path, f"{target}.{half} holds non-finite values (NaN or infinity); the adapter file is damaged")
        scale = alpha / rank if alpha else 1.0
        blocks = None
        if raw_a[1] not in _FLOAT_TYPES or raw_b[1] not in _FLOAT_TYPES:  # copies: the file's map is closed with it
            blocks = ((np.array(raw_a[0]), raw_a[1]), (np.array(raw_b[0]), raw_b[1]))
        pairs[target] = LoraPair(a=a, b=b, scale=scale, blocks=blocks)
    if not pairs:
        raise AdapterError(path, "adapter holds no LoRA tensors")
    return LoraAdapter(path=path, alpha=alpha, pairs=pairs, tensor_types=frozenset(types))
