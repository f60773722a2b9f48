"""An image resized as mtmd resizes it for a `qwen3vl_merger` projector: the size within the token budget
(`target_size`, its float32 arithmetic) and Pillow's bicubic filter as mtmd reimplements it (`resized`)."""

from __future__ import annotations

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
    if (rgb.width, rgb.height) == (width, height):
        return np.asarray(rgb, dtype=np.uint8)
    scale = min(_F32(width) / _F32(rgb.width), _F32(height) / _F32(rgb.height))
    inner_w = min(int(np.ceil(_F32(rgb.width) * scale)), width)
    inner_h = min(int(np.ceil(_F32(rgb.height) * scale)), height)
    canvas = np.zeros((height, width, 3), dtype=np.uint8)
    top, left = (height - inner_h) // 2, (width - inner_w) // 2
    canvas[top : top + inner_h, left : left + inner_w] = _resampled(rgb, inner_w, inner_h)
    return canvas


def _resampled(rgb: PILImage, width: int, height: int) -> npt.NDArray[np.uint8]:
    """Pillow's bicubic filter (a = -0.5, widened when shrinking, 22-bit fixed-point weights, 8-bit rounding between
    passes) as mtmd reimplements it: always across first, then down. Pillow, asked for both at once, may go down
    first, which rounds apart; asked for one side at a time it runs that pass alone."""
    from PIL.Image import Resampling

    if rgb.width != width:
        rgb = rgb.resize((width, rgb.height), Resampling.BICUBIC)
    if rgb.height != height:
        rgb = rgb.resize((width, height), Resampling.BICUBIC)
    return np.asarray(rgb, dtype=np.uint8)
