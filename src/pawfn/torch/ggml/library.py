"""The compiled C library (`NativeKernels`): its functions declared from `interface.EXPORTS`, each called by name with
named arguments, and the thread count a kernel runs on (`threads_for`)."""

from __future__ import annotations

import ctypes
import os
import typing
from pathlib import Path

import torch

from .interface import BLOCK_PRODUCTS, EXPORTS, FloatKind, FloatProductCall, Kernel, KernelCall, LibmOp, Out

__all__ = ["NativeKernels", "threads_for"]

_SPLIT_MIN_WORK = 1 << 16  # products below which a call runs on one thread (a thread hand-off costs ~20 us)


def threads_for(count: int, work: int) -> int:
    """Threads for a kernel over `count` outputs doing `work` products: torch's count where it pays for the hand-off."""
    return min(torch.get_num_threads(), count) if work >= _SPLIT_MIN_WORK else 1


class NativeKernels:
    """The compiled library, its functions declared from `EXPORTS` and called by name."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        """The shared library loaded."""
        self._functions: dict[str, typing.Any] = {}
        for name, (arguments, result) in EXPORTS.items():
            function = getattr(library, name)
            function.argtypes, function.restype = list(arguments), result
            self._functions[name] = function
        self.avx512 = self.use_avx512(True)
        """Whether the AVX-512 VNNI kernels (one-row Q6_K, eight-output Q4_0/Q8_0) run here, else the AVX2 ones."""
        self.amx = bool(self._functions["paw_amx_available"]()) and os.environ.get("PAW_AMX", "1") != "0"
        """Whether the tiled Q6_K kernel runs on AMX tiles here (Intel Sapphire Rapids and later; `PAW_AMX=0`: off)."""

    @property
    def instructions(self) -> str:
        """The instruction sets the products run on here, for reports: "AMX, AVX-512 VNNI", "AVX2" ..."""
        return ", ".join(name for name, used in (("AMX", self.amx), ("AVX-512 VNNI", self.avx512)) if used) or "AVX2"

    def use_avx512(self, allowed: bool) -> bool:
        """Let the AVX-512 kernels run where the CPU has them (the default) or not; returns whether they now run."""
        return bool(self._functions["paw_use_avx512"](int(allowed)))

    def run(self, call: KernelCall, count: int, work: int) -> None:
        """`call`'s kernel over [0, count), split across torch's thread count when `work` (int8 or float products) is
        large enough to pay for the hand-off."""
        self._functions["paw_run"](call.kernel, ctypes.byref(call.packed()), count, threads_for(count, work))

    def block_product(
        self, kernel: Kernel, x: int, rows: int, width: int, codes: int, sub: int, scale: int, out: int, target: Out, work: int
    ) -> None:
        """`paw_block_product`: x quantized, then multiplied by a block matrix, split across threads when large."""
        if kernel not in BLOCK_PRODUCTS:
            raise ValueError(f"{kernel.name} is not a block product")
        status = self._functions["paw_block_product"](kernel, x, rows, width, codes, sub, scale, out, ctypes.byref(target), threads_for(out, work))
        if status != 0:
            raise MemoryError("pawfn: no memory for a block product's scratch")

    def q6_k_amx_product(self, x: int, rows: int, width: int, codes: int, sub: int, scale_t: int, out: int, y: int, threads: int) -> None:
        """`paw_q6_k_amx_product`: x quantized to Q8_K, then the tiled Q6_K product on AMX into y."""
        if self._functions["paw_q6_k_amx_product"](x, rows, width, codes, sub, scale_t, out, y, threads) != 0:
            raise MemoryError("pawfn: no memory for a block product's scratch")

    def float_product(
        self,
        weight: int,
        kind: FloatKind,
        x: int,
        rows: int,
        width: int,
        out: int,
        tiled: bool,
        lanes: int,
        into: tuple[int, int, bool, float],
        bias: int = 0,
    ) -> None:
        """x [rows, width] (float32; bf16 bits for BF16 weights) times `kind` weights [out, width] with llama.cpp's
        dots of `lanes` lanes (tinyBLAS's where `tiled`), into (address, row stride, accumulate, alpha) as `paw_out`
        puts them, plus float32 `bias` [out] where set (an address; 0: none)."""
        target = Out(*into, bias)
        call = FloatProductCall(weight, x, ctypes.addressof(target), kind, rows, width, int(tiled), lanes)
        self.run(call, out, rows * out * width)

    def expf(self, x: int, y: int, count: int, width: int) -> None:
        """`count` float32 values of x through ggml's `expf` of `width` lanes, into y."""
        self._functions["paw_expf"](x, y, count, width)

    def libm(self, op: LibmOp, x: int, y: int, count: int) -> None:
        """`count` float32 values of x through the C library's `op`, into y."""
        self._functions["paw_libm"](op, x, y, count)

    def rope_neox(self, x: tuple[int, int, int], cos: int, sin: int, y: tuple[int, int, int], f16: bool, tokens: int, heads: int, dim: int) -> None:
        """NeoX rotation of x [tokens, heads, dim] by cos/sin tables [tokens, dim / 2], into y (float32, or f16 rounded
        to nearest even); each as (address, token stride, head stride) in values, a head's `dim` values contiguous."""
        self._functions["paw_rope_neox"](*x, cos, sin, *y, int(f16), tokens, heads, dim)

    def layer_norm(self, x: int, weight: int, bias: int, y: int, rows: int, n: int, eps: float, width: int) -> None:
        """ggml's layer norm (then its weight and bias) of x [rows, n] with `width`-lane variance sums, into y."""
        self._functions["paw_layer_norm"](x, weight, bias, y, rows, n, eps, width)

    def rope_table(self, positions: int, count: int, half: int, step: float, cos: int, sin: int) -> None:
        """cos and sin [count, half] of `p * step**i` by the C library's `cosf`, `sinf`."""
        self._functions["paw_rope_table"](positions, count, half, step, cos, sin)

    def unpack_q6_k(self, raw: int, blocks: int, codes: int, sub: int, scale: int) -> None:
        """`blocks` Q6_K blocks as read from a file into codes, sub-block scales and block scales."""
        self._functions["paw_unpack_q6_k"](raw, blocks, codes, sub, scale)

    def quantize_q8_k(self, x: int, rows: int, width: int, codes: int, scales: int, sums: int) -> None:
        """x [rows, width] float32 as llama.cpp's Q8_K blocks: int8 codes, float32 scales, int16 sums of sixteen."""
        self._functions["paw_quantize_q8_k"](x, rows, width, codes, scales, sums)

    def quantize_q8_0(self, x: int, rows: int, width: int, codes: int, scales: int) -> None:
        """x [rows, width] float32 as llama.cpp's Q8_0 blocks: int8 codes and float32 scales."""
        self._functions["paw_quantize_q8_0"](x, rows, width, codes, scales)
