"""Whose arithmetic the network runs, as one object chosen at load (`PawConfig.numerics`): torch's own
(`TorchArithmetic`) or llama.cpp's CPU backend's (`LlamaCppArithmetic`, on the C kernels or their torch emulation).

The passes and the families compute every norm, activation, rotation, attention and side path through it, so no
other module asks which mode runs; what differs between the modes is here, side by side.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.errors import ConfigError
from ...core.options import Numerics, ResolvedNumerics, WeightDType
from .attention import LLAMACPP_BATCH, StepSlots, attend, attend_batched, attend_llamacpp, attend_llamacpp_flash, attend_llamacpp_step
from .delta_rule import delta_rule, l2_normalized
from .families import Architecture
from .families.base import Family
from ..ggml.blocks import ggml_gelu, ggml_layer_norm, ggml_rms_norm, ggml_rope, ggml_rope_table, ggml_silu_mul
from ..ggml.hybrid import ggml_gated_delta_net, ggml_l2_norm, ggml_mrope_table, ggml_sigmoid, ggml_silu, ggml_softplus, ggml_ssm_conv
from ..ggml.c_kernels import NativeKernels, native_kernels, native_rms_norm, native_rope, native_swiglu
from ...core.cpuinfo import host_cpu_flags
from .product import Product
from .kvcache import KVCache

__all__ = [
    "Arithmetic",
    "LlamaCppArithmetic",
    "Product",
    "TorchArithmetic",
    "check_llamacpp_numerics",
    "llamacpp_numerics_problem",
    "numerics_problem",
    "open_arithmetic",
    "requested_arithmetic",
    "resolved_numerics",
    "simd_width",
]

_LOG = logging.getLogger("pawfn")

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Queries [T, heads, D], keys and values [T, KV heads, D] of new rows."""


def requested_arithmetic(numerics: Numerics, batch_invariant: bool | None, device_type: str) -> tuple[Numerics, bool]:
    """`PawConfig.numerics` and `.batch_invariant` decided together, once: llama.cpp's arithmetic computes every
    row as llama.cpp does alone, so batched products (`batch_invariant=False`) are torch's (auto then means torch's,
    naming llama.cpp's is an error); auto invariance is row-exact on the CPU only. Returns (numerics, invariant)."""
    if batch_invariant is False and numerics == "llamacpp":
        raise ConfigError("numerics='llamacpp' computes every row as llama.cpp does alone; drop batch_invariant=False (PAW_BATCH_INVARIANT)")
    invariant = device_type == "cpu" if batch_invariant is None else batch_invariant
    return ("native" if numerics == "auto" and batch_invariant is False else numerics), invariant


