"""`pawfn.Image`: the official SDK's preprocessing contract, checked against its own code (`programasweights.
_image_content`) pixel for pixel, and hostile images refused with typed errors before their pixels are decoded."""

from __future__ import annotations

import base64
import os
import struct
import threading
import time
import zlib
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image as PILImage

from pawfn import Image, ImageError
from pawfn.core.images import ImageLimits

official = pytest.importorskip("programasweights._image_content")


def _encoded(image: PILImage.Image, format: str = "PNG", **options: object) -> bytes:  # noqa: A002
    output = BytesIO()
    image.save(output, format=format, **options)
    return output.getvalue()


def _samples() -> dict[str, PILImage.Image]:
    rgba = PILImage.new("RGBA", (7, 5), (10, 200, 30, 255))
    rgba.putpixel((1, 1), (255, 0, 0, 0))
    rgba.putpixel((2, 2), (0, 0, 255, 128))
    palette = PILImage.new("P", (6, 4), 1)
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 759)
    palette.info["transparency"] = 1
    gray_alpha = PILImage.new("LA", (3, 3), (90, 40))
    return {
        "rgba": rgba,
        "palette with a transparent colour": palette,
        "gray with alpha": gray_alpha,
        "gray": PILImage.new("L", (4, 4), 77),
        "cmyk": PILImage.new("CMYK", (4, 3), (10, 20, 30, 40)),
        "rgb": PILImage.new("RGB", (9, 2), (1, 2, 3)),
    }


def _official_pixels(image: PILImage.Image) -> bytes:
    url = official._png_url(image.copy())  # pyright: ignore[reportPrivateUsage]  # the official code under comparison
    with PILImage.open(BytesIO(base64.b64decode(url.split(",", 1)[1]))) as decoded:
        assert decoded.mode == "RGB"
        return decoded.tobytes()


@pytest.mark.parametrize("name", list(_samples()))
def test_pixels_are_the_official_sdks_from_a_pil_image_and_from_bytes(name: str) -> None:
    source = _samples()[name]
    expected = _official_pixels(source)
    assert Image(source).rgb().tobytes() == expected
    if source.mode != "CMYK":
        assert Image(_encoded(source)).rgb().tobytes() == expected
    with PILImage.open(BytesIO(Image(source).png())) as encoded:
        assert encoded.tobytes() == expected and not encoded.info.get("exif")


def test_orientation_is_the_stored_one_and_metadata_is_dropped(tmp_path: Path) -> None:
    source = PILImage.new("RGB", (8, 4), (200, 100, 50))
    exif = PILImage.Exif()
    exif[0x0112] = 6  # "rotate 90 on display": the official contract ignores it
    path = tmp_path / "photo.jpg"
    path.write_bytes(_encoded(source, "JPEG", exif=exif.tobytes(), quality=95))
    rgb = Image(path).rgb()
    assert rgb.size == (8, 4) and not rgb.info
    with PILImage.open(path) as original:
        assert rgb.tobytes() == original.convert("RGB").tobytes()


def test_an_image_is_a_snapshot() -> None:
    source = PILImage.new("RGB", (2, 2), (0, 0, 0))
    image = Image(source)
    source.putpixel((0, 0), (255, 255, 255))
    assert image.rgb().getpixel((0, 0)) == (0, 0, 0)
    data = bytearray(_encoded(PILImage.new("RGB", (2, 2), (5, 5, 5))))
    image = Image(bytes(data))
    data[:] = b"x" * len(data)
    assert image.rgb().getpixel((1, 1)) == (5, 5, 5)


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims `width` x `height` (its CRC fixed, so only the size is a lie)."""
    data = bytearray(_encoded(PILImage.new("RGB", (1, 1))))
    header = b"IHDR" + struct.pack(">II", width, height) + bytes(data[24:29])
    data[12:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(header))
    return bytes(data)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (_png_claiming(100_000, 100_000), "10000000000 pixels"),
        (_png_claiming(30_000, 30_000), "900000000 pixels"),
        (_png_claiming(9_000, 9_000), r"9000x9000 \(81000000 pixels\), more than the 67108864 allowed"),
        (_encoded(PILImage.new("RGB", (64, 64), (9, 9, 9)))[:-40], "could not be decoded"),
        (b"not an image at all", "could not be decoded"),
        (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "could not be decoded"),
        (b"%PDF-1.4\n", "could not be decoded"),
        (_encoded(PILImage.new("I;16", (4, 4))), "mode is 'I;16'"),
    ],
    ids=["bomb 10 Gpx", "bomb 900 Mpx", "81 Mpx", "truncated", "garbage", "svg", "pdf", "16-bit"],
)
def test_hostile_images_are_refused_before_their_pixels_are_decoded(source: bytes, problem: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ImageError, match=problem):
        Image(source).rgb()
    assert time.perf_counter() - started < 5.0  # a hang guard, not a speed figure


def test_limits_are_settings_and_sources_are_checked(tmp_path: Path) -> None:
    small = _encoded(PILImage.new("RGB", (20, 20)))
    with pytest.raises(ImageError, match="more than the 50 allowed"):
        Image(small).rgb(ImageLimits(max_bytes=50))
    with pytest.raises(ImageError, match="more than the 399 allowed"):
        Image(small).rgb(ImageLimits(max_pixels=399))
    with pytest.raises(ImageError, match="regular file"):
        Image(tmp_path)
    with pytest.raises(ImageError, match="cannot open"):
        Image(tmp_path / "missing.png")
    with pytest.raises(TypeError, match="path, encoded bytes or a PIL.Image.Image"):
        Image(42)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # a wrong kind on purpose


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(ImageError, Image, fifo).value), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and "regular file" in str(outcome[0])
