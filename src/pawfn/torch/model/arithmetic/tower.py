"""How an image tower computes (`TowerArithmetic`), chosen with its base's arithmetic (`Arithmetic.tower`): torch's
float32 (`numerics="native"`, and where the C kernels did not build), or mtmd's own arithmetic where llama.cpp's runs
on the C kernels (`NativeMtmdTower`; `MtmdTower` is its torch reference), which gives mtmd's embeddings bit for bit:
the projector's matrices in their file's type (BF16 dotted as this CPU's llama.cpp dots them, in `vdpbf16ps` pairs
or widened), the patches by im2col and one product per frame, ggml's layer norm, its bilinear resize of the position
table, the vision RoPE's table by repeated float32 products, its flash attention (f16 keys and values) and its GELU
table."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from ....formats.ggufio import GGUFFile
from ...ggml.blocks import block_matrix
from ...ggml.activations import native_gelu
from ...ggml.c_kernels import native_layer_norm, native_rope
from ...ggml.float_ops import fma32, ggml_gelu, ggml_gelu_table, ggml_layer_norm, ggml_rope, ggml_rope_table, native_rope_table_for
from ...ggml.floats import NativeFloatMatrix, float_matrix, ggml_float_product
from ...ggml.hybrid import ggml_image_attention, native_image_attention
from ...ggml.library import NativeKernels
from ...ggml.native_blocks import native_block_matrix

__all__ = ["MtmdTower", "NativeMtmdTower", "PatchEmbedding", "TowerArithmetic", "TowerMatrix", "rotate_halves"]

TowerMatrix = Callable[[torch.Tensor], torch.Tensor]
"""`x` [n, in] times one of the projector's `[out, in]` matrices: [n, out] (no bias), a tensor of its own (the tower adds
the bias to it in place)."""
PatchEmbedding = Callable[[torch.Tensor], torch.Tensor]
"""Normalized pixels [3, H, W] to the patches' embeddings [H / patch, W / patch, width]: both frames' products
added, before the bias."""

_PATCH_KERNELS = ("v.patch_embd.weight", "v.patch_embd.weight.1")
_ROPE_BASE = 10000.0


class TowerArithmetic:
    """torch's float32, with two of mtmd's roundings that bring its embeddings ten times closer to mtmd's: ggml's
    GELU (an f16 table) and the patch product's f16 inputs (ggml's im2col, unless the kernels are BF16)."""

    def matrix(self, file: GGUFFile, name: str, device: torch.device) -> TowerMatrix:
        """The projector's matrix `name` as this arithmetic multiplies it."""
        weight = torch.from_numpy(file.read_f32(name)).to(device)  # pyright: ignore[reportUnknownMemberType]  # torch's from_numpy is untyped
        return functools.partial(_linear, weight=weight)

    def linear(self, matrix: TowerMatrix, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """`matrix(x)` then its bias (ggml_add's rounding), added in place: every tower matrix returns a tensor of its
        own, and a new [patches, width] buffer for the sum cost 5x the addition (0.74 against 0.14 ms at 1200 x 3072)."""
        return matrix(x).add_(bias)

    def patch_embedding(self, file: GGUFFile, patch: int, device: torch.device) -> PatchEmbedding:
        """The two frames' patch kernels [width, 3, patch, patch] as one convolution each, added."""
        f16 = file.tensor_type_name(_PATCH_KERNELS[0]) != "BF16"
        kernels = [torch.from_numpy(file.read_f32(name)).to(device) for name in _PATCH_KERNELS]  # pyright: ignore[reportUnknownMemberType]  # untyped
        if f16:
            kernels = [kernel.half().float() for kernel in kernels]

        def embed(pixels: torch.Tensor) -> torch.Tensor:
            image = pixels.unsqueeze(0).half().float() if f16 else pixels.unsqueeze(0)
            return (F.conv2d(image, kernels[0], stride=patch) + F.conv2d(image, kernels[1], stride=patch))[0].permute(1, 2, 0)

        return embed

    def position_table(self, square: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """The learned table [side, side, width] resized bilinearly (corners aligned) to [grid_h, grid_w, width]."""
        resized = F.interpolate(square.permute(2, 0, 1).unsqueeze(0), size=(grid_h, grid_w), mode="bilinear", align_corners=True)
        return resized[0].permute(1, 2, 0)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def rotation(self, rows: torch.Tensor, columns: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, 1, head / 2] of the vision RoPE: the first quarter of a head's pairs turn with each
        patch's row, the second with its column, frequencies 10000^(-4i/head)."""
        quarter = head // 4
        frequencies = 1.0 / (_ROPE_BASE ** (torch.arange(quarter, dtype=torch.float64, device=rows.device) * 4.0 / head))
        angles = torch.cat((rows.double().unsqueeze(1) * frequencies, columns.double().unsqueeze(1) * frequencies), dim=1).float()
        return torch.cos(angles).unsqueeze(1), torch.sin(angles).unsqueeze(1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rotate_halves(x, cos, sin)

    def rotated_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`attention` of the rotated queries and keys (`rotate`) and the values."""
        return self.attention(self.rotate(q, cos, sin), self.rotate(k, cos, sin), v)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every patch attending to every patch: q, k, v [n, heads, head] to [n, heads * head]."""
        n, heads, head = q.shape
        # [1, heads, n, head]: with the batch dimension torch runs its fused CPU kernel (3.5x faster than 3-D inputs)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(head))
        return out[0].transpose(0, 1).reshape(n, heads * head)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return ggml_gelu(x)


class MtmdTower(TowerArithmetic):
    """mtmd's arithmetic for SIMD `width` lanes (`bf16_pairs`: BF16 dotted by `vdpbf16ps`), in torch: the reference
    its C twin is tested against (minutes an image on a real tower: without the C kernels a base's tower runs
    `TowerArithmetic`, `LlamaCppArithmetic.tower`)."""

    def __init__(self, width: int, bf16_pairs: bool) -> None:
        self.width = width
        self.bf16_pairs = bf16_pairs

    def matrix(self, file: GGUFFile, name: str, device: torch.device) -> TowerMatrix:
        raw, qtype = file.raw(name)
        if qtype in _FLOAT_TYPES:
            weight = torch.from_numpy(file.read_f32(name))  # pyright: ignore[reportUnknownMemberType]  # untyped
            return functools.partial(ggml_float_product, weight=weight, qtype=qtype, width=self.width, bf16_pairs=self.bf16_pairs)
        blocks = block_matrix(raw, qtype, file.tensor_shape(name)[0])
        return blocks if blocks is not None else super().matrix(file, name, device)

    def patch_embedding(self, file: GGUFFile, patch: int, device: torch.device) -> PatchEmbedding:
        kernels = [self._patch_matrix(file, name) for name in _PATCH_KERNELS]

        def embed(pixels: torch.Tensor) -> torch.Tensor:
            channels, height, width = pixels.shape
            # ggml's im2col: a row per patch (row-major), its values channel by channel, each patch row by row
            columns = pixels.reshape(channels, height // patch, patch, width // patch, patch).permute(1, 3, 0, 2, 4)
            columns = columns.reshape(-1, channels * patch * patch)
            return (kernels[0](columns) + kernels[1](columns)).reshape(height // patch, width // patch, -1)

        return embed

    def _patch_matrix(self, file: GGUFFile, name: str) -> TowerMatrix:
        """ggml's convolution multiplies im2col's patches by the kernel as an F32 matrix where the kernel is BF16
        (widened), else as an F16 one (the kernel and the patches rounded to f16)."""
        values = file.read_f32(name)
        values = values.reshape(values.shape[0], -1)
        if file.tensor_type_name(name) == "BF16":
            return self._float_product(values, gguf.GGMLQuantizationType.F32)
        return self._float_product(values.astype(np.float16), gguf.GGMLQuantizationType.F16)

    def _float_product(self, values: np.ndarray[tuple[int, int], np.dtype[np.float32 | np.float16]], qtype: gguf.GGMLQuantizationType) -> TowerMatrix:
        weight = torch.from_numpy(values.astype(np.float32))  # pyright: ignore[reportUnknownMemberType]  # untyped
        return functools.partial(ggml_float_product, weight=weight, qtype=qtype, width=self.width, bf16_pairs=self.bf16_pairs)

    def position_table(self, square: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """`ggml_interpolate` (bilinear, corners aligned): `a(1-dx)(1-dy) + b dx(1-dy) + c(1-dx)dy + d dx dy` with
        GCC's contraction of ggml's C++ (the first product fused with the rounded second, then each later one)."""
        y0, y1, dy = _bilinear_axis(grid_h, square.shape[0])
        x0, x1, dx = _bilinear_axis(grid_w, square.shape[1])
        a, b, c, d = square[y0][:, x0], square[y0][:, x1], square[y1][:, x0], square[y1][:, x1]
        dx, dy = dx.view(1, -1, 1), dy.view(-1, 1, 1)
        one = torch.tensor(1.0)
        value = fma32(a * (one - dx), one - dy, b * dx * (one - dy))
        return fma32(d * dx, dy, fma32(c * (one - dx), dy, value))

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return ggml_layer_norm(x, weight, bias, eps, self.width)

    def rotation(self, rows: torch.Tensor, columns: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`ggml_mrope_cache_init` for GGML_ROPE_TYPE_VISION: each quarter's angle restarts from its position (row,
        then column) and advances by repeated float32 products with `powf(10000, -4/head)`."""
        (row_cos, row_sin), (column_cos, column_sin) = self._rope_table(rows, head // 2), self._rope_table(columns, head // 2)
        return torch.cat((row_cos, column_cos), dim=-1), torch.cat((row_sin, column_sin), dim=-1)

    def _rope_table(self, positions: torch.Tensor, rotated: int) -> tuple[torch.Tensor, torch.Tensor]:
        return ggml_rope_table(positions, rotated, _ROPE_BASE)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return ggml_rope(x, cos, sin)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ggml_image_attention(q, k, v, self.width)


class NativeMtmdTower(MtmdTower):
    """`MtmdTower` on its C `kernels`: the same numbers, the products as llama.cpp's kernels run them."""

    def __init__(self, width: int, bf16_pairs: bool, kernels: NativeKernels) -> None:
        super().__init__(width, bf16_pairs)
        self.kernels = kernels

    def matrix(self, file: GGUFFile, name: str, device: torch.device) -> TowerMatrix:
        raw, qtype = file.raw(name)
        out_features = file.tensor_shape(name)[0]
        product = float_matrix(self.kernels, raw, qtype, out_features, self.width, self.bf16_pairs)
        if product is not None:
            return product
        blocks = native_block_matrix(self.kernels, raw, qtype, out_features, False)
        return blocks if blocks is not None else TowerArithmetic.matrix(self, file, name, device)

    def _float_product(self, values: np.ndarray[tuple[int, int], np.dtype[np.float32 | np.float16]], qtype: gguf.GGMLQuantizationType) -> TowerMatrix:
        raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
        product = float_matrix(self.kernels, raw, qtype, values.shape[0], self.width, self.bf16_pairs)
        assert product is not None  # F32 and F16 are float matrices
        return product

    def linear(self, matrix: TowerMatrix, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # a float matrix adds the bias as its kernel stores each value (the same rounding, no pass of its own)
        return matrix.biased(x, bias) if isinstance(matrix, NativeFloatMatrix) else super().linear(matrix, x, bias)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        return native_layer_norm(self.kernels, x, weight, bias, eps, self.width)

    def _rope_table(self, positions: torch.Tensor, rotated: int) -> tuple[torch.Tensor, torch.Tensor]:
        return native_rope_table_for(self.kernels, positions, rotated, _ROPE_BASE)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return native_rope(self.kernels, x, cos, sin)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return native_image_attention(self.kernels, q, k, v, self.width)

    def rotated_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # the keys rotated straight into attention's f16 [heads, n, D] (one pass where three were: copy, rotation, cast)
        keys = native_rope(self.kernels, k, cos, sin, f16_by_head=True)
        return native_image_attention(self.kernels, native_rope(self.kernels, q, cos, sin), keys, v, self.width, keys_by_head=True)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return native_gelu(self.kernels, x, ggml_gelu_table())


_FLOAT_TYPES = frozenset({gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16})


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation of `x` [..., D] by cos/sin [..., D/2] in torch's float arithmetic: element i pairs with i + D/2."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def _bilinear_axis(size: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One axis of `ggml_interpolate`'s bilinear resize from `side` to `size` with corners aligned: each output's
    two source indices (clamped) and its weight toward the second, in float32 as ggml computes them."""
    scale = np.float32(size - 1) / np.float32(side - 1) if size > 1 and side > 1 else np.float32(size) / np.float32(side)
    position = np.arange(size, dtype=np.float32) / scale
    below = np.floor(position).astype(np.int64)
    first, second = np.clip(below, 0, side - 1), np.clip(below + 1, 0, side - 1)
    weight = np.clip(position - first.astype(np.float32), np.float32(0.0), np.float32(1.0)).astype(np.float32)
    return torch.from_numpy(first), torch.from_numpy(second), torch.from_numpy(weight)  # pyright: ignore[reportUnknownMemberType]  # untyped
