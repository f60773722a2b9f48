"""llama.cpp's CPU backend's arithmetic (`numerics="llamacpp"`): its torch emulation (`LlamaCppArithmetic`), and
the same numbers on the C kernels where they build (`NativeLlamaCppArithmetic`); `llamacpp_arithmetic` picks."""

from __future__ import annotations

import functools
import logging

import gguf
import numpy as np
import numpy.typing as npt
import torch

from ....core.options import ResolvedNumerics
from ...ggml.blocks import block_matrix
from ...ggml.float_ops import ggml_gelu, ggml_gelu_table, ggml_layer_norm, ggml_rms_norm, ggml_rope, ggml_rope_table, ggml_silu_mul
from ...ggml.float_ops import native_rope_table_for
from ...ggml.activations import native_gelu, native_swiglu
from ...ggml.c_kernels import native_gated_delta_net, native_kernels, native_layer_norm, native_libm, native_rms_norm, native_rope
from ...ggml.floats import float_matrix
from ...ggml.hybrid import ggml_gated_delta_net, ggml_l2_norm, ggml_mrope_table, ggml_sigmoid, ggml_silu, ggml_softplus, ggml_ssm_conv
from ...ggml.hybrid import native_flash_attention, native_l2_norm, native_silu, native_ssm_conv_for
from ...ggml.interface import LibmOp
from ...ggml.library import NativeKernels
from ...ggml.native_blocks import native_block_matrix
from ..attention import LLAMACPP_BATCH, StepSlots, attend_llamacpp, attend_llamacpp_flash, attend_llamacpp_native, attend_llamacpp_step
from ..families import Architecture
from ..kvcache import KVCache
from ..packed import GraphOrderMatrix
from ..product import Kept, Product, Storage, StoredProduct
from .base import QKV, Arithmetic
from .tower import NativeMtmdTower, TowerArithmetic

__all__ = ["LlamaCppArithmetic", "NativeLlamaCppArithmetic", "llamacpp_arithmetic"]

_LOG = logging.getLogger("pawfn")


def llamacpp_arithmetic(width: int, flash: bool, bf16_pairs: bool) -> LlamaCppArithmetic:
    """llama.cpp's arithmetic for SIMD `width` lanes (`flash`: its flash attention; `bf16_pairs`: its BF16 dots by
    AVX-512 BF16's `vdpbf16ps`), on the C kernels where they build, else their torch emulation (the same numbers,
    several times slower)."""
    kernels = native_kernels()
    if kernels is None:
        return LlamaCppArithmetic(width, flash, bf16_pairs)
    return NativeLlamaCppArithmetic(width, flash, bf16_pairs, kernels)


