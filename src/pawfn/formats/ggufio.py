"""Typed reading of GGUF metadata and tensors.

The header (metadata and tensor table) is parsed here with `struct` over a memory map, every count checked
against the bytes left before anything loops or allocates; the `gguf` package (maintained by llama.cpp)
dequantizes the tensor data. gguf's own reader builds numpy views per array item, which took ~4.7 s for a
151,936-token vocabulary; this parser reads it in a fraction of a second.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsFloat, SupportsInt, cast

import gguf
import numpy as np
import numpy.typing as npt

__all__ = ["GGUFFile", "GGUFFormatError", "SUPPORTED_TENSOR_TYPES", "dequantize_bytes"]

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


_SCALARS: dict[int, struct.Struct] = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
"""GGUF metadata value types with a fixed size (8 is a string, 9 an array)."""
_NUMPY_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_MAX_DIMS = 4  # GGML_MAX_DIMS
_ONE_GROUP_VALUES = 1 << 20  # a tensor up to this size (any adapter's) is decoded in one go


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]
    """GGML order (fastest-varying first), as stored."""
    qtype: gguf.GGMLQuantizationType
    offset: int
    """From the start of the file, in bytes."""
    n_bytes: int


class _Cursor:
    """Reads little-endian GGUF values from a buffer, refusing any read past its end."""

    def __init__(self, buffer: mmap.mmap, size: int) -> None:
        self.buffer = buffer
        self.size = size
        self.offset = 0

    def need(self, n_bytes: int, what: str) -> None:
        if n_bytes < 0 or self.offset + n_bytes > self.size:
            raise GGUFFormatError(f"{what} runs past the end of the file (truncated or corrupt)")

    def unpack(self, layout: struct.Struct, what: str) -> object:
        self.need(layout.size, what)
        (value,) = layout.unpack_from(self.buffer, self.offset)
        self.offset += layout.size
        return cast(object, value)  # cast: struct returns Any

    def count(self, layout: struct.Struct, what: str) -> int:
        value = self.unpack(layout, what)
        assert isinstance(value, int)
        return value

    def string(self, what: str) -> str:
        length = self.count(_U64, what)
        self.need(length, what)
        raw = self.buffer[self.offset : self.offset + length]
        self.offset += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{what} is not UTF-8") from exc

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row: `string` in one tight loop (a 151,936-token vocabulary and its merges are
        ~300,000 strings, whose method calls took ~0.5 s of a load)."""
        buffer, offset, size, length_at = self.buffer, self.offset, self.size, _U64.unpack_from
        items: list[str] = []
        append = items.append
        try:
            for _ in range(count):
                (length,) = length_at(buffer, offset)
                offset += 8
                end = offset + length
                if end > size:
                    raise GGUFFormatError(f"{what} runs past the end of the file (truncated or corrupt)")
                append(buffer[offset:end].decode("utf-8"))
                offset = end
        except struct.error as exc:
            raise GGUFFormatError(f"{what} runs past the end of the file (truncated or corrupt)") from exc
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{what} is not UTF-8") from exc
        self.offset = offset
        return items

    def value(self, kind: int, what: str) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise GGUFFormatError(f"{what} has unknown value type {kind}")
        item_kind, count = self.count(_U32, what), self.count(_U64, what)
        if item_kind in _SCALARS:  # numbers in one read, after checking they fit
            width = _SCALARS[item_kind].size
            self.need(count * width, what)
            items = np.frombuffer(self.buffer, dtype=_NUMPY_TYPES[item_kind], count=count, offset=self.offset)
            self.offset += count * width
            return cast("list[object]", items.tolist())  # cast: tolist() is untyped
        if item_kind == _STRING:
            self.need(count * _U64.size, what)  # each string takes at least its 8-byte length
            return self.strings(count, what)
        raise GGUFFormatError(f"{what} is an array of unsupported type {item_kind}")


