"""The C library's interface (`kernels.c`), declared once and by name: each exported function with its argument types
(`EXPORTS`), `paw_run`'s kernels as an enum in the C enum's order (`Kernel`), and each kernel's arguments as a typed
dataclass (`KernelCall`) whose fields fill `paw_args` in the order the C `run_range` reads them. A test reads
`kernels.c` and checks all three against it, so adding or reordering a kernel on one side fails there, not in a product.
"""

from __future__ import annotations

import ctypes
import enum
import operator
import typing
from dataclasses import dataclass, fields
from collections.abc import Callable
from typing import Annotated, ClassVar


__all__ = [
    "BLOCK_PRODUCTS",
    "EXPORTS",
    "AttentionCall",
    "AttentionStepCall",
    "FlashOnlineCall",
    "FlashTiledCall",
    "FloatKind",
    "FloatProductCall",
    "GatedDeltaNetCall",
    "GeluCall",
    "Integer",
    "Kernel",
    "KernelCall",
    "LibmOp",
    "Out",
    "Pointer",
    "RmsNormCall",
    "SsmConvCall",
    "SiluCall",
    "SwigluCall",
    "Value",
    "kernel_calls",
]

_I32 = ctypes.c_int
_I64 = ctypes.c_int64
_F32 = ctypes.c_float
_PTR = ctypes.c_void_p
_SLOTS = 10
"""`paw_args`' pointers and integers each."""


class Kernel(enum.IntEnum):
    """`paw_run`'s kernels, in `kernels.c`'s enum order (`KERNEL_<name>`)."""

    Q6_K_ROWS = 0
    Q6_K_TILED = 1
    Q0_ROWS = 2
    Q4_0_REPACKED = 3
    ATTENTION = 4
    Q0_EIGHTS = 5
    GATED_DELTA_NET = 6
    FLASH_ONLINE = 7
    FLASH_TILED = 8
    FLOAT = 9
    Q4_0_EIGHTS = 10
    ATTENTION_STEP = 11
    RMS_NORM = 12
    SWIGLU = 13
    GELU = 14
    SSM_CONV = 15
    SILU = 16


BLOCK_PRODUCTS = frozenset({Kernel.Q6_K_ROWS, Kernel.Q6_K_TILED, Kernel.Q0_ROWS, Kernel.Q4_0_REPACKED, Kernel.Q0_EIGHTS, Kernel.Q4_0_EIGHTS})
"""Kernels `paw_block_product` runs with the arguments it makes in C (x quantized first); Python names only which."""


class FloatKind(enum.IntEnum):
    """A float product's weights, in `kernels.c`'s `FLOAT_<name>` order: F32, F16, or BF16 dotted in `vdpbf16ps`
    pairs (AVX-512 BF16) or widened to float32 (other CPUs)."""

    F32 = 0
    F16 = 1
    BF16_PAIRS = 2
    BF16_WIDENED = 3


class LibmOp(enum.IntEnum):
    """`paw_libm`'s functions, in its switch's order: the C library's `expf`, `logf`, and ggml's sigmoid and softplus
    written with them."""

    EXPF = 0
    LOGF = 1
    SIGMOID = 2
    SOFTPLUS = 3


class _Args(ctypes.Structure):
    """`paw_args`: a kernel's pointers, integers and one float."""

    _fields_ = [("p", _PTR * _SLOTS), ("i", _I64 * _SLOTS), ("f", _F32)]


class Out(ctypes.Structure):
    """`paw_out`: where a product's values go (`y[r * stride + o]`), set or accumulated as `y + value * alpha`; a float
    product's values set plus `bias` (an address; 0: none)."""

    _fields_ = [("y", _PTR), ("stride", _I64), ("accumulate", ctypes.c_int32), ("alpha", _F32), ("bias", _PTR)]


EXPORTS: dict[str, tuple[tuple[type[typing.Any], ...], type[typing.Any] | None]] = {
    "paw_run": ((_I32, ctypes.POINTER(_Args), _I64, _I64), _I32),
    "paw_block_product": ((_I32, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, ctypes.POINTER(Out), _I64), _I32),
    "paw_q6_k_amx_product": ((_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64), _I32),
    "paw_amx_available": ((), _I32),
    "paw_use_avx512": ((_I32,), _I32),
    "paw_expf": ((_PTR, _PTR, _I64, _I64), None),
    "paw_libm": ((_I64, _PTR, _PTR, _I64), None),
    "paw_rope_neox": ((_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I32, _I64, _I64, _I64), None),
    "paw_layer_norm": ((_PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32, _I64), None),
    "paw_rope_table": ((_PTR, _I64, _I64, _F32, _PTR, _PTR), None),
    "paw_unpack_q6_k": ((_PTR, _I64, _PTR, _PTR, _PTR), None),
    "paw_quantize_q8_k": ((_PTR, _I64, _I64, _PTR, _PTR, _PTR), None),
    "paw_quantize_q8_0": ((_PTR, _I64, _I64, _PTR, _PTR), None),
}
"""Every function Python calls: its argument types and return type (None: void), as `kernels.c` declares them."""

Pointer = Annotated[int, "p"]
"""An address (`paw_args.p`)."""
Integer = Annotated[int, "i"]
"""A count, stride or flag (`paw_args.i`)."""
Value = Annotated[float, "f"]
"""The one float (`paw_args.f`)."""


@dataclass(slots=True)
class KernelCall:
    """One `paw_run` kernel's arguments by name: `Pointer` fields fill `paw_args.p`, `Integer` ones `.i`, each in
    declaration order, and a `Value` field `.f`."""

    kernel: ClassVar[Kernel]

    def packed(self) -> _Args:
        """The arguments as `paw_args` (a decode step packs a few hundred: the fields are read by prepared getters)."""
        pointers, integers, value = _layout(type(self))
        return _Args(_PTR_ARRAY(*pointers(self)), _I64_ARRAY(*integers(self)), value(self))


