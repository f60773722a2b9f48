"""The base's matrices ready to multiply: plain `F.linear` in the compute dtype, or (CPU, `PawConfig.weight_dtype`)
fbgemm's kernels over matrices packed once at load: float16 weights with float32 activations (near-exact), or
int8 per-row weights with activations quantized to 8 bits per call (prompts) or per row (decode steps;
fastest, lossy).

Decode steps multiply through `Matrix.rows`, whose every output row depends on its own input row only, bit for
bit, however many rows share the call: a row decoded in a batch then gets exactly the tokens it gets alone.

A matrix is first *compressed* (its stored form: float16 values, or int8 values and one float32 scale per row;
what the converted-weights file holds) and then *packed* for the kernel (fbgemm's own layout, built per process).
Both are exact per row, so concatenating rows (fused q/k/v) before or after either step gives the same values.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from ...core.cpuinfo import host_cpu_flags
from ...core.errors import ConfigError
from ...core.options import WeightDType

__all__ = [
    "Float16Matrix",
    "GraphOrderMatrix",
    "Int8Matrix",
    "Matrix",
    "PlainMatrix",
    "check_kernel",
    "compress",
    "concat_stored",
    "int8_weight_bits",
    "pack",
    "plain",
    "stored_names",
]

_INT8_LIMIT = 127.0
_TINY = torch.finfo(torch.float32).tiny
_SCALE = ".scale"


class Matrix:
    """`x @ W.T (+ bias)` for one base matrix (or several fused by rows) in torch's arithmetic: `PlainMatrix`,
    `Float16Matrix` or `Int8Matrix` (fbgemm's packed kernels). `rows` computes each output row as if its input row
    were multiplied alone; what differs is how (each subclass's `rows`)."""

    def __init__(self, bias: torch.Tensor | None) -> None:
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step's product where rows need not be exact: one product of all rows."""
        return self(x)

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self(x)` in place."""
        y += self(x) * alpha

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """`y += alpha * self.rows(x)` in place."""
        y += self.rows(x) * alpha

    def _biased(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias


class PlainMatrix(Matrix):
    """`F.linear` on the plain weight `[out, in]` in its own dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(bias)
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """One row per product: MKL's float32 GEMM rounds differently by row count (padding every product to a
        fixed 8 rows would be exact too, but made a lone Qwen3-0.6B decode step ~14 ms slower)."""
        if x.shape[0] == 1:
            return F.linear(x, self.weight, self.bias)
        return torch.cat([F.linear(x[i : i + 1], self.weight, self.bias) for i in range(x.shape[0])])

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        """Added inside the product (one pass over `y` instead of three: LoRA side paths are thin products with
        wide outputs)."""
        if self.bias is not None:
            super().accumulate(y, x, alpha)
            return
        y.addmm_(x, self.weight.t(), alpha=alpha)

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        if self.bias is not None:
            super().accumulate_rows(y, x, alpha)
            return
        weight = self.weight.t()
        for i in range(x.shape[0]):  # a row per product, like `rows`
            y[i : i + 1].addmm_(x[i : i + 1], weight, alpha=alpha)


class GraphOrderMatrix(PlainMatrix):
    """A plain matrix whose side path is multiplied, then scaled, then added, each rounded apart: llama.cpp's graph
    (its emulation's fallback where a LoRA half has no GGUF blocks or the C kernels did not build)."""

    def accumulate(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        y += self(x) * torch.tensor(alpha, dtype=torch.float32)

    def accumulate_rows(self, y: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        y += self.rows(x) * torch.tensor(alpha, dtype=torch.float32)


class Float16Matrix(Matrix):
    """float16 weights packed for fbgemm's fp16 kernel, float32 activations: already exact per row."""

    def __init__(self, packed: object, bias: torch.Tensor | None) -> None:
        super().__init__(bias)
        self._packed = packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._biased(torch.ops.quantized.linear_dynamic_fp16(x, self._packed))

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)


class Int8Matrix(Matrix):
    """int8 per-row weights packed for fbgemm, activations quantized to 8 bits per call (`__call__`) or per row."""

    def __init__(self, packed: object, bias: torch.Tensor | None) -> None:
        super().__init__(bias)
        self._packed = packed
        self._ends: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._biased(torch.ops.quantized.linear_dynamic(x, self._packed, False))

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """Each row quantized with its own scale to integers; fbgemm then multiplies integers exactly (int32 sums),
        since an extra row holding the range's ends makes its per-call quantization the identity."""
        top = _INT8_LIMIT
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min_(_TINY) / top
        integers = torch.empty((x.shape[0] + 1, x.shape[1]), dtype=x.dtype, device=x.device)
        torch.div(x, scale, out=integers[:-1]).round_()
        integers[-1] = self._range_row(x)
        y: torch.Tensor = torch.ops.quantized.linear_dynamic(integers, self._packed, False)[:-1] * scale
        return self._biased(y)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row quantization is one product too: a step's rows come out exact for free."""
        return self.rows(x)

    def _range_row(self, x: torch.Tensor) -> torch.Tensor:
        """A row holding -(top+1) and top: with it, the call's range is [-(top+1), top], so scale 1, zero point top+1."""
        ends = self._ends
        if ends is None or ends.shape[0] != x.shape[1]:
            ends = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
            ends[0], ends[-1] = -_INT8_LIMIT - 1, _INT8_LIMIT
            self._ends = ends
        return ends


_NARROW_LIMIT = 63.0
"""The largest int8 weight packed where fbgemm sums pairs of u8 * s8 products in int16 (`int8_weight_bits`)."""


@functools.cache
def int8_weight_bits() -> int:
    """The bits an int8 weight keeps when packed here: 8, or 7 where fbgemm's int8 kernel sums pairs of u8 * s8
    products in int16 (CPUs without VNNI), which saturates past 32767. At 7 bits no pair can (2 * 255 * 63 < 32767)
    and activations keep all 8 (fbgemm's `reduce_range` keeps 7 of the activations' bits instead, which loses far
    more tokens: 3 of 16 of the official runtime's sequences on the trained Qwen3 against 9, on an AVX2-only EPYC).
    With VNNI the sums are int32."""
    return 8 if host_cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"} else 7


def check_kernel(weight_dtype: WeightDType, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a `weight_dtype` that cannot run on `device` with compute `dtype`, naming the fix."""
    if device.type != "cpu" or dtype != torch.float32:
        raise ConfigError(
            f"weight_dtype={weight_dtype!r} runs on the CPU with dtype='float32' (fbgemm's kernels), not on "
            f"{device.type} with {dtype}; on a GPU use dtype='float16' or 'bfloat16' instead"
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ConfigError(f"weight_dtype={weight_dtype!r} needs torch's fbgemm kernels (x86 CPUs); leave weight_dtype unset")
    names = ("linear_prepack_fp16", "linear_dynamic_fp16") if weight_dtype == "float16" else ("linear_prepack", "linear_dynamic")
    for name in names:
        try:
            getattr(torch.ops.quantized, name)
        except (AttributeError, RuntimeError) as exc:
            raise ConfigError(
                f"weight_dtype={weight_dtype!r} needs torch.ops.quantized.{name}, which this torch {torch.__version__} "
                "lacks; leave weight_dtype unset (float32) or install torch 2.13"
            ) from exc
    if weight_dtype == "int8":
        # torch warns once per process that quantized tensors are deprecated: take that warning here, on one
        # thread, so packing (on several threads, where filtering warnings is not thread-safe) never shows it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            _per_row_quantized(torch.zeros((1, 1), dtype=torch.int8), torch.ones(1))


def stored_names(name: str, weight_dtype: WeightDType) -> tuple[str, ...]:
    """The stored tensors of matrix `name`."""
    return (name,) if weight_dtype == "float16" else (name, name + _SCALE)


def compress(name: str, weight: torch.Tensor, weight_dtype: WeightDType) -> dict[str, torch.Tensor]:
    """The stored form of float32 matrix `weight` `[out, in]`: float16 values, or int8 values with a per-row scale
    (symmetric, the row's largest magnitude maps to 127)."""
    if weight_dtype == "float16":
        return {name: weight.to(torch.float16)}
    scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / _INT8_LIMIT
    values = torch.round(weight / scale.unsqueeze(1)).clamp_(-_INT8_LIMIT, _INT8_LIMIT).to(torch.int8)
    return {name: values, name + _SCALE: scale}


def concat_stored(parts: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str], weight_dtype: WeightDType) -> dict[str, torch.Tensor]:
    """Stored forms of matrices `names` joined by rows, under the first name (fused q/k/v, gate/up)."""
    joined = {names[0]: torch.cat([part[name] for part, name in zip(parts, names, strict=True)])}
    if weight_dtype == "int8":
        joined[names[0] + _SCALE] = torch.cat([part[name + _SCALE] for part, name in zip(parts, names, strict=True)])
    return joined


def pack(name: str, stored: Mapping[str, torch.Tensor], weight_dtype: WeightDType, bias: torch.Tensor | None) -> Matrix:
    """Matrix `name` packed for its fbgemm kernel from its stored form."""
    if weight_dtype == "float16":
        return Float16Matrix(torch.ops.quantized.linear_prepack_fp16(stored[name].float(), None), bias)
    values, scale = stored[name], stored[name + _SCALE]
    if int8_weight_bits() == 7:
        values = torch.round(values.float() * (_NARROW_LIMIT / _INT8_LIMIT)).to(torch.int8)
        scale = scale * (_INT8_LIMIT / _NARROW_LIMIT)
    return Int8Matrix(torch.ops.quantized.linear_prepack(_per_row_quantized(values, scale), None), bias)


def _per_row_quantized(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The quantized tensor fbgemm's int8 packing takes (torch marks these deprecated; the kernel takes nothing
    else yet, and `check_kernel` names the fix once the ops are gone)."""
    return torch._make_per_channel_quantized_tensor(  # pyright: ignore[reportPrivateImportUsage, reportPrivateUsage]  # the one way to build it
        values, scale.to(torch.float64), torch.zeros(values.shape[0], dtype=torch.long), 0
    )


def plain(weight: torch.Tensor, bias: torch.Tensor | None) -> PlainMatrix:
    """Matrix `weight` multiplied with `F.linear` in its own dtype."""
    return PlainMatrix(weight, bias)
