"""`pawfn.Image`: an image argument, snapshotted when made, and the official SDK's preprocessing contract: raster
formats only (no Pillow plugin that runs programs), the container verified, the first frame, 8-bit modes, RGB with
any transparency composited over white, the stored orientation (no EXIF rotation), no colour profile or metadata,
native size. Decoding is Pillow's (the `vision` extra), within bounds on bytes and pixels, with typed errors."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

from .errors import PawError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["Image", "ImageError", "ImageLimits"]

_RASTER_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "TIFF", "BMP", "ICO")
"""What encoded bytes may be: other Pillow plugins may start external programs (as the official SDK restricts)."""
_PIXEL_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "YCbCr", "HSV"})
"""8-bit modes; float and 16-bit ones must be converted by the caller, not clipped here (as the official SDK)."""


class ImageError(PawError, ValueError):
    """An image that cannot be an argument: not a raster image, damaged, too large, or in an unsupported mode."""


@dataclass(frozen=True)
class ImageLimits:
    """Bounds on one image argument, checked before its pixels are decoded (a small file can claim a huge image)."""

    max_bytes: int = 32 * 1024 * 1024
    max_pixels: int = 64 * 1024 * 1024
    """Width x height; Pillow's own decompression-bomb limit (~179 Mpx) is the hard stop beyond this."""


class Image:
    """An image argument: a path, encoded bytes or a PIL image, copied now so later changes to the source do not
    reach the call. Decoded (and checked) when a call prepares it."""

    __slots__ = ("_source",)

    def __init__(self, source: str | os.PathLike[str] | bytes | PILImage) -> None:
        """`ImageError` for a path that is not a regular file; `TypeError` for anything else than the three kinds."""
        self._source: bytes | PILImage
        if isinstance(source, bytes):
            self._source = bytes(source)
        elif isinstance(source, str | os.PathLike):
            self._source = _read_regular_file(os.fspath(source))
        else:
            pil = _pil_image_class()
            if pil is None or not isinstance(source, pil):
                raise TypeError(f"Image takes a path, encoded bytes or a PIL.Image.Image, not {type(source).__name__}")
            snapshot = source.copy()
            snapshot.info = dict(source.info)
            self._source = snapshot

    def rgb(self, limits: ImageLimits | None = None) -> PILImage:
        """The pixels as the model sees them: RGB, transparency over white, no metadata; `ImageError` if none."""
        limits = limits or ImageLimits()
        try:
            from PIL import Image as PILModule
        except ModuleNotFoundError:
            raise ImageError("decoding an image needs Pillow: pip install 'pawfn[vision]'") from None

        try:
            if isinstance(self._source, bytes):
                if len(self._source) > limits.max_bytes:
                    raise ImageError(f"the image is {len(self._source)} bytes, more than the {limits.max_bytes} allowed")
                with PILModule.open(BytesIO(self._source), formats=_RASTER_FORMATS) as pixels:
                    _check_size(pixels.width, pixels.height, limits)
                    pixels.verify()  # the container's integrity (PNG checksums); it consumes the decoder
                with PILModule.open(BytesIO(self._source), formats=_RASTER_FORMATS) as pixels:
                    return _normalized(pixels)
            _check_size(self._source.width, self._source.height, limits)
            return _normalized(self._source)
        except ImageError:
            raise
        except PILModule.DecompressionBombError as exc:  # Pillow's own hard stop, past our bound
            raise ImageError(f"the image is too large to decode: {exc}") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise ImageError(f"the image could not be decoded: {exc}") from None

    def png(self, limits: ImageLimits | None = None) -> bytes:
        """`rgb()` encoded as PNG, metadata-free (what the official SDK hands llama.cpp)."""
        with self.rgb(limits) as pixels, BytesIO() as output:
            pixels.save(output, format="PNG")
            return output.getvalue()

    def __repr__(self) -> str:
        kind = "encoded bytes" if isinstance(self._source, bytes) else "PIL image"
        return f"Image(<{kind} snapshot>)"


def _pil_image_class() -> type[PILImage] | None:
    try:
        from PIL.Image import Image as PILClass
    except ModuleNotFoundError:
        return None
    return PILClass


def _read_regular_file(path: str) -> bytes:
    """The file's bytes; a FIFO, device or folder is refused without blocking on it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ImageError(f"{path}: cannot open the image ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ImageError(f"{path}: an image must be a regular file")
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(descriptor)


def _check_size(width: int, height: int, limits: ImageLimits) -> None:
    if width < 1 or height < 1:
        raise ImageError(f"the image is {width}x{height}: both sides must be positive")
    if width * height > limits.max_pixels:
        raise ImageError(f"the image is {width}x{height} ({width * height} pixels), more than the {limits.max_pixels} allowed")


def _normalized(pixels: PILImage) -> PILImage:
    """RGB with transparency (an alpha band, a palette's or a colour key) composited over white, metadata dropped."""
    from PIL import Image as PILModule

    if pixels.mode not in _PIXEL_MODES:
        raise ImageError(f"the image's mode is {pixels.mode!r}; convert it to an 8-bit mode (e.g. image.convert('RGB')) first")
    palette_alpha = pixels.palette is not None and pixels.palette.mode == "RGBA"
    if "A" not in pixels.getbands() and "transparency" not in pixels.info and not palette_alpha:
        rgb = pixels.convert("RGB")
    else:
        with pixels.convert("RGBA") as rgba, rgba.getchannel("A") as alpha:
            rgb = PILModule.new("RGB", rgba.size, (255, 255, 255))
            rgb.paste(rgba, mask=alpha)
    rgb.info.clear()
    return rgb
