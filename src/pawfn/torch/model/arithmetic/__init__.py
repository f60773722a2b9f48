"""Whose arithmetic the network runs, as one strategy object chosen at load (`PawConfig.numerics`): torch's own
(`TorchArithmetic`, in `base`) or llama.cpp's CPU backend's (`LlamaCppArithmetic`, its C twin
`NativeLlamaCppArithmetic`, in `llamacpp`); `choice` decides which.

The passes and the families compute every norm, activation, rotation, attention and side path through it, and the
loaders keep each matrix as it says (`stored_matrix`, `float_matrix`), so no other module asks which mode runs, or
whether the C kernels built: what differs between the modes is here, side by side.
"""

from __future__ import annotations

from ..product import Product
from .base import QKV, Arithmetic, TorchArithmetic
from .choice import (
    check_llamacpp_numerics,
    llamacpp_numerics_problem,
    numerics_problem,
    open_arithmetic,
    requested_arithmetic,
    resolved_numerics,
    simd_width,
)
from .llamacpp import LlamaCppArithmetic, NativeLlamaCppArithmetic, llamacpp_arithmetic

__all__ = [
    "QKV",
    "Arithmetic",
    "LlamaCppArithmetic",
    "NativeLlamaCppArithmetic",
    "Product",
    "TorchArithmetic",
    "check_llamacpp_numerics",
    "llamacpp_arithmetic",
    "llamacpp_numerics_problem",
    "numerics_problem",
    "open_arithmetic",
    "requested_arithmetic",
    "resolved_numerics",
    "simd_width",
]