_Getter = Callable[[object], tuple[int, ...]]
_Layout = tuple[_Getter, _Getter, Callable[[object], float]]
_PTR_ARRAY = _PTR * _SLOTS
_I64_ARRAY = _I64 * _SLOTS
_LAYOUTS: dict[type[KernelCall], _Layout] = {}


def _layout(call: type[KernelCall]) -> _Layout:
    """A call class's pointer fields, integer fields and value field, in declaration order (read once a class)."""
    known = _LAYOUTS.get(call)
    if known is not None:
        return known
    hints = typing.get_type_hints(call, include_extras=True)
    slots: dict[str, list[str]] = {"p": [], "i": [], "f": []}
    for declared in fields(call):
        slots[hints[declared.name].__metadata__[0]].append(declared.name)
    if len(slots["p"]) > _SLOTS or len(slots["i"]) > _SLOTS or len(slots["f"]) > 1:
        raise TypeError(f"{call.__name__}: paw_args holds {_SLOTS} pointers, {_SLOTS} integers and one float")
    layout = _LAYOUTS[call] = (_getter(slots["p"]), _getter(slots["i"]), operator.attrgetter(slots["f"][0]) if slots["f"] else _no_value)
    return layout


def _getter(names: list[str]) -> _Getter:
    """The named fields of a call as a tuple, in order."""
    if not names:
        return lambda _: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda call: (one(call),)
    return operator.attrgetter(*names)


def _no_value(_: object) -> float:
    return 0.0


@dataclass(slots=True)
class AttentionCall(KernelCall):
    kernel = Kernel.ATTENTION
    q: Pointer
    prefix_keys: Pointer
    prefix_values: Pointer
    keys: Pointer
    values: Pointer
    out: Pointer
    prefix_length: Integer
    prefix_head_stride: Integer
    own_length: Integer
    head_stride: Integer
    rows: Integer
    heads: Integer
    kv_heads: Integer
    dim: Integer
    padded: Integer
    width: Integer
    scale: Value


@dataclass(slots=True)
class AttentionStepCall(KernelCall):
    kernel = Kernel.ATTENTION_STEP
    q: Pointer
    table: Pointer
    out: Pointer
    k: Pointer
    v: Pointer
    rows: Integer
    heads: Integer
    kv_heads: Integer
    dim: Integer
    width: Integer
    k_stride: Integer
    v_stride: Integer
    scale: Value


@dataclass(slots=True)
class GatedDeltaNetCall(KernelCall):
    kernel = Kernel.GATED_DELTA_NET
    q: Pointer
    k: Pointer
    v: Pointer
    g: Pointer
    beta: Pointer
    state: Pointer
    out: Pointer
    steps: Integer
    heads: Integer
    size: Integer
    width: Integer
    v_stride: Integer


@dataclass(slots=True)
class FlashOnlineCall(KernelCall):
    kernel = Kernel.FLASH_ONLINE
    q: Pointer
    keys: Pointer
    values: Pointer
    accumulated: Pointer
    high: Pointer
    total: Pointer
    head_stride: Integer
    rows: Integer
    heads: Integer
    kv_heads: Integer
    dim: Integer
    offset: Integer
    first: Integer
    last: Integer
    width: Integer
    scale: Value


@dataclass(slots=True)
class FlashTiledCall(KernelCall):
    kernel = Kernel.FLASH_TILED
    q: Pointer
    keys: Pointer
    values: Pointer
    out: Pointer
    head_stride: Integer
    rows: Integer
    heads: Integer
    kv_heads: Integer
    dim: Integer
    offset: Integer
    length: Integer
    width: Integer
    scale: Value


@dataclass(slots=True)
class FloatProductCall(KernelCall):
    kernel = Kernel.FLOAT
    weight: Pointer
    x: Pointer
    target: Pointer
    kind: Integer
    rows: Integer
    width: Integer
    tiled: Integer
    lanes: Integer


@dataclass(slots=True)
class RmsNormCall(KernelCall):
    kernel = Kernel.RMS_NORM
    x: Pointer
    weight: Pointer
    y: Pointer
    stride: Integer
    per_row: Integer
    n: Integer
    eps: Value


@dataclass(slots=True)
class SwigluCall(KernelCall):
    kernel = Kernel.SWIGLU
    gate: Pointer
    up: Pointer
    y: Pointer
    stride: Integer
    n: Integer
    width: Integer


@dataclass(slots=True)
class SiluCall(KernelCall):
    kernel = Kernel.SILU
    x: Pointer
    y: Pointer
    n: Integer
    width: Integer
    stride: Integer
    per: Integer


@dataclass(slots=True)
class GeluCall(KernelCall):
    kernel = Kernel.GELU
    x: Pointer
    table: Pointer
    y: Pointer


@dataclass(slots=True)
class SsmConvCall(KernelCall):
    kernel = Kernel.SSM_CONV
    window: Pointer
    rows: Pointer
    by_tap: Pointer
    out: Pointer
    channels: Integer
    taps: Integer
    rounded: Integer
    silu: Integer
    width: Integer
    stride: Integer


def kernel_calls() -> dict[Kernel, type[KernelCall]]:
    """Each kernel Python runs through `paw_run` and its call's class."""
    calls = (
        AttentionCall,
        AttentionStepCall,
        GatedDeltaNetCall,
        FlashOnlineCall,
        FlashTiledCall,
        FloatProductCall,
        RmsNormCall,
        SwigluCall,
        GeluCall,
        SsmConvCall,
        SiluCall,
    )
    return {call.kernel: call for call in calls}
