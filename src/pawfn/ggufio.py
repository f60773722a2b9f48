"""Typed reading of GGUF metadata and tensors through the `gguf` package (llama.cpp's reader)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import SupportsFloat, SupportsInt, cast

import gguf
import numpy as np
import numpy.typing as npt

__all__ = ["GGUFFile", "GGUFFormatError", "SUPPORTED_TENSOR_TYPES"]

SUPPORTED_TENSOR_TYPES = frozenset(
    {
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q4_0,
        gguf.GGMLQuantizationType.Q4_1,
        gguf.GGMLQuantizationType.Q5_0,
        gguf.GGMLQuantizationType.Q5_1,
        gguf.GGMLQuantizationType.Q2_K,
        gguf.GGMLQuantizationType.Q3_K,
        gguf.GGMLQuantizationType.Q4_K,
        gguf.GGMLQuantizationType.Q5_K,
        gguf.GGMLQuantizationType.Q6_K,
    }
)
"""Tensor types pawfn dequantizes (the official bases are Q6_K and Q8_0, adapters Q4_0)."""


class GGUFFormatError(Exception):
    """Raised by `GGUFFile` for a file that is not readable GGUF; callers wrap it in their typed error."""


def _as_int(value: object) -> int | None:
    """`value` as int when it is an integer (Python or numpy), else None; booleans are not integers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, np.integer):
        return int(cast(SupportsInt, value))  # cast: numpy's scalar type is generic over an unknown parameter
    return None


def _as_float(value: object) -> float | None:
    """`value` as float when it is a real number (Python or numpy), else None."""
    as_int = _as_int(value)
    if as_int is not None:
        return float(as_int)
    if isinstance(value, float):
        return value
    if isinstance(value, np.floating):
        return float(cast(SupportsFloat, value))  # cast: as above
    return None


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped); values are typed on access."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._reader = gguf.GGUFReader(path)
        except (ValueError, OSError, IndexError, KeyError) as exc:
            raise GGUFFormatError(f"not a readable GGUF file ({exc})") from exc
        self._tensors = {tensor.name: tensor for tensor in self._reader.tensors}

    def _value(self, key: str) -> object:
        field = self._reader.get_field(key)
        if field is None:
            return None
        value: object = field.contents()
        return value

    def has(self, key: str) -> bool:
        """Whether the metadata holds `key`."""
        return self._reader.get_field(key) is not None

    def string(self, key: str, default: str | None = None) -> str | None:
        """A string metadata value, or `default` when absent."""
        value = self._value(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise GGUFFormatError(f"metadata {key} should be a string, found {type(value).__name__}")
        return value

    def integer(self, key: str, default: int | None = None) -> int | None:
        """An integer metadata value, or `default` when absent."""
        value = self._value(key)
        if value is None:
            return default
        as_int = _as_int(value)
        if as_int is None:
            raise GGUFFormatError(f"metadata {key} should be an integer, found {type(value).__name__}")
        return as_int

    def number(self, key: str, default: float | None = None) -> float | None:
        """A numeric metadata value as float, or `default` when absent."""
        value = self._value(key)
        if value is None:
            return default
        as_float = _as_float(value)
        if as_float is None:
            raise GGUFFormatError(f"metadata {key} should be a number, found {type(value).__name__}")
        return as_float

    def strings(self, key: str) -> list[str] | None:
        """A string-array metadata value, or None when absent."""
        value = self._value(key)
        if value is None:
            return None
        items = cast("list[object]", value) if isinstance(value, list) else None  # cast: list of unknown items
        if items is None or not all(isinstance(item, str) for item in items):
            raise GGUFFormatError(f"metadata {key} should be an array of strings")
        return [str(item) for item in items]

    def integers(self, key: str) -> list[int] | None:
        """An integer-array metadata value, or None when absent."""
        value = self._value(key)
        if value is None:
            return None
        items = cast("list[object]", value) if isinstance(value, list) else None  # cast: list of unknown items
        numbers = [_as_int(item) for item in items or []]
        if items is None or any(number is None for number in numbers):
            raise GGUFFormatError(f"metadata {key} should be an array of integers")
        return [number for number in numbers if number is not None]

    def tensor_names(self) -> Iterator[str]:
        """Names of the tensors in file order."""
        return iter(self._tensors)

    def has_tensor(self, name: str) -> bool:
        """Whether the file holds tensor `name`."""
        return name in self._tensors

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name` in numpy (row-major) order."""
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def tensor_type_name(self, name: str) -> str:
        """GGML type name of tensor `name` (e.g. ``Q4_0``)."""
        return self._tensors[name].tensor_type.name

    def read_f32(self, name: str) -> npt.NDArray[np.float32]:
        """Tensor `name` dequantized to float32 in numpy order."""
        tensor = self._tensors[name]
        if tensor.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise GGUFFormatError(f"tensor {name} has unsupported type {tensor.tensor_type.name}")
        dequantize: Callable[..., npt.NDArray[np.float32]] = gguf.quants.dequantize
        values = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if not values.flags.writeable:  # F32 tensors come straight from the read-only memory map
            values = values.copy()
        return values.reshape(self.tensor_shape(name))
