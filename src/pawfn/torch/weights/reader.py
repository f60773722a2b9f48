"""Base weights of an interpreter from a GGUF file or a Hugging Face folder: hyperparameters, tensors (GGUF
names, `[out, in]`) and tokenizer. What differs per architecture comes from its family module."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict
from safetensors import SafetensorError, safe_open

from ...core.errors import BaseModelError
from ...formats.ggufio import GGUFFile, GGUFFormatError
from ...core.models import InterpreterModel
from ...formats.tokenizer import TextCodec
from ..ggml.dequant import RowTable, dequantize
from ..model.families import Architecture, Family, family_for
from ..model.families.base import parse_hf_config

__all__ = ["BaseWeights", "built", "non_finite", "read_base_weights"]

Array = npt.NDArray[np.float32]


@dataclass
class BaseWeights:
    """Everything the engine needs to build the interpreter; `tensors` yields (GGUF name, float32 `[out, in]`),
    `shapes` reads every tensor's shape without its values, `rows` gives an on-demand row decoder of a matrix
    kept in the file and `raw` a tensor's stored bytes and GGML type (GGUF only, else None)."""

    source: Path
    architecture: Architecture
    family: Family
    pending_codec: Future[TextCodec]
    """The tokenizer, built beside the weights (its Python work overlaps the kernels' unpacking, which frees the
    GIL); `codec` waits for it."""
    tensors: Callable[[], Iterator[tuple[str, Array]]]
    shapes: Callable[[], dict[str, tuple[int, ...]]]
    rows: Callable[[str], RowTable | None] = lambda name: None
    raw: Callable[[str], tuple[npt.NDArray[np.uint8], gguf.GGMLQuantizationType] | None] = lambda name: None
    tensor: Callable[[str], Array] | None = None
    """One tensor by name as float32 (GGUF only): a loader that keeps some tensors as their blocks reads the rest."""
    release: Callable[[str], None] = lambda name: None
    """Drop the process's pages of a tensor's file bytes once a loader has copied them (GGUF: `GGUFFile.release`)."""

    @property
    def codec(self) -> TextCodec:
        """The tokenizer (raises its `TokenizerError` if it could not be built)."""
        return self.pending_codec.result()


def built(value: TextCodec) -> Future[TextCodec]:
    """A finished future holding `value`."""
    future: Future[TextCodec] = Future()
    future.set_result(value)
    return future


def _in_background(build: Callable[[], TextCodec]) -> Future[TextCodec]:
    """`build()` on a thread of its own; its result or error comes through the future."""
    future: Future[TextCodec] = Future()

    def run() -> None:
        try:
            future.set_result(build())
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits for the tokenizer
            future.set_exception(exc)

    threading.Thread(target=run, name="pawfn-tokenizer", daemon=True).start()
    return future


def read_base_weights(source: Path, model: type[InterpreterModel]) -> BaseWeights:
    """Open a GGUF file or a Hugging Face folder (config.json + safetensors + tokenizer.json) for `model`."""
    family = family_for(model)
    if source.is_dir():
        weights = _read_hf_folder(source, model, family)
    elif not source.is_file():
        raise BaseModelError(source, "base weights not found: pass a GGUF file or a Hugging Face model folder")
    else:
        with source.open("rb") as handle:
            magic = handle.read(4)
        if magic != b"GGUF":
            raise BaseModelError(source, "not a GGUF file (bad magic); pass a GGUF file or a Hugging Face model folder")
        weights = _read_gguf(source, model, family)
    return _finite_tensors(weights)


@contextlib.contextmanager
def _readable(file: Path) -> Generator[None, None, None]:
    """safetensors' errors on a damaged file (truncated, bad header) as `BaseModelError`s naming it."""
    try:
        yield
    except SafetensorError as exc:
        raise BaseModelError(file, f"cannot read the safetensors file ({exc}); it is truncated or damaged") from exc


