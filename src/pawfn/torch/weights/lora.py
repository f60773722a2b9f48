"""A program's LoRA adapter on the device: side paths y += scale * b(a(x)), checked against the base and packed
as the base's arithmetic multiplies them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ...formats.adapter import LoraAdapter, LoraHalf, check_adapter_fits
from ..ggml.native_blocks import NativeBlockMatrix, join_blocks
from ..model.arithmetic import Arithmetic
from ..model.packed import Matrix, pack, plain
from .loading import DeviceWeights, Product

__all__ = ["DeviceAdapter", "GroupLora", "LoraWeights", "attach"]


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

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the side paths hold (views included: count storages to size them)."""
        products: list[object] = [half for lora in self.pairs.values() for half in (lora.a, lora.b)]
        products += [product for group in self.groups.values() for product in (group.a, *group.b)]
        return [value for product in products for value in vars(product).values() if isinstance(value, torch.Tensor)]

    def release(self) -> None:
        """Drop the adapter's tensors."""
        self.pairs.clear()
        self.groups.clear()


def attach(base: DeviceWeights, adapter: LoraAdapter) -> DeviceAdapter:
    """Check `adapter` against `base`'s weights and move it to their device, kept as `base`'s arithmetic multiplies."""
    check_adapter_fits(adapter, base.shapes)
    return base.arithmetic.keep(_SideStorage(base, adapter))


@dataclass
class _SideStorage:
    """A program's side paths kept as the base's arithmetic says (`Arithmetic.keep`)."""

    base: DeviceWeights
    adapter: LoraAdapter

    def floats(self) -> DeviceAdapter:
        """Float matrices (`a` packed in the compact modes); a group adapted throughout keeps its `a` matrices
        joined, and only so."""
        base, adapter = self.base, self.adapter
        pairs: dict[str, LoraWeights] = {}
        groups: dict[tuple[str, ...], GroupLora] = {}
        for group in base.groups:
            if all(name in adapter.pairs for name in group):
                joined = torch.cat([torch.as_tensor(adapter.pairs[name].a) for name in group])
                groups[group] = GroupLora(
                    a=_lora_a(base, joined),
                    ranks=[adapter.pairs[name].a.shape[0] for name in group],
                    b=tuple(plain(base.on_device(adapter.pairs[name].b), None) for name in group),
                    scales=tuple(adapter.pairs[name].scale for name in group),
                )
        grouped = {name for group in groups for name in group}
        for name, pair in adapter.pairs.items():
            if name not in grouped:
                pairs[name] = LoraWeights(a=_lora_a(base, torch.as_tensor(pair.a)), b=plain(base.on_device(pair.b), None), scale=pair.scale)
        return DeviceAdapter(pairs, groups)

    def as_stored(self) -> DeviceAdapter:
        """Each half as the file stores it; a fused group's `a` halves joined on the C kernels."""
        base, adapter = self.base, self.adapter
        pairs: dict[str, LoraWeights] = {}
        for name, pair in adapter.pairs.items():
            a, b = (_half(base.arithmetic, base, half, pair.quantized) for half in (pair.a_half, pair.b_half))
            pairs[name] = LoraWeights(a=a, b=b, scale=pair.scale)
        groups: dict[tuple[str, ...], GroupLora] = {}
        for group in base.groups:
            joined_lora = _joined_lora([pairs[name] for name in group if name in pairs], len(group))
            if joined_lora is None:
                continue
            groups[group] = joined_lora
            joined, first = joined_lora.a, 0
            for name, rank in zip(group, joined_lora.ranks, strict=True):  # each member's `a` a view of the joined one: one copy
                if isinstance(joined, NativeBlockMatrix):
                    pairs[name] = dataclasses.replace(pairs[name], a=joined.part(first, rank))
                first += rank
        return DeviceAdapter(pairs, groups)


def _half(arithmetic: Arithmetic, base: DeviceWeights, half: LoraHalf, quantized: bool) -> Product:
    """One half of a side path in llama.cpp's arithmetic: its blocks where the pair is quantized, else its F32 or F16
    values as the arithmetic keeps them, else float32 (the torch emulation: dequantized only then)."""
    # a float half beside a quantized one stays float32, as the quantized pairs were first loaded and measured
    matrix = None if quantized and half.is_float else arithmetic.stored_matrix(half.data, half.qtype, half.shape[0], base_layer=False)
    return arithmetic.float_matrix(base.on_device(half.values), None) if matrix is None else matrix


def _lora_a(base: DeviceWeights, weight: torch.Tensor) -> Matrix:
    """A LoRA `a` matrix: plain in the exact mode; packed float16 in the compact ones (half of float32's memory,
    ~5 ms faster per Qwen3-0.6B decode step here). `b` matrices stay plain: fbgemm pads a packed matrix's
    64-wide input to its blocks (a packed `[3072, 64]` took 7.7x its float16 bytes)."""
    if base.weight_dtype is None:
        return plain(base.on_device(weight), None)
    return pack("lora_a", {"lora_a": weight.to(torch.float16)}, "float16", None)


def _joined_lora(members: list[LoraWeights], size: int) -> GroupLora | None:
    """A fused group's side paths (llama.cpp's arithmetic, every one of its `size` members adapted) with their `a`
    halves joined on the C kernels, or None where they cannot be."""
    a_halves = [lora.a for lora in members if isinstance(lora.a, NativeBlockMatrix)]
    blocks_b = all(isinstance(lora.b, NativeBlockMatrix) for lora in members)  # their accumulate rounds as llama.cpp
    joined = join_blocks(a_halves) if len(a_halves) == size and blocks_b else None
    if joined is None:
        return None
    return GroupLora(
        a=joined, ranks=[a.out_features for a in a_halves], b=tuple(lora.b for lora in members), scales=tuple(lora.scale for lora in members)
    )
