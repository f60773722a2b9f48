"""Whether pawfn's vision tower gives mtmd's embeddings bit for bit against a llama.cpp built for another CPU: the
llama-cpp-python on the path says which instruction sets its build uses (`llama_print_system_info`), and pawfn's tower
runs the arithmetic of those (16 float lanes with AVX-512, else 8; BF16 dotted by `vdpbf16ps` pairs with AVX-512 BF16,
else widened to float32), in its torch emulation and on its C kernels (their AVX-512 paths and their AVX2 ones). The
test suite checks this CPU's own build; this script checks the builds of the CPUs pawfn was not run on, e.g.:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \\
        pip install --no-deps --target /tmp/lcp-avx2 llama-cpp-python==0.3.36
    PYTHONPATH=/tmp/lcp-avx2 python benchmarks/tower_fidelity.py [--real-shape] [--workdir /tmp/pawfn-qwen35-shape]

On the tiny Qwen3.5 of the tests (F32, F16 and BF16 projectors, images of several sizes); `--real-shape` adds the
Qwen3.5-0.8B-shaped BF16 projector of `qwen35_images.py` (C kernels only: the emulation takes minutes an image).
Then greedy calls with those images on a Q8_0 base (llama.cpp's quantizer) and the BF16 projector, the Torch backend
in the build's arithmetic (numerics="llamacpp") against the LlamaCpp backend on that build. Prints one line per
projector and image and per call backend; exits 1 if any embedding or token differs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pawfn import Backend, Image, LlamaCpp, PawConfig, PawFn, Positional, Qwen3_5_0_8B, RuntimeOptions, Torch  # noqa: E402
from pawfn.llamacpp.cpu import llama_cpp_system_info  # noqa: E402
from pawfn.torch.model.arithmetic import choice  # noqa: E402
from pawfn.torch.engine.vision import VisionTower  # noqa: E402
from pawfn.torch.ggml.c_kernels import native_kernels  # noqa: E402
from pawfn.torch.model.arithmetic import llamacpp_arithmetic  # noqa: E402
from pawfn.torch.model.arithmetic.tower import MtmdTower  # noqa: E402
from tests.helpers.mtmd_reference import mtmd_context, mtmd_embeddings, random_png  # noqa: E402
from tests.helpers.references import llama_quantize  # noqa: E402
from tests.helpers.tiny_qwen35 import TinyVision, build_qwen35_vision  # noqa: E402

TINY_SIZES = [(100, 70), (40, 200), (64, 64), (7, 3), (1000, 900)]
"""Resized both ways, the position table's own size, below the smallest image, past the token limit (tiled attention)."""
REAL_SIZES = [(256, 256), (640, 480)]
N_CTX = 1024
ONE_IMAGE = "<|im_start|>user\n{INPUT_0}<|vision_start|>{INPUT_1}<|vision_end|><|im_end|>\n<|im_start|>assistant\n"


def build_arithmetic(info: str) -> tuple[int, bool]:
    """(float lanes, BF16 pairs) of the llama.cpp build whose `llama_print_system_info` is `info`."""
    return (16 if "AVX512 = 1" in info else 8), "AVX512_BF16 = 1" in info


def _compare(label: str, expected: np.ndarray, found: torch.Tensor) -> bool:
    values = found.numpy()
    if values.shape == expected.shape and np.array_equal(values, expected):
        print(f"  {label}: equal", flush=True)
        return True
    if values.shape != expected.shape:
        print(f"  {label}: DIFFERENT shape {values.shape} against {expected.shape}", flush=True)
    else:
        relative = float(np.abs(values - expected).max() / max(float(np.abs(expected).max()), 1e-30))
        print(f"  {label}: DIFFERENT, max difference {relative:.3g} of the largest value", flush=True)
    return False