def _parse(path: Path) -> tuple[mmap.mmap, dict[str, object], dict[str, _TensorInfo]]:
    """Memory-map `path` and parse its GGUF header: (map, metadata, tensor table)."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 24:
                raise GGUFFormatError(f"not a readable GGUF file ({size} bytes)")
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise GGUFFormatError(f"not a readable GGUF file ({exc})") from exc
    cursor = _Cursor(buffer, size)
    if buffer[:4] != b"GGUF":
        raise GGUFFormatError("not a readable GGUF file (bad magic)")
    cursor.offset = 4
    version = cursor.count(_U32, "the version")
    if version not in (2, 3):
        raise GGUFFormatError(f"not a readable GGUF file (version {version}; pawfn reads GGUF 2 and 3, little-endian)")
    n_tensors, n_metadata = cursor.count(_U64, "the tensor count"), cursor.count(_U64, "the metadata count")
    cursor.need(n_metadata * (_U64.size + _U32.size), "the metadata")  # a key's length and a type at least
    metadata: dict[str, object] = {}
    for _ in range(n_metadata):
        key = cursor.string("a metadata key")
        metadata[key] = cursor.value(cursor.count(_U32, f"metadata {key}"), f"metadata {key}")
    cursor.need(n_tensors * (_U64.size + _U32.size + _U32.size + _U64.size), "the tensor table")
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment!r} is not a power of two")
    entries: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cursor.string("a tensor name")
        n_dims = cursor.count(_U32, f"tensor {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions (1 to {_MAX_DIMS})")
        shape = tuple(cursor.count(_U64, f"tensor {name}") for _ in range(n_dims))
        entries.append((name, shape, cursor.count(_U32, f"tensor {name}"), cursor.count(_U64, f"tensor {name}")))
    data_start = -(-cursor.offset // alignment) * alignment
    tensors: dict[str, _TensorInfo] = {}
    for name, shape, type_id, offset in entries:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError) as exc:
            raise GGUFFormatError(f"tensor {name} has unknown type {type_id}") from exc
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        if shape[0] % block_size:
            raise GGUFFormatError(f"tensor {name}: rows of {shape[0]} values do not split into {qtype.name} blocks")
        n_bytes = n_elements // block_size * type_size
        start = data_start + offset
        if name in tensors or start + n_bytes > size:
            raise GGUFFormatError(f"tensor {name} is repeated or its data runs past the end of the file")
        tensors[name] = _TensorInfo(name, shape, qtype, start, n_bytes)
    return buffer, metadata, tensors


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped); values are typed on access."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._buffer, self._metadata, self._tensors = _parse(path)

    def value(self, key: str) -> object:
        """A metadata value as stored (str, int, float, bool, or a list of them), or None when absent."""
        return self._metadata.get(key)

    def has(self, key: str) -> bool:
        """Whether the metadata holds `key`."""
        return key in self._metadata

    def string(self, key: str, default: str | None = None) -> str | None:
        """A string metadata value, or `default` when absent."""
        value = self.value(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise GGUFFormatError(f"metadata {key} should be a string, found {type(value).__name__}")
        return value

    def integer(self, key: str, default: int | None = None) -> int | None:
        """An integer metadata value, or `default` when absent."""
        value = self.value(key)
        if value is None:
            return default
        as_int = _as_int(value)
        if as_int is None:
            raise GGUFFormatError(f"metadata {key} should be an integer, found {type(value).__name__}")
        return as_int

    def number(self, key: str, default: float | None = None) -> float | None:
        """A numeric metadata value as float, or `default` when absent."""
        value = self.value(key)
        if value is None:
            return default
        as_float = _as_float(value)
        if as_float is None:
            raise GGUFFormatError(f"metadata {key} should be a number, found {type(value).__name__}")
        return as_float

    def strings(self, key: str) -> list[str] | None:
        """A string-array metadata value, or None when absent."""
        value = self.value(key)
        if value is None:
            return None
        items = cast("list[object]", value) if isinstance(value, list) else None  # cast: list of unknown items
        if items is None or not all(isinstance(item, str) for item in items):
            raise GGUFFormatError(f"metadata {key} should be an array of strings")
        return [str(item) for item in items]

    def integers(self, key: str) -> list[int] | None:
        """An integer-array metadata value, or None when absent."""
        value = self.value(key)
        if value is None:
            return None
        items = cast("list[object]", value) if isinstance(value, list) else None  # cast: list of unknown items
        numbers = [_as_int(item) for item in items or []]
        if items is None or any(number is None for number in numbers):
            raise GGUFFormatError(f"metadata {key} should be an array of integers")
        return [number for number in numbers if number is not None]

    def booleans(self, key: str) -> list[bool] | None:
        """A boolean-array metadata value, or None when absent."""
        value = self.value(key)
        if value is None:
            return None
        items = cast("list[object]", value) if isinstance(value, list) else None  # cast: list of unknown items
        if items is None or not all(isinstance(item, (bool, np.bool_)) for item in items):
            raise GGUFFormatError(f"metadata {key} should be an array of booleans")
        return [bool(item) for item in items]

    def tensor_names(self) -> Iterator[str]:
        """Names of the tensors in file order."""
        return iter(self._tensors)

    def has_tensor(self, name: str) -> bool:
        """Whether the file holds tensor `name`."""
        return name in self._tensors

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name` in numpy (row-major) order."""
        return tuple(reversed(self._tensors[name].shape))

    def tensor_type_name(self, name: str) -> str:
        """GGML type name of tensor `name` (e.g. ``Q4_0``)."""
        return self._tensors[name].qtype.name

    def raw(self, name: str) -> tuple[npt.NDArray[np.uint8], gguf.GGMLQuantizationType]:
        """Tensor `name`'s bytes (a read-only view of the file) and its GGML type."""
        tensor = self._tensors[name]
        return np.frombuffer(self._buffer, dtype=np.uint8, count=tensor.n_bytes, offset=tensor.offset), tensor.qtype

    def release(self, name: str) -> None:
        """Drop this process's pages of tensor `name` once its bytes were copied (`madvise(MADV_DONTNEED)` on the
        read-only file mapping): they leave the process's resident memory but stay in the OS's page cache, and a
        later read of them faults them back in; without `madvise` (not Linux) nothing happens."""
        tensor = self._tensors[name]
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is not None and tensor.n_bytes:
            self._buffer.madvise(advice, start, tensor.offset + tensor.n_bytes - start)

    def read_f32(self, name: str) -> npt.NDArray[np.float32]:
        """Tensor `name` dequantized to float32 in numpy order (a fresh, writeable array)."""
        tensor = self._tensors[name]
        if tensor.qtype not in SUPPORTED_TENSOR_TYPES:
            raise GGUFFormatError(f"tensor {name} has unsupported type {tensor.qtype.name}")
        raw, _ = self.raw(name)
        return dequantize_bytes(raw, tensor.qtype, self.tensor_shape(name))


def dequantize_bytes(raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """A tensor's stored bytes (`qtype`, one of `SUPPORTED_TENSOR_TYPES`) as a fresh float32 array of `shape`."""
    if math.prod(shape) <= _ONE_GROUP_VALUES:  # gguf decodes 16 rows at a time; one group is ~10x faster here
        blocks = raw.reshape(1, -1)
    else:
        blocks = raw.reshape(gguf.quants.quant_shape_to_byte_shape(shape, qtype))
    dequantize: Callable[..., npt.NDArray[np.float32]] = gguf.quants.dequantize
    values = np.array(dequantize(blocks, qtype), dtype=np.float32)  # a copy: never the read-only map
    return values.reshape(shape)