@dataclass(frozen=True)
class _Stored:
    """Where a safetensors file keeps one tensor: its type, shape and bytes' offset and length."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


_READ_AS: dict[str, np.dtype[np.generic]] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}
"""The stored types read with a plain file read (bf16 as its 16 bits, widened below)."""


def _layout(file: Path) -> dict[str, _Stored]:
    """The tensors of a safetensors file (its header, which `safe_open` has already checked)."""
    with file.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    found: dict[str, _Stored] = {}
    for name, entry in header.items():
        if name != "__metadata__":
            start, end = entry["data_offsets"]
            found[name] = _Stored(entry["dtype"], tuple(entry["shape"]), 8 + size + start, end - start)
    return found


def _read_float32(file: Path, stored: _Stored) -> Array:
    """One tensor as float32, read from the file into memory of its own: safetensors' reads go through a map of the
    whole file, whose pages stay in the process's memory while it is open (a bf16 0.6B folder: 1.1 GB on top of its
    2.4 GB of float32)."""
    kind = _READ_AS[stored.dtype]
    count = stored.length // kind.itemsize
    if count != int(np.prod(stored.shape, dtype=np.int64)):
        raise BaseModelError(file, f"a tensor's bytes ({stored.length}) do not fit its shape {list(stored.shape)}; the file is damaged")
    try:
        raw = np.fromfile(file, dtype=kind, count=count, offset=stored.offset)
    except (OSError, ValueError) as exc:
        raise BaseModelError(file, f"cannot read the safetensors file ({exc}); it is truncated or damaged") from exc
    if raw.size != count:
        raise BaseModelError(file, "the safetensors file ends inside a tensor; it is truncated")
    # bf16 is a float32's upper 16 bits: widened exactly, as torch's .float() does
    wide = (raw.astype(np.uint32) << 16).view(np.float32) if stored.dtype == "BF16" else raw.astype(np.float32, copy=False)
    return wide.reshape(stored.shape)


def _finite_tensors(weights: BaseWeights) -> BaseWeights:
    """`weights` whose `tensors` refuse a tensor holding NaN or infinity, by name (it would make every logit NaN)."""
    read, source = weights.tensors, weights.source  # not `weights`: its own closures would hold it in a cycle

    def checked(name: str, array: Array) -> Array:
        if not _all_finite(array):
            raise non_finite(source, name)
        return array

    def tensors() -> Iterator[tuple[str, Array]]:
        for name, array in read():
            yield name, checked(name, array)

    weights.tensors = tensors
    one = weights.tensor
    if one is not None:
        weights.tensor = lambda name: checked(name, one(name))
    return weights


def non_finite(source: Path, name: str) -> BaseModelError:
    """The error for base tensor `name` of `source` holding NaN or infinity (it would make every logit NaN)."""
    return BaseModelError(source, f"tensor {name} holds non-finite values (NaN or infinity); the file is damaged")


def _all_finite(array: Array) -> bool:
    """No NaN or infinity in `array`, checked 1M values at a time (a whole embedding table's mask took 155 MB)."""
    flat = array.reshape(-1)
    step = 1 << 20
    return all(bool(np.isfinite(flat[start : start + step]).all()) for start in range(0, flat.size, step))


def _read_gguf(path: Path, model: type[InterpreterModel], family: Family) -> BaseWeights:
    try:
        file = GGUFFile(path)
        arch_name = file.string("general.architecture")
        if arch_name != model.gguf_architecture:
            raise BaseModelError(path, f"GGUF architecture is {arch_name!r}, but {model.__name__} needs {model.gguf_architecture!r}")
        if file.string("general.type") == "adapter":
            raise BaseModelError(path, "this GGUF is a LoRA adapter, not base weights")
        if not file.has_tensor("token_embd.weight"):
            raise BaseModelError(path, "GGUF has no token_embd.weight tensor")
        architecture = family.architecture_from_gguf(file, file.tensor_shape("token_embd.weight")[0])
        value_length = file.integer(f"{arch_name}.attention.value_length")
        if value_length is not None and value_length != architecture.head_dim:
            raise BaseModelError(path, "attention.value_length differs from attention.key_length; not supported")
    except GGUFFormatError as exc:
        raise BaseModelError(path, str(exc)) from exc
    codec = _in_background(lambda: TextCodec.from_gguf(file))

    def tensor(name: str) -> Array:
        try:
            raw, qtype = file.raw(name)
            fast = dequantize(raw, qtype, file.tensor_shape(name))
            return file.read_f32(name) if fast is None else fast
        except GGUFFormatError as exc:
            raise BaseModelError(path, str(exc)) from exc

    def tensors() -> Iterator[tuple[str, Array]]:
        for name in file.tensor_names():
            yield name, tensor(name)
            file.release(name)  # converted by now: its file pages need not stay in this process's memory

    def shapes() -> dict[str, tuple[int, ...]]:
        return {name: file.tensor_shape(name) for name in file.tensor_names()}

    def rows(name: str) -> RowTable | None:
        raw, qtype = file.raw(name)
        return RowTable.of(raw, qtype, file.tensor_shape(name))

    def raw(name: str) -> tuple[npt.NDArray[np.uint8], gguf.GGMLQuantizationType]:
        try:
            return file.raw(name)
        except GGUFFormatError as exc:
            raise BaseModelError(path, str(exc)) from exc

    return BaseWeights(
        source=path,
        architecture=architecture,
        family=family,
        pending_codec=codec,
        tensors=tensors,
        shapes=shapes,
        rows=rows,
        raw=raw,
        tensor=tensor,
        release=file.release,
    )


class _HFConfig(BaseModel):
    """The part of a `config.json` every checkpoint has."""

    model_config = ConfigDict(extra="allow")

    model_type: str | None = None


def _read_hf_folder(folder: Path, model: type[InterpreterModel], family: Family) -> BaseWeights:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise BaseModelError(folder, "config.json is missing; a Hugging Face model folder needs it")
    try:
        raw = config_path.read_bytes()
    except OSError as exc:
        raise BaseModelError(config_path, f"cannot read config.json: {exc}") from exc
    model_type = parse_hf_config(_HFConfig, raw, config_path).model_type
    if model_type != model.hf_model_type:
        raise BaseModelError(config_path, f"model_type is {model_type!r}, but {model.__name__} needs {model.hf_model_type!r}")
    architecture = family.architecture_from_hf(raw, config_path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise BaseModelError(folder, "no *.safetensors weights in the folder")
    codec = built(TextCodec.from_hf_folder(folder, model))
    conv1d = {f"{module}.weight" for module in model.conv1d_modules}

    def entries() -> Iterator[tuple[safe_open, str, str, bool, Path]]:
        """(open file, HF name, GGUF name, stored `[in, out]` as Conv1D does, file) for every tensor the engine reads."""
        for file in files:
            with _readable(file), safe_open(str(file), framework="pt") as handle:
                for hf_name in handle.keys():
                    name = family.gguf_name(hf_name)
                    if name is None:
                        continue
                    if not name:
                        raise BaseModelError(file, f"unexpected tensor {hf_name!r} for {model.__name__}")
                    yield handle, hf_name, name, name.split(".", 2)[-1] in conv1d, file

    def tensors() -> Iterator[tuple[str, Array]]:
        layouts: dict[Path, dict[str, _Stored]] = {}
        for handle, hf_name, name, transposed, file in entries():
            stored = (layouts[file] if file in layouts else layouts.setdefault(file, _layout(file))).get(hf_name)
            if stored is None or stored.dtype not in _READ_AS:  # a type numpy cannot read: through safetensors
                with _readable(file):
                    array = handle.get_tensor(hf_name).float().numpy()
            else:
                array = _read_float32(file, stored)
            yield name, np.ascontiguousarray(array.T) if transposed else array

    def shapes() -> dict[str, tuple[int, ...]]:
        found: dict[str, tuple[int, ...]] = {}
        for handle, hf_name, name, transposed, file in entries():
            with _readable(file):
                shape = tuple(handle.get_slice(hf_name).get_shape())
            found[name] = shape[::-1] if transposed else shape
        return found

    return BaseWeights(source=folder, architecture=architecture, family=family, pending_codec=codec, tensors=tensors, shapes=shapes)