class Arithmetic:
    """Torch's float arithmetic in the compute dtype (`numerics="native"`): the operations as transformers + peft
    compute them. `LlamaCppArithmetic` overrides what llama.cpp computes otherwise."""

    numerics: ResolvedNumerics = "native"
    kernels: NativeKernels | None = None
    """The C kernels it runs on (llama.cpp's arithmetic where they built; None: torch's own, or the emulation)."""
    row_exact = False
    """Every decode step row by row whatever `batch_invariant` asks (llama.cpp computes each call alone)."""
    keeps_last_row = False
    """The last layer keeps only the rows whose outputs a pass returns, from its attention output on."""
    prefix_granule: int = 1
    """Tokens a whole prompt's cached prefix is a multiple of (`WholePrompt`): 1, or the batch from position 0 whose
    size decides the attention kernel (llama.cpp's flash attention in the official vision runtime: 128)."""

    prefix_tag = ""
    """What a stored prefix's key adds for this arithmetic (`PrefixStore`)."""

    def kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The KV cache's dtype for compute dtype `dtype`."""
        return dtype

    def describe(self, storage: str, device: str) -> str:
        """The engine line (`pawfn bench`, `TorchProgram.engine`) for weights kept as `storage` on `device`."""
        return f"torch numerics ({storage}) on {device}"

    # -- elementwise and norms --------------------------------------------------------------------------------------

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """`x / sqrt(sum(x^2) + eps)` over the last axis (Gated DeltaNet's key and query norm)."""
        return l2_normalized(x, eps)

    # -- Qwen3.5's recurrent layers ---------------------------------------------------------------------------------

    def convolve(self, window: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """silu of the causal short convolution of `window` [channels, K - 1 + T] by `kernel` [channels, K]: [T, channels]."""
        return F.silu((window.unfold(1, kernel.shape[1], 1) * kernel.unsqueeze(1)).sum(dim=-1).T)

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gated delta rule over T tokens: outputs [T, heads, value] and the memory after them."""
        return delta_rule(q, k, v, beta, decay, memory)

    # -- rotary embeddings ------------------------------------------------------------------------------------------

    def rotation_table(
        self, arch: Architecture, frequencies: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotated/2] of `positions` [T], or of M-RoPE positions [T, 4] (time, row, column, extra:
        each pair of dimensions turns with its section's position, `Architecture.pair_sections`)."""
        if positions.dim() == 2:
            sections = torch.tensor(arch.pair_sections(frequencies.shape[0]), device=positions.device)
            angles = positions.to(torch.float32)[:, sections] * frequencies.unsqueeze(0)
        else:
            angles = positions.to(torch.float32).unsqueeze(1) * frequencies.unsqueeze(0)
        return torch.cos(angles).to(dtype).unsqueeze(1), torch.sin(angles).to(dtype).unsqueeze(1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """NEOX-style rotation of `x` [T, heads, D] (its halves as pairs) by a `rotation_table`."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    # -- attention --------------------------------------------------------------------------------------------------

    def attend_prompt(
        self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV, batches: list[int], masks: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        """A prompt's rows: store k/v at `slot...`, attend causally; `masks` keeps one pass's causal mask by row count."""
        q, k, v = qkv
        n_new = q.shape[0]
        mask = None
        if n_new > 1:
            mask = masks.get(n_new)
            if mask is None:  # one mask per pass: every layer attends over the same positions
                group, end = arch.n_heads // arch.n_kv_heads, slot + n_new
                query_at = torch.arange(end - n_new, end, device=q.device).unsqueeze(1)
                hidden = torch.arange(0, end, device=q.device).unsqueeze(0) > query_at
                mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, -math.inf).repeat(group, 1)
                masks[n_new] = mask
        return attend(arch, cache, layer, slot, q, k, v, mask)

    def attend_row(self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV) -> torch.Tensor:
        """One decode row alone (row-exact): its k/v stored at `slot`, its query over its own positions and prefix."""
        return attend(arch, cache, layer, slot, *qkv, None)

    def attend_rows(self, arch: Architecture, rows: list[tuple[KVCache, int]], layer: int, qkv: QKV) -> torch.Tensor:
        """Decode rows together in one fused kernel (not row-exact)."""
        return attend_batched(arch, rows, layer, *qkv)

    def attend_each_row(self, arch: Architecture, slots: StepSlots, layer: int, qkv: QKV) -> torch.Tensor:
        """Decode rows (row i's (cache, slot) in `slots`), each attended exactly as `attend_row` attends it alone."""
        q, k, v = qkv
        return torch.cat(
            [self.attend_row(arch, cache, layer, slot, (q[i : i + 1], k[i : i + 1], v[i : i + 1])) for i, (cache, slot) in enumerate(slots.rows)]
        )


class TorchArithmetic(Arithmetic):
    """Torch's own arithmetic (`numerics="native"`)."""


class LlamaCppArithmetic(Arithmetic):
    """llama.cpp's CPU backend's arithmetic (`numerics="llamacpp"`) for SIMD `width` lanes, on its C `kernels`
    where they built, else their torch emulation; `flash`: its flash attention, each prompt whole (Qwen3.5)."""

    numerics: ResolvedNumerics = "llamacpp"
    row_exact = True
    keeps_last_row = True

    def __init__(self, width: int, kernels: NativeKernels | None, flash: bool) -> None:
        self.width = width
        self.kernels: NativeKernels | None = kernels
        self.flash = flash
        # its flash attention follows its batches of 128 from each call's first token: whole batches of the prefix are
        # the same in every call, so a prefix cut at one of their ends is too
        self.prefix_granule = LLAMACPP_BATCH if flash else 1
        self.prefix_tag = f"+llamacpp-numerics-{width}-lanes"  # it follows the CPU's vector width: a shared cache may span CPUs

    def kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float16  # the official runtime's cache

    def describe(self, storage: str, device: str) -> str:
        how = f"C kernels ({self.kernels.instructions})" if self.kernels is not None else "torch emulation (no C kernels built)"
        return f"llama.cpp numerics on {how}, {self.width} float32 lanes"

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            return ggml_silu_mul(gate, up, self.width)
        return native_swiglu(self.kernels, gate, up, self.width)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_gelu(x, self.kernels)

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_sigmoid(x, self.kernels)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_softplus(x, self.kernels)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_silu(x, self.width, self.kernels)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.kernels is not None:
            return native_rms_norm(self.kernels, x, weight, eps)
        return ggml_rms_norm(x, weight, eps)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_layer_norm(x, weight, bias, eps, self.width)

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_l2_norm(x, eps)

    def convolve(self, window: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        return ggml_silu(ggml_ssm_conv(window, kernel, self.width, self.kernels), self.width, self.kernels)

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ggml_gated_delta_net(q, k, v, decay, beta, memory, self.width, self.kernels)

    def rotation_table(
        self, arch: Architecture, frequencies: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rotated = arch.rope_dims or arch.head_dim
        if positions.dim() == 2:
            return ggml_mrope_table(positions, rotated, arch.rope_theta, arch.pair_sections(rotated // 2), self.kernels)
        return ggml_rope_table(positions, rotated, arch.rope_theta, self.kernels)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dim() == 3 and cos.shape[0] == x.shape[0]:
            return native_rope(self.kernels, x, cos, sin)
        return ggml_rope(x, cos, sin)

    def attend_prompt(
        self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV, batches: list[int], masks: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        if self.flash:
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, self.kernels, batches)
        return attend_llamacpp(cache, layer, slot, *qkv, self.width, self.kernels)  # it masks as it goes

    def attend_row(self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV) -> torch.Tensor:
        if self.flash:  # each decode step is a batch of one row
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, self.kernels, [1])
        return attend_llamacpp(cache, layer, slot, *qkv, self.width, self.kernels)

    def attend_each_row(self, arch: Architecture, slots: StepSlots, layer: int, qkv: QKV) -> torch.Tensor:
        if self.kernels is None or self.flash or arch.head_dim % (4 * self.width):
            return super().attend_each_row(arch, slots, layer, qkv)
        return attend_llamacpp_step(slots, arch, layer, *qkv, self.width, self.kernels)  # one C call; a shared prefix converted once


def simd_width() -> int:
    """float32 lanes of llama.cpp's vector kernels on this CPU (AVX-512: 16, AVX2: 8)."""
    return 16 if "avx512f" in host_cpu_flags() else 8


def llamacpp_numerics_problem(device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> str | None:
    """Why llama.cpp's arithmetic cannot run with these settings on this machine (None: it can)."""
    if device.type != "cpu" or dtype != torch.float32 or weight_dtype is not None:
        return (
            f"it runs on the CPU with dtype='float32' and no weight_dtype (it emulates llama.cpp's CPU arithmetic), not on "
            f"{device.type} with {str(dtype).removeprefix('torch.')}{'' if weight_dtype is None else f' and weight_dtype={weight_dtype!r}'}"
        )
    if not {"avx2", "fma"} <= host_cpu_flags():
        return (
            "it reproduces llama.cpp's x86 CPU kernels (AVX2 or AVX-512 with FMA), and /proc/cpuinfo lists neither here "
            "(an ARM CPU's llama.cpp rounds differently; other systems are not read)"
        )
    return None


def check_llamacpp_numerics(device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None) -> None:
    """Refuse `numerics="llamacpp"` where it cannot run, naming the fix."""
    problem = llamacpp_numerics_problem(device, dtype, weight_dtype)
    if problem is not None:
        raise ConfigError(f"numerics='llamacpp' cannot run: {problem}; drop those options or use numerics='native'")


def numerics_problem(
    family: Family, head_dim: int, source: Path, device: torch.device, dtype: torch.dtype, weight_dtype: WeightDType | None
) -> str | None:
    """Why llama.cpp's arithmetic cannot run for this base with these settings here (None: it can): what decides `auto`."""
    return llamacpp_numerics_problem(device, dtype, weight_dtype) or _family_problem(family, head_dim, simd_width(), source)


def _family_problem(family: Family, head_dim: int, width: int, source: Path) -> str | None:
    if not family.llamacpp_numerics:
        return f"it does not cover the {family.name} family's operations yet"
    if head_dim % width:  # llama.cpp then leaves tinyBLAS for other loops
        return f"it needs an attention head size that is a multiple of {width} on this CPU, and {source}'s is {head_dim}"
    return None


def resolved_numerics(
    numerics: Numerics,
    family: Family,
    head_dim: Callable[[], int | None],
    source: Path,
    device: torch.device,
    dtype: torch.dtype,
    weight_dtype: WeightDType | None,
) -> Numerics:
    """What `numerics` becomes for the base at `source`, decided before its load as `open_arithmetic` decides at it
    (`head_dim()`: the file's head size, None where it cannot be read, and the name is kept: the load says why): the
    engines' key, so programs naming `auto` and the arithmetic it resolves to share one base."""
    if numerics != "auto":
        return numerics
    if source.is_dir():
        return "native"
    size = head_dim()
    if size is None:
        return numerics
    return "native" if numerics_problem(family, size, source, device, dtype, weight_dtype) else "llamacpp"


def open_arithmetic(
    numerics: Numerics,
    family: Family,
    head_dim: int,
    source: Path,
    device: torch.device,
    dtype: torch.dtype,
    weight_dtype: WeightDType | None,
    held: Callable[[], str],
) -> Arithmetic:
    """The arithmetic for a base read from `source` (`PawConfig.numerics`, decided here): `auto` takes llama.cpp's for
    every GGUF base where it can run (F32 files too: llama.cpp still quantizes a quantized adapter's inputs and keeps
    an f16 cache) and torch's for Hugging Face folders, which llama.cpp does not read, and where llama.cpp's cannot
    run, said once in the log with why (`held()`: the file's matrix types, for that line); `llamacpp` is refused
    where it cannot run."""
    problem = numerics_problem(family, head_dim, source, device, dtype, weight_dtype)
    if numerics == "llamacpp":
        check_llamacpp_numerics(device, dtype, weight_dtype)
        if problem is not None:
            raise ConfigError(f"numerics='llamacpp' cannot run: {problem}; use numerics='native'")
    elif numerics == "native" or source.is_dir():
        return TorchArithmetic()
    elif problem is not None:
        _LOG.info(
            "numerics auto: %s holds %s matrices, but llama.cpp's arithmetic cannot run (%s): running torch's, whose tokens "
            "may differ from the official runtime's on some inputs",
            source.name,
            held(),
            problem,
        )
        return TorchArithmetic()
    return LlamaCppArithmetic(simd_width(), native_kernels(), family.llamacpp_flash_attention)
