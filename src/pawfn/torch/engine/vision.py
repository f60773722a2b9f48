"""The vision tower of an interpreter that takes images (Qwen3.5's), read from its projector GGUF (mmproj) and run
as llama.cpp's mtmd runs a `qwen3vl_merger` projector: the image resized within the token budget (Pillow's bicubic,
which mtmd reimplements: `image_resize`), 16-pixel patches from both temporal kernels, a learned position table
resized to the grid, ViT blocks with 2-D rotary positions, then each 2x2 block of patches merged and projected to the
text width.

Its arithmetic comes with the base's (`Arithmetic.tower`): where llama.cpp's runs (the default on the CPU) it is
mtmd's own, and the embeddings are mtmd's bit for bit (tests/torch/test_qwen35_images.py, F32, F16 and BF16
projectors); with `numerics="native"` it is torch's float32 with mtmd's GELU and the patches' f16 inputs, within ~5e-4
of mtmd's largest value on F32 projectors, ~4e-3 on BF16 ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...core.errors import BaseModelError
from ...formats.ggufio import GGUFFile, GGUFFormatError
from ...core.images import Image, ImageLimits
from ..model.arithmetic.tower import PatchEmbedding, TowerArithmetic, TowerMatrix
from .image_resize import resized, target_size

__all__ = ["PromptImage", "PreparedImage", "VisionTower"]

_F32 = np.float32


@dataclass(frozen=True)
class PreparedImage:
    """An image as the tower takes it: normalized pixels and its grid of merged tokens."""

    pixels: torch.Tensor
    """[3, height, width] float32, normalized by the projector's mean and std."""
    rows: int
    """Merged tokens down the image."""
    columns: int
    """Merged tokens across the image."""

    @property
    def n_tokens(self) -> int:
        """Embeddings the image becomes (one per merged 2x2 block of patches)."""
        return self.rows * self.columns

    @property
    def n_positions(self) -> int:
        """Positions the image advances the text by (M-RoPE: its longer side in tokens, as mtmd counts)."""
        return max(self.rows, self.columns)


@dataclass(frozen=True)
class PromptImage:
    """An image in a call's prompt: prepared on the caller's thread, encoded by `tower` when the prompt runs."""

    image: PreparedImage
    tower: VisionTower

    def embeddings(self) -> torch.Tensor:
        """The image's embeddings [tokens, text width] (the tower's whole pass: run it on the compute thread)."""
        return self.tower.encode(self.image)


_KEPT_POSITIONS = 16 * 2**20
"""Bytes of position table a tower keeps between calls (a 720x720 image's is 5.9 MB; 4096 tokens' 50 MB are not kept)."""


@dataclass(frozen=True)
class _Settings:
    patch: int
    merge: int
    width: int
    heads: int
    layers: int
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int