def check(text_model: Path, projector: Path, width: int, sizes: list[tuple[int, int]], lanes: int, pairs: bool, emulate: bool) -> bool:
    """Every image of `sizes` through mtmd and pawfn's towers for `projector`; whether all were equal."""
    kernels = native_kernels()
    towers: list[tuple[str, VisionTower]] = []
    if emulate:
        towers.append(("torch emulation", VisionTower.read(projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, MtmdTower(lanes, pairs))))
    if kernels is not None:
        ops = llamacpp_arithmetic(lanes, False, pairs).tower()
        towers.append(("C kernels", VisionTower.read(projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, ops)))
    assert Qwen3_5_0_8B.image_tokens is not None
    equal = True
    with mtmd_context(text_model, projector, N_CTX, Qwen3_5_0_8B.image_tokens) as context:
        for index, (image_width, image_height) in enumerate(sizes):
            data = random_png(image_width, image_height, index)
            expected, grid = mtmd_embeddings(context, data, width)
            print(f"{projector.name} {image_width}x{image_height} ({grid[0]}x{grid[1]} tokens)", flush=True)
            for name, tower in towers:
                if name == "C kernels" and kernels is not None:
                    for avx512 in (True, False) if kernels.avx512 else (False,):
                        kernels.use_avx512(avx512)
                        try:
                            found = tower.encode(tower.prepare(Image(data)))
                        finally:
                            kernels.use_avx512(True)
                        equal &= _compare(f"{name} ({'AVX-512' if avx512 else 'AVX2'} paths)", expected, found)
                else:
                    equal &= _compare(name, expected, tower.encode(tower.prepare(Image(data))))
    return equal


def calls_agree(vision: TinyVision, folder: Path, lanes: int, pairs: bool) -> bool:
    """Greedy 12-token calls with an image, the official configuration's base (Q8_0, llama.cpp's quantizer) and the BF16
    projector: the Torch backend in the build's arithmetic (`choice`'s lanes and BF16 dots set to the build's; the C
    kernels' AVX-512 paths and their AVX2 ones) against the LlamaCpp backend on that build."""
    base = llama_quantize(vision.text.gguf_path, folder / "text-q8_0.gguf", "Q8_0")
    projector = vision.typed_projectors["BF16"]
    shutil.copy(projector, folder / projector.name)  # found beside the base
    choice.simd_width, choice.bf16_pairs = (lambda: lanes), (lambda: pairs)  # what the build's CPU would report
    options = RuntimeOptions(max_tokens=12)
    images = [Image(random_png(width, height, index)) for index, (width, height) in enumerate(TINY_SIZES)]

    def tokens(backend: type[Backend], config: PawConfig) -> list[tuple[int, ...]]:
        with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=base, template=ONE_IMAGE, config=config) as bare:
            describe = Positional[str, Image](bare)
            return [describe.generate("Describe the picture.", image, options=options).token_ids for image in images]

    expected, kernels, agree = tokens(LlamaCpp, PawConfig(n_ctx=N_CTX)), native_kernels(), True
    for avx512 in (True, False) if kernels is not None and kernels.avx512 else (False,):
        if kernels is not None:
            kernels.use_avx512(avx512)
        try:
            found = tokens(Torch, PawConfig(n_ctx=N_CTX, numerics="llamacpp"))
        finally:
            if kernels is not None:
                kernels.use_avx512(True)
        same = sum(a == b for a, b in zip(found, expected, strict=True))
        paths = "AVX-512" if avx512 else "AVX2"
        print(f"Q8_0 base, BF16 projector, Torch numerics='llamacpp' ({paths} paths): {same} of {len(images)} calls give llama.cpp's tokens")
        agree &= same == len(images)
    return agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--real-shape", action="store_true", help="also the Qwen3.5-0.8B-shaped BF16 projector of qwen35_images.py")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    args = parser.parse_args()
    info = llama_cpp_system_info()
    if info is None:
        sys.exit("tower_fidelity: llama-cpp-python is not importable (install pawfn[llamacpp], or put a build on PYTHONPATH)")
    lanes, pairs = build_arithmetic(info)
    print(f"llama.cpp build: {info}")
    print(f"pawfn's arithmetic for it: {lanes} float lanes, BF16 {'by vdpbf16ps pairs' if pairs else 'widened to float32'}\n")
    equal = True
    with tempfile.TemporaryDirectory() as folder:
        vision = build_qwen35_vision(Path(folder))
        projectors = {"F32": vision.projector, **vision.typed_projectors}
        for projector in projectors.values():  # each typed projector has a copy of the text model beside it
            text_model = projector.parent / vision.text.gguf_path.name
            equal &= check(text_model, projector, 64, TINY_SIZES, lanes, pairs, emulate=True)
        equal &= calls_agree(vision, Path(folder), lanes, pairs)
    if args.real_shape:
        from qwen35 import HIDDEN, prepare
        from qwen35_images import write_projector

        base, _ = prepare(args.workdir)
        projector = base.parent / "mmproj-qwen3.5-0.8b-shape-bf16.gguf"
        if not projector.is_file():
            write_projector(projector)
        equal &= check(base, projector, HIDDEN, REAL_SIZES, lanes, pairs, emulate=False)
    print("\nevery embedding mtmd's bit for bit, every call's tokens llama.cpp's" if equal else "\nSOME EMBEDDINGS OR TOKENS DIFFER")
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
