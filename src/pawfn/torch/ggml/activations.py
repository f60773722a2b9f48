"""Activations on the C kernels (`kernels.c`), each in one pass over rows split across threads: SwiGLU, SiLU and
GELU with llama.cpp's numbers (`float_ops` and `hybrid` hold their torch emulations)."""

from __future__ import annotations

import torch

from .c_kernels import ELEMENTWISE_WORK, pointer
from .interface import GeluCall, SiluCall, SwigluCall
from .library import NativeKernels

__all__ = ["native_gelu", "native_silu", "native_swiglu"]


def native_swiglu(kernels: NativeKernels, gate: torch.Tensor, up: torch.Tensor, width: int) -> torch.Tensor:
    """`float_ops.ggml_silu_mul` in C. Float32 [T, n] halves with one row stride (e.g. column views of one product) are
    read in place; rows split across threads where there are enough of them."""
    n = gate.shape[-1]
    y = torch.empty(gate.shape, dtype=torch.float32)
    if y.numel() == 0:
        return y
    if gate.dtype == up.dtype == torch.float32 and gate.dim() == up.dim() == 2 and gate.stride() == up.stride() and gate.stride(1) == 1:
        stride = gate.stride(0)
    else:
        gate, up, stride = gate.float().contiguous(), up.float().contiguous(), n
    kernels.run(SwigluCall(pointer(gate), pointer(up), pointer(y), stride=stride, n=n, width=width), y.numel() // n, y.numel() * ELEMENTWISE_WORK)
    return y


def native_silu(kernels: NativeKernels, x: torch.Tensor, width: int) -> torch.Tensor:
    """`hybrid.ggml_silu` in C along x's last axis, in one pass (whole vectors of `width` lanes, the rest by the C
    library's expf), rows split across threads where there are enough of them. A float32 [T, per, n] view with
    contiguous [per, n] rows (a wider product's columns) is read in place."""
    n = x.shape[-1] if x.dim() else 1
    y = torch.empty(x.shape, dtype=torch.float32)
    if not y.numel():
        return y
    if x.dtype == torch.float32 and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == n:
        stride, per = x.stride(0), x.shape[1]
    else:
        x = x.float().contiguous()
        stride, per = n, 1
    kernels.run(SiluCall(pointer(x), pointer(y), n=n, width=width, stride=stride, per=per), y.numel() // n, y.numel() * ELEMENTWISE_WORK)
    return y


def native_gelu(kernels: NativeKernels, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`float_ops.ggml_gelu` in C: every value of x through `table` (float32 [65536], by f16 bits), split across
    threads when large."""
    x = x.float().contiguous()
    y = torch.empty_like(x)
    if y.numel():
        kernels.run(GeluCall(pointer(x), pointer(table), pointer(y)), y.numel(), y.numel() * ELEMENTWISE_WORK)
    return y
