"""An image resized as mtmd resizes it for a `qwen3vl_merger` projector: the size within the token budget
(`target_size`, its float32 arithmetic) and Pillow's bicubic filter as mtmd reimplements it (`resized`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["ImageBudget", "resized", "target_size"]

_F32 = np.float32


class ImageBudget(Protocol):
    """A projector's patch size, merge and bounds on an image's pixels (from its token limits)."""

    @property
    def patch(self) -> int: ...
    @property
    def merge(self) -> int: ...
    @property
    def min_pixels(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...


def target_size(width: int, height: int, s: ImageBudget) -> tuple[int, int]:
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


def resized(rgb: PILImage, width: int, height: int) -> npt.NDArray[np.uint8]:
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