class LlamaCppArithmetic(Arithmetic):
    """llama.cpp's CPU backend's arithmetic for SIMD `width` lanes in torch: the reference its C twin is tested
    against; `flash`: its flash attention, each prompt whole (Qwen3.5); `bf16_pairs`: BF16 matrices dotted in
    `vdpbf16ps` pairs (a CPU with AVX-512 BF16), else widened to float32."""

    numerics: ResolvedNumerics = "llamacpp"
    row_exact = True
    keeps_last_row = True

    def __init__(self, width: int, flash: bool, bf16_pairs: bool) -> None:
        self.width = width
        self.flash = flash
        self.bf16_pairs = bf16_pairs
        # its flash attention follows its batches of 128 from each call's first token: whole batches of the prefix are
        # the same in every call, so a prefix cut at one of their ends is too
        self.prefix_granule = LLAMACPP_BATCH if flash else 1
        # it follows the CPU's vector width and BF16 dots: a shared cache may span CPUs
        self.prefix_tag = f"+llamacpp-numerics-{width}-lanes{'-bf16-pairs' if bf16_pairs else ''}"

    def kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float16  # the official runtime's cache

    def describe(self, storage: str, device: str) -> str:
        return f"llama.cpp numerics on torch emulation (no C kernels built), {self.width} float32 lanes"

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return ggml_silu_mul(gate, up, self.width)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_gelu(x)

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_sigmoid(x)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_softplus(x)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_silu(x, self.width)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_rms_norm(x, weight, eps)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_layer_norm(x, weight, bias, eps, self.width)

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_l2_norm(x, eps)

    def convolve(self, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        return ggml_silu(ggml_ssm_conv(torch.cat((window, rows)).T, kernel, self.width), self.width)

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ggml_gated_delta_net(q, k, v, decay, beta, memory, self.width)

    def rotation_table(
        self, arch: Architecture, frequencies: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rotated = arch.rope_dims or arch.head_dim
        if positions.dim() == 2:
            return ggml_mrope_table(positions, rotated, arch.rope_theta, arch.pair_sections(rotated // 2))
        return ggml_rope_table(positions, rotated, arch.rope_theta)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return ggml_rope(x, cos, sin)

    def attend_prompt(
        self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV, batches: list[int], masks: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        if self.flash:
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, batches)
        return attend_llamacpp(cache, layer, slot, *qkv, self.width)  # it masks as it goes

    def attend_row(self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV) -> torch.Tensor:
        if self.flash:  # each decode step is a batch of one row
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, [1])
        return attend_llamacpp(cache, layer, slot, *qkv, self.width)

    def keep(self, storage: Storage[Kept]) -> Kept:
        return storage.as_stored()  # each matrix in its file's type, biases after the side paths

    def stored_matrix(
        self, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool
    ) -> StoredProduct | None:
        return block_matrix(raw, qtype, out_features, base_layer)

    def float_matrix(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Product:
        return GraphOrderMatrix(weight, bias)  # a side path multiplied, then scaled, then added, as llama.cpp's graph

    def tower(self) -> TowerArithmetic:
        """torch's float32 tower, said in the log: mtmd's arithmetic in torch (`MtmdTower`, the C kernels' reference)
        takes minutes an image (133 s for 256x256 on Qwen3.5-0.8B's tower), every multiply-add a torch step."""
        _LOG.warning(
            "pawfn: the C kernels did not build, so the image tower runs torch's float32 arithmetic (within ~4e-3 of mtmd's "
            "embeddings, not bit for bit; mtmd's arithmetic in torch would take minutes an image): install a C compiler "
            "(gcc or clang) for mtmd's exact arithmetic"
        )
        return TowerArithmetic()


class NativeLlamaCppArithmetic(LlamaCppArithmetic):
    """`LlamaCppArithmetic` on its C `kernels`: the same numbers at llama.cpp's speed."""

    def __init__(self, width: int, flash: bool, bf16_pairs: bool, kernels: NativeKernels) -> None:
        super().__init__(width, flash, bf16_pairs)
        self.kernels = kernels

    def describe(self, storage: str, device: str) -> str:
        return f"llama.cpp numerics on C kernels ({self.kernels.instructions}), {self.width} float32 lanes"

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return native_swiglu(self.kernels, gate, up, self.width)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return native_gelu(self.kernels, x, ggml_gelu_table())

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return native_libm(self.kernels, LibmOp.SIGMOID, x)

    def softplus(self, x: torch.Tensor) -> torch.Tensor:
        return native_libm(self.kernels, LibmOp.SOFTPLUS, x)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return native_silu(self.kernels, x, self.width)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return native_rms_norm(self.kernels, x, weight, eps)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return native_layer_norm(self.kernels, x, weight, bias, eps, self.width)

    def l2_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return native_l2_norm(self.kernels, x, eps)

    def convolve(self, window: torch.Tensor, rows: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        return native_ssm_conv_for(self.kernels, window, rows, kernel, self.width, silu=True)

    def delta_rule(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, decay: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return native_gated_delta_net(self.kernels, q, k, v, decay, beta, memory, self.width)

    def rotation_table(
        self, arch: Architecture, frequencies: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rotated = arch.rope_dims or arch.head_dim
        table = functools.partial(native_rope_table_for, self.kernels)
        if positions.dim() == 2:
            return ggml_mrope_table(positions, rotated, arch.rope_theta, arch.pair_sections(rotated // 2), table)
        return table(positions, rotated, arch.rope_theta)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and cos.shape[0] == x.shape[0]:
            return native_rope(self.kernels, x, cos, sin)
        return ggml_rope(x, cos, sin)

    def attend_prompt(
        self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV, batches: list[int], masks: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        if self.flash:
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, batches, functools.partial(native_flash_attention, self.kernels))
        return attend_llamacpp_native(cache, layer, slot, *qkv, self.width, self.kernels)

    def attend_row(self, arch: Architecture, cache: KVCache, layer: int, slot: int, qkv: QKV) -> torch.Tensor:
        if self.flash:  # each decode step is a batch of one row
            return attend_llamacpp_flash(cache, layer, slot, *qkv, self.width, [1], functools.partial(native_flash_attention, self.kernels))
        return attend_llamacpp_native(cache, layer, slot, *qkv, self.width, self.kernels)

    def attend_each_row(self, arch: Architecture, slots: StepSlots, layer: int, qkv: QKV) -> torch.Tensor:
        if self.flash or arch.head_dim % (4 * self.width):
            return super().attend_each_row(arch, slots, layer, qkv)
        return attend_llamacpp_step(slots, arch, layer, *qkv, self.width, self.kernels)  # one C call; a shared prefix converted once

    def stored_matrix(
        self, raw: npt.NDArray[np.uint8], qtype: gguf.GGMLQuantizationType, out_features: int, base_layer: bool
    ) -> StoredProduct | None:
        floats = float_matrix(self.kernels, raw, qtype, out_features, self.width, self.bf16_pairs)
        return floats if floats is not None else native_block_matrix(self.kernels, raw, qtype, out_features, base_layer)

    def tower(self) -> TowerArithmetic:
        return NativeMtmdTower(self.width, self.bf16_pairs, self.kernels)
