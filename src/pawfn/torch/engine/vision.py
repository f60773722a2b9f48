"""The vision tower of an interpreter that takes images (Qwen3.5's), read from its projector GGUF (mmproj) and run
as llama.cpp's mtmd runs a `qwen3vl_merger` projector: the image resized within the token budget (Pillow's bicubic,
which mtmd reimplements), 16-pixel patches from both temporal kernels, a learned position table resized to the
grid, ViT blocks with 2-D rotary positions, then each 2x2 block of patches merged and projected to the text width.

Arithmetic is float32 with two of llama.cpp's roundings, which bring the embeddings ten times closer to its own:
its GELU (an f16 lookup table) and the patch convolution's f16 inputs (ggml's im2col, unless the kernel is BF16).
Its flash attention (f16 keys, values and sums) is not followed: on F32 projectors the embeddings agree with mtmd's
to ~5e-4 of their largest value (tests/torch/test_qwen35_images.py asserts 1e-3), on BF16 ones to ~4e-3 (measured once,
by hand, on a BF16 copy of the test's projector).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from ...core.errors import BaseModelError
from ...formats.ggufio import GGUFFile, GGUFFormatError
from ...core.images import Image, ImageLimits
from ..ggml.float_ops import ggml_gelu

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["PromptImage", "PreparedImage", "VisionTower"]

_F32 = np.float32

Activation = Callable[[torch.Tensor], torch.Tensor]
"""An elementwise function of a tensor."""


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

    def __init__(self, path: Path, settings: _Settings, tensors: dict[str, torch.Tensor], bf16_kernel: bool, gelu: Activation = ggml_gelu) -> None:
        self.path = path
        self._gelu = gelu
        """Its GELU: ggml's table, in C where the base's arithmetic runs on the C kernels (`Arithmetic.tower_gelu`)."""
        self._settings = settings
        self._tensors = tensors
        self._bf16_kernel = bf16_kernel
        """The patch kernels are BF16 (ggml then convolves in float32, else with f16 inputs)."""
        self.embedding_width = tensors["mm.2.weight"].shape[0]
        """Width of the embeddings it gives (the text model's hidden size)."""

    @classmethod
    def read(cls, path: Path, device: torch.device, image_tokens: tuple[int, int] | None, gelu: Activation = ggml_gelu) -> VisionTower:
        """Load a `qwen3vl_merger` projector GGUF; `image_tokens` bounds an image's merged tokens (min, max), as the
        runtime manifest's `image_min_tokens`/`image_max_tokens` (None: mtmd's defaults for the projector, 8..4096);
        `gelu`: its GELU (`Arithmetic.tower_gelu`: ggml's table, in C where it can be)."""
        try:
            file = GGUFFile(path)
            settings = _settings(file, image_tokens)
            tensors = {name: torch.from_numpy(file.read_f32(name)).to(device) for name in file.tensor_names()}  # pyright: ignore[reportUnknownMemberType]  # torch's from_numpy is untyped
            bf16_kernel = file.has_tensor("v.patch_embd.weight") and file.tensor_type_name("v.patch_embd.weight") == "BF16"
        except (GGUFFormatError, OSError, ValueError) as exc:
            raise BaseModelError(path, f"cannot read this projector: {exc}") from None
        expected = _expected_shapes(settings, tensors)
        for name, shape in expected.items():
            found = tensors.get(name)
            if found is None or tuple(found.shape) != shape:
                problem = "is missing" if found is None else f"has shape {tuple(found.shape)}, expected {shape}"
                raise BaseModelError(path, f"projector tensor {name} {problem}")
        return cls(path, settings, tensors, bf16_kernel, gelu)

    def prepare(self, image: Image, limits: ImageLimits | None = None) -> PreparedImage:
        """`image` decoded by the official contract, resized as mtmd does (a multiple of 32 pixels a side within
        the token budget, aspect kept, black padding where rounding leaves a pixel) and normalized."""
        settings = self._settings
        with image.rgb(limits) as rgb:
            width, height = _target_size(rgb.width, rgb.height, settings)
            pixels = _resized(rgb, width, height)
        values = torch.from_numpy(pixels.astype(_F32) / _F32(255.0))  # pyright: ignore[reportUnknownMemberType]  # untyped
        mean = torch.tensor(settings.mean, dtype=torch.float32)
        std = torch.tensor(settings.std, dtype=torch.float32)
        normalized = ((values - mean) / std).permute(2, 0, 1).contiguous()
        align = settings.patch * settings.merge
        return PreparedImage(normalized, height // align, width // align)

    @torch.inference_mode()
    def encode(self, image: PreparedImage) -> torch.Tensor:
        """The image's embeddings [rows * columns, embedding_width] float32, merged blocks in row-major order."""
        s, t = self._settings, self._tensors
        device = t["mm.0.weight"].device
        pixels = image.pixels.to(device).unsqueeze(0)
        kernels = t["v.patch_embd.weight"], t["v.patch_embd.weight.1"]
        if not self._bf16_kernel:  # ggml's im2col is f16 unless the kernel is BF16
            pixels, kernels = pixels.half().float(), (kernels[0].half().float(), kernels[1].half().float())
        # a still image is both frames of the temporal patch: one convolution per frame's kernel, added
        patches = F.conv2d(pixels, kernels[0], stride=s.patch) + F.conv2d(pixels, kernels[1], stride=s.patch)
        grid_h, grid_w = patches.shape[2], patches.shape[3]
        hidden = _merge_order(patches[0].permute(1, 2, 0)) + t["v.patch_embd.bias"]
        hidden = hidden + _merge_order(self._position_table(grid_h, grid_w))
        cos, sin = _rotation(grid_h, grid_w, s.width // s.heads, device)
        if "v.pre_ln.weight" in t:
            hidden = self._norm(hidden, "v.pre_ln")
        for layer in range(s.layers):
            block = f"v.blk.{layer}."
            hidden = hidden + self._attention(self._norm(hidden, block + "ln1"), block, cos, sin)
            up = self._linear(self._norm(hidden, block + "ln2"), block + "ffn_up")
            hidden = hidden + self._linear(self._gelu(up), block + "ffn_down")
        hidden = self._norm(hidden, "v.post_ln")
        merged = hidden.reshape(-1, 4 * s.width)  # each 2x2 block's patches side by side
        return self._linear(self._gelu(self._linear(merged, "mm.0")), "mm.2")

    def _position_table(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """The learned position table [grid_h, grid_w, width], resized bilinearly (corners aligned) when the grid
        differs from the table's square."""
        table = self._tensors["v.position_embd.weight"]
        side = math.isqrt(table.shape[0])
        square = table.reshape(side, side, -1)
        if (grid_h, grid_w) == (side, side):
            return square
        resized = F.interpolate(square.permute(2, 0, 1).unsqueeze(0), size=(grid_h, grid_w), mode="bilinear", align_corners=True)
        return resized[0].permute(1, 2, 0)

    def _attention(self, x: torch.Tensor, block: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        s = self._settings
        n, head = x.shape[0], s.width // s.heads
        q, k, v = self._linear(x, block + "attn_qkv").view(n, 3, s.heads, head).unbind(dim=1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # [1, heads, n, head]: with the batch dimension torch runs its fused CPU kernel (3.5x faster than 3-D inputs)
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(head))
        return self._linear(out[0].transpose(0, 1).reshape(n, s.width), block + "attn_out")

    def _linear(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.linear(x, self._tensors[prefix + ".weight"], self._tensors[prefix + ".bias"])

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self._tensors[prefix + ".weight"], self._tensors[prefix + ".bias"], self._settings.eps)


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


def _expected_shapes(s: _Settings, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower reads, with its shape (the position table's square side and the output width come
    from the file)."""
    positions = tensors.get("v.position_embd.weight")
    n_positions = 0 if positions is None else positions.shape[0]
    if n_positions < 1 or math.isqrt(n_positions) ** 2 != n_positions:
        n_positions = -1  # not a square table: the shape check names it
    out = tensors["mm.2.weight"].shape[0] if "mm.2.weight" in tensors else -1
    shapes: dict[str, tuple[int, ...]] = {
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
    ffn = tensors.get("v.blk.0.ffn_up.weight")
    inner = -1 if ffn is None else ffn.shape[0]
    for layer in range(s.layers):
        block = f"v.blk.{layer}."
        for norm in ("ln1", "ln2"):
            shapes |= {f"{block}{norm}.weight": (s.width,), f"{block}{norm}.bias": (s.width,)}
        shapes |= {
            block + "attn_qkv.weight": (3 * s.width, s.width),
            block + "attn_qkv.bias": (3 * s.width,),
            block + "attn_out.weight": (s.width, s.width),
            block + "attn_out.bias": (s.width,),
            block + "ffn_up.weight": (inner, s.width),
            block + "ffn_up.bias": (inner,),
            block + "ffn_down.weight": (s.width, inner),
            block + "ffn_down.bias": (s.width,),
        }
    return shapes


def _target_size(width: int, height: int, s: _Settings) -> tuple[int, int]:
    """mtmd's `calc_size_preserved_ratio` in its float32 arithmetic: each side rounded to a multiple of
    patch * merge, then scaled down into `max_pixels` or up into `min_pixels`, the aspect ratio kept."""
    align = s.patch * s.merge

    def by_factor(x: np.float32, rounding: str) -> int:
        quotient = x / _F32(align)
        whole = np.floor(quotient)
        if rounding == "ceil" and quotient > whole or rounding == "round" and quotient - whole >= _F32(0.5):
            whole += 1  # std::round takes halves away from zero (numpy's round would take them to even)
        return int(whole) * align

    w_bar = max(align, by_factor(_F32(width), "round"))
    h_bar = max(align, by_factor(_F32(height), "round"))
    if h_bar * w_bar > s.max_pixels:
        beta = np.sqrt(_F32(height) * _F32(width) / _F32(s.max_pixels))
        h_bar = max(align, by_factor(_F32(height) / beta, "floor"))
        w_bar = max(align, by_factor(_F32(width) / beta, "floor"))
    elif h_bar * w_bar < s.min_pixels:
        beta = np.sqrt(_F32(s.min_pixels) / (_F32(height) * _F32(width)))
        h_bar = by_factor(_F32(height) * beta, "ceil")
        w_bar = by_factor(_F32(width) * beta, "ceil")
    return w_bar, h_bar


def _resized(rgb: PILImage, width: int, height: int) -> npt.NDArray[np.uint8]:
    """mtmd's resize with `PAD_CEIL`: scaled by the smaller ratio (float32), each side the ceiling within the target,
    resampled bicubic (`_resampled`), centred on black. [height, width, 3] uint8."""
    pixels = np.asarray(rgb, dtype=np.uint8)
    if (rgb.width, rgb.height) == (width, height):
        return pixels
    scale = min(_F32(width) / _F32(rgb.width), _F32(height) / _F32(rgb.height))
    inner_w = min(int(np.ceil(_F32(rgb.width) * scale)), width)
    inner_h = min(int(np.ceil(_F32(rgb.height) * scale)), height)
    canvas = np.zeros((height, width, 3), dtype=np.uint8)
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    canvas[top : top + inner_h, left : left + inner_w] = _resampled(pixels, inner_w, inner_h)
    return canvas


def _resampled(pixels: npt.NDArray[np.uint8], width: int, height: int) -> npt.NDArray[np.uint8]:
    """Pillow's bicubic filter (a = -0.5, widened when shrinking, 22-bit fixed-point weights, 8-bit rounding between
    passes) as mtmd runs it: always across first, then down (Pillow itself may go down first, which rounds apart)."""
    if pixels.shape[1] != width:
        pixels = _filtered(pixels.transpose(1, 0, 2), width).transpose(1, 0, 2)
    if pixels.shape[0] != height:
        pixels = _filtered(pixels, height)
    return np.ascontiguousarray(pixels)


_PRECISION_BITS = 22
_GATHERED_VALUES = 4 * 1024 * 1024
"""Input values (int64) one pass of the filter gathers: 32 MiB, whatever the image's size."""


def _filtered(pixels: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.uint8]:
    """`pixels` [n, m, 3] resampled along its first axis to `size` rows."""
    n = pixels.shape[0]
    scale = n / size
    filter_scale = max(scale, 1.0)
    support = 2.0 * filter_scale
    width = math.ceil(support) * 2 + 1
    centers = (np.arange(size, dtype=np.float64) + 0.5) * scale
    first = np.maximum(np.trunc(centers - support + 0.5).astype(np.int64), 0)
    count = np.minimum(np.trunc(centers + support + 0.5).astype(np.int64), n) - first
    offsets = np.arange(width, dtype=np.int64)
    distance = np.abs((offsets[None, :] + first[:, None] - centers[:, None] + 0.5) / filter_scale)
    near = ((1.5 * distance - 2.5) * distance * distance) + 1  # (a + 2) x^3 - (a + 3) x^2 + 1 with a = -0.5
    far = (((distance - 5) * distance + 8) * distance - 4) * -0.5
    weights = np.where(distance < 1.0, near, np.where(distance < 2.0, far, 0.0))
    weights = np.where(offsets[None, :] < count[:, None], weights, 0.0)
    totals = weights.sum(axis=1, keepdims=True)
    weights = np.where(totals != 0.0, weights / np.where(totals != 0.0, totals, 1.0), weights)
    fixed = np.trunc(weights * (1 << _PRECISION_BITS) + np.where(weights < 0, -0.5, 0.5)).astype(np.int64)
    rows = np.minimum(first[:, None] + offsets[None, :], n - 1)  # past `count` the weight is 0
    filtered = np.empty((size, *pixels.shape[1:]), dtype=np.uint8)
    step = max(1, _GATHERED_VALUES // (width * pixels[0].size))  # output rows a pass: the gathered inputs stay bounded
    for start in range(0, size, step):
        end = min(size, start + step)
        sums = np.einsum("ok,okmc->omc", fixed[start:end], pixels[rows[start:end]].astype(np.int64))
        filtered[start:end] = np.clip((sums + (1 << (_PRECISION_BITS - 1))) >> _PRECISION_BITS, 0, 255)
    return filtered


def _merge_order(grid: torch.Tensor) -> torch.Tensor:
    """[H, W, C] patches as [H * W, C] in mtmd's order: 2x2 blocks row by row, each block's four patches row-major."""
    h, w, c = grid.shape
    return grid.reshape(h // 2, 2, w // 2, 2, c).permute(0, 2, 1, 3, 4).reshape(h * w, c)


def _rotation(grid_h: int, grid_w: int, head: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [patches, 1, head / 2] of the vision RoPE (GGML_ROPE_TYPE_VISION): the first quarter of a
    head's pairs turn with the patch's row, the second with its column, frequencies 10000^(-4i/head)."""
    rows = torch.arange(grid_h, device=device).view(grid_h, 1).expand(grid_h, grid_w)
    columns = torch.arange(grid_w, device=device).view(1, grid_w).expand(grid_h, grid_w)
    y = _merge_order(rows.unsqueeze(-1)).squeeze(-1).float()
    x = _merge_order(columns.unsqueeze(-1)).squeeze(-1).float()
    quarter = head // 4
    frequencies = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float64, device=device) * 4.0 / head))
    angles = torch.cat((y.double().unsqueeze(1) * frequencies, x.double().unsqueeze(1) * frequencies), dim=1).float()
    return torch.cos(angles).unsqueeze(1), torch.sin(angles).unsqueeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NEOX rotation over the whole head: element i pairs with i + head / 2."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
