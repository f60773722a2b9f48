"""Which arithmetic a base runs (`PawConfig.numerics`): decided from the options, the CPU and the base's file, before
its load (`resolved_numerics`, the engines' key) and at it (`open_arithmetic`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from ....core.cpuinfo import host_cpu_flags
from ....core.errors import ConfigError
from ....core.options import Numerics, WeightDType
from ..families.base import Family
from .base import Arithmetic, TorchArithmetic
from .llamacpp import llamacpp_arithmetic

__all__ = [
    "check_llamacpp_numerics",
    "llamacpp_numerics_problem",
    "numerics_problem",
    "open_arithmetic",
    "requested_arithmetic",
    "resolved_numerics",
    "simd_width",
]

_LOG = logging.getLogger("pawfn")


def requested_arithmetic(numerics: Numerics, batch_invariant: bool | None, device_type: str) -> tuple[Numerics, bool]:
    """`PawConfig.numerics` and `.batch_invariant` decided together, once: llama.cpp's arithmetic computes every
    row as llama.cpp does alone, so batched products (`batch_invariant=False`) are torch's (auto then means torch's,
    naming llama.cpp's is an error); auto invariance is row-exact on the CPU only. Returns (numerics, invariant)."""
    if batch_invariant is False and numerics == "llamacpp":
        raise ConfigError("numerics='llamacpp' computes every row as llama.cpp does alone; drop batch_invariant=False (PAW_BATCH_INVARIANT)")
    invariant = device_type == "cpu" if batch_invariant is None else batch_invariant
    return ("native" if numerics == "auto" and batch_invariant is False else numerics), invariant


def simd_width() -> int:
    """float32 lanes of llama.cpp's vector kernels on this CPU (AVX-512: 16, AVX2: 8)."""
    return 16 if "avx512f" in host_cpu_flags() else 8


def bf16_pairs() -> bool:
    """Whether llama.cpp dots BF16 values with `vdpbf16ps` on this CPU (AVX-512 BF16), not widened to float32."""
    return {"avx512f", "avx512_bf16"} <= host_cpu_flags()


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
    return llamacpp_arithmetic(simd_width(), family.llamacpp_flash_attention, bf16_pairs())