class VisionTower:
    """A projector's weights on one device and the passes that turn an image into text-width embeddings."""

    def __init__(
        self,
        path: Path,
        settings: _Settings,
        vectors: dict[str, torch.Tensor],
        matrices: dict[str, TowerMatrix],
        patches: PatchEmbedding,
        arithmetic: TowerArithmetic,
    ) -> None:
        self.path = path
        self._settings = settings
        self._vectors = vectors
        """Biases, norms and the position table, float32."""
        self._matrices = matrices
        self._patches = patches
        self._arithmetic = arithmetic
        self.embedding_width = vectors["mm.2.bias"].shape[0]
        """Width of the embeddings it gives (the text model's hidden size)."""
        self._kept_positions: tuple[tuple[int, int], torch.Tensor] | None = None
        """The last grid's position table in merge order (the same every call of that size)."""

    @classmethod
    def read(cls, path: Path, device: torch.device, image_tokens: tuple[int, int] | None, arithmetic: TowerArithmetic) -> VisionTower:
        """Load a `qwen3vl_merger` projector GGUF; `image_tokens` bounds an image's merged tokens (min, max), as the
        runtime manifest's `image_min_tokens`/`image_max_tokens` (None: mtmd's defaults for the projector, 8..4096);
        `arithmetic`: how it computes (`Arithmetic.tower`)."""
        try:
            file = GGUFFile(path)
            settings = _settings(file, image_tokens)
            _check_shapes(path, settings, {name: file.tensor_shape(name) for name in file.tensor_names()})
            vectors: dict[str, torch.Tensor] = {}
            matrices: dict[str, TowerMatrix] = {}
            for name in file.tensor_names():
                if name.startswith("v.patch_embd.weight"):
                    continue
                if len(file.tensor_shape(name)) == 2 and name != "v.position_embd.weight":
                    matrices[name.removesuffix(".weight")] = arithmetic.matrix(file, name, device)
                else:
                    vectors[name] = torch.from_numpy(file.read_f32(name)).to(device)  # pyright: ignore[reportUnknownMemberType]  # untyped
            patches = arithmetic.patch_embedding(file, settings.patch, device)
        except BaseModelError:
            raise
        except (GGUFFormatError, OSError, ValueError) as exc:
            raise BaseModelError(path, f"cannot read this projector: {exc}") from None
        return cls(path, settings, vectors, matrices, patches, arithmetic)

    def prepare(self, image: Image, limits: ImageLimits | None = None) -> PreparedImage:
        """`image` decoded by the official contract, resized as mtmd does (a multiple of 32 pixels a side within
        the token budget, aspect kept, black padding where rounding leaves a pixel) and normalized."""
        settings = self._settings
        with image.rgb(limits) as rgb:
            width, height = target_size(rgb.width, rgb.height, settings)
            pixels = resized(rgb, width, height)
        values = torch.from_numpy(pixels.astype(_F32) / _F32(255.0))  # pyright: ignore[reportUnknownMemberType]  # untyped
        mean = torch.tensor(settings.mean, dtype=torch.float32)
        std = torch.tensor(settings.std, dtype=torch.float32)
        normalized = ((values - mean) / std).permute(2, 0, 1).contiguous()
        align = settings.patch * settings.merge
        return PreparedImage(normalized, height // align, width // align)

    @torch.inference_mode()
    def encode(self, image: PreparedImage) -> torch.Tensor:
        """The image's embeddings [rows * columns, embedding_width] float32, merged blocks in row-major order."""
        s, t, ops = self._settings, self._vectors, self._arithmetic
        patches = self._patches(image.pixels.to(t["mm.0.bias"].device))  # [grid_h, grid_w, width]
        grid_h, grid_w = patches.shape[0], patches.shape[1]
        hidden = _merge_order(patches) + t["v.patch_embd.bias"]
        hidden = hidden + self._positions(grid_h, grid_w)
        rows, columns = _patch_positions(grid_h, grid_w, hidden.device)
        cos, sin = ops.rotation(rows, columns, s.width // s.heads)
        if "v.pre_ln.weight" in t:
            hidden = self._norm(hidden, "v.pre_ln")
        for layer in range(s.layers):
            block = f"v.blk.{layer}."
            # each residual sum into the product's own new tensor (addition commutes: the same bits, no new buffer)
            hidden = self._attention(self._norm(hidden, block + "ln1"), block, cos, sin).add_(hidden)
            up = self._linear(self._norm(hidden, block + "ln2"), block + "ffn_up")
            hidden = self._linear(ops.gelu(up), block + "ffn_down").add_(hidden)
        hidden = self._norm(hidden, "v.post_ln")
        merged = hidden.reshape(-1, 4 * s.width)  # each 2x2 block's patches side by side
        return self._linear(ops.gelu(self._linear(merged, "mm.0")), "mm.2")

    def _positions(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """`_position_table` in merge order [patches, width], kept for the last grid up to `_KEPT_POSITIONS` bytes:
        images of one size in a row (a camera's) skip its bilinear resize (~15 ms a 720x720 image)."""
        kept = self._kept_positions
        if kept is not None and kept[0] == (grid_h, grid_w):
            return kept[1]
        table = _merge_order(self._position_table(grid_h, grid_w))
        if table.numel() * table.element_size() <= _KEPT_POSITIONS:
            self._kept_positions = ((grid_h, grid_w), table)
        return table

    def _position_table(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """The learned position table [grid_h, grid_w, width], resized (bilinearly, corners aligned) when the grid
        differs from the table's square."""
        table = self._vectors["v.position_embd.weight"]
        side = math.isqrt(table.shape[0])
        square = table.reshape(side, side, -1)
        if (grid_h, grid_w) == (side, side):
            return square
        return self._arithmetic.position_table(square, grid_h, grid_w)

    def _attention(self, x: torch.Tensor, block: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        s, ops = self._settings, self._arithmetic
        n, head = x.shape[0], s.width // s.heads
        q, k, v = self._linear(x, block + "attn_qkv").view(n, 3, s.heads, head).unbind(dim=1)
        return self._linear(ops.rotated_attention(q, k, v, cos, sin), block + "attn_out")

    def _linear(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return self._arithmetic.linear(self._matrices[prefix], x, self._vectors[prefix + ".bias"])

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return self._arithmetic.layer_norm(x, self._vectors[prefix + ".weight"], self._vectors[prefix + ".bias"], self._settings.eps)


def _settings(file: GGUFFile, image_tokens: tuple[int, int] | None) -> _Settings:
    kind = file.string("clip.projector_type")
    if kind != "qwen3vl_merger":
        raise GGUFFormatError(f"its projector type is {kind!r}; pawfn runs qwen3vl_merger projectors (Qwen3.5's)")
    if any(file.booleans("clip.vision.is_deepstack_layers") or []):
        raise GGUFFormatError("it has deepstack layers (Qwen3-VL's), which Qwen3.5's tower has not")
    patch = _positive(file, "clip.vision.patch_size")
    merge = file.integer("clip.vision.spatial_merge_size") or 2
    if merge != 2:
        raise GGUFFormatError(f"its spatial merge is {merge}; a qwen3vl_merger merges 2x2 patches")
    width, heads = _positive(file, "clip.vision.embedding_length"), _positive(file, "clip.vision.attention.head_count")
    if width % heads or (width // heads) % 4:
        raise GGUFFormatError(f"{heads} heads do not split its width {width} into heads of a multiple of 4")
    fewest, most = image_tokens or (8, 4096)  # mtmd's limits for Qwen-VL projectors unless the runtime sets its own
    area = patch * patch * merge * merge
    return _Settings(
        patch=patch,
        merge=merge,
        width=width,
        heads=heads,
        layers=_positive(file, "clip.vision.block_count"),
        eps=file.number("clip.vision.attention.layer_norm_epsilon") or 1e-6,
        mean=_triple(file, "clip.vision.image_mean"),
        std=_triple(file, "clip.vision.image_std"),
        min_pixels=fewest * area,
        max_pixels=most * area,
    )


def _positive(file: GGUFFile, key: str) -> int:
    value = file.integer(key)
    if value is None or value <= 0:
        raise GGUFFormatError(f"metadata {key} is missing or not positive")
    return value


def _triple(file: GGUFFile, key: str) -> tuple[float, float, float]:
    value = file.value(key)
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, float | int) for v in value):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]  # a metadata list of unknown items
        raise GGUFFormatError(f"metadata {key} should be 3 numbers (one per colour)")
    red, green, blue = (float(v) for v in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]  # checked numbers above
    if key.endswith("std") and not all(v > 0 for v in (red, green, blue)):
        raise GGUFFormatError(f"metadata {key} must be positive")
    return red, green, blue


def _check_shapes(path: Path, s: _Settings, shapes: dict[str, tuple[int, ...]]) -> None:
    """`BaseModelError` naming the first tensor the tower reads that is missing or of another shape."""
    for name, shape in _expected_shapes(s, shapes).items():
        found = shapes.get(name)
        if found != shape:
            problem = "is missing" if found is None else f"has shape {found}, expected {shape}"
            raise BaseModelError(path, f"projector tensor {name} {problem}")


def _expected_shapes(s: _Settings, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads, with its shape (the position table's square side and the output width come
    from the file's `shapes`)."""
    n_positions = shapes.get("v.position_embd.weight", (0,))[0]
    if n_positions < 1 or math.isqrt(n_positions) ** 2 != n_positions:
        n_positions = -1  # not a square table: the shape check names it
    out = shapes.get("mm.2.weight", (-1,))[0]
    expected: dict[str, tuple[int, ...]] = {
        "v.patch_embd.weight": (s.width, 3, s.patch, s.patch),
        "v.patch_embd.weight.1": (s.width, 3, s.patch, s.patch),
        "v.patch_embd.bias": (s.width,),
        "v.position_embd.weight": (n_positions, s.width),
        "v.post_ln.weight": (s.width,),
        "v.post_ln.bias": (s.width,),
        "mm.0.weight": (4 * s.width, 4 * s.width),
        "mm.0.bias": (4 * s.width,),
        "mm.2.weight": (out, 4 * s.width),
        "mm.2.bias": (out,),
    }
    inner = shapes.get("v.blk.0.ffn_up.weight", (-1,))[0]
    for layer in range(s.layers):
        block = f"v.blk.{layer}."
        for norm in ("ln1", "ln2"):
            expected |= {f"{block}{norm}.weight": (s.width,), f"{block}{norm}.bias": (s.width,)}
        expected |= {
            block + "attn_qkv.weight": (3 * s.width, s.width),
            block + "attn_qkv.bias": (3 * s.width,),
            block + "attn_out.weight": (s.width, s.width),
            block + "attn_out.bias": (s.width,),
            block + "ffn_up.weight": (inner, s.width),
            block + "ffn_up.bias": (inner,),
            block + "ffn_down.weight": (s.width, inner),
            block + "ffn_down.bias": (s.width,),
        }
    return expected


def _merge_order(grid: torch.Tensor) -> torch.Tensor:
    """[H, W, C] patches as [H * W, C] in mtmd's order: 2x2 blocks row by row, each block's four patches row-major."""
    h, w, c = grid.shape
    return grid.reshape(h // 2, 2, w // 2, 2, c).permute(0, 2, 1, 3, 4).reshape(h * w, c)


def _patch_positions(grid_h: int, grid_w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's row and column [patches] (int64) in mtmd's merge order, as its M-RoPE positions give them."""
    rows = torch.arange(grid_h, device=device).view(grid_h, 1).expand(grid_h, grid_w)
    columns = torch.arange(grid_w, device=device).view(1, grid_w).expand(grid_h, grid_w)
    return _merge_order(rows.unsqueeze(-1)).squeeze(-1), _merge_order(columns.unsqueeze(-1)).squeeze(-1)
