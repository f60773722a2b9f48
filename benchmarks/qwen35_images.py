"""pawfn beside llama.cpp on a call with an image, on a Qwen3.5-0.8B-shaped interpreter, in one run: the random Q8_0
base of `qwen35.py` and a random projector of Qwen3.5-0.8B's vision tower (12 blocks of width 768, 16-pixel
patches, 2x2 merge to the text's 1024, BF16 matrices as unsloth's mmproj-BF16). Each call is the bare interpreter
with a one-image template, generating one token: the image's preprocessing, its tower and the prompt's evaluation.
Both backends run in this process, one after the other, each image size --runs times after a warm-up call, for
--rounds rounds; prints the medians and the median of each round's ratios to llama.cpp.

    python benchmarks/qwen35_images.py [--workdir /tmp/pawfn-qwen35-shape] [--runs 3] [--rounds 2] [--threads 2] [--modes ...]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import gguf
import numpy as np
from PIL import Image as PILImage

from load_cost import llama_cpp_build, random_array
from pawfn import Backend, Image, LlamaCpp, PawConfig, PawFn, Positional, Qwen3_5_0_8B, RuntimeOptions, Torch
from qwen35 import HIDDEN, prepare

WIDTH, DEPTH, HEADS, FFN, PATCH, POSITIONS = 768, 12, 12, 3072, 16, 2304
TEMPLATE = "<|im_start|>user\n{INPUT_0}<|vision_start|>{INPUT_1}<|vision_end|><|im_end|>\n<|im_start|>assistant\n"
BLOCK_MATRICES = {"attn_qkv": (3 * WIDTH, WIDTH), "attn_out": (WIDTH, WIDTH), "ffn_up": (FFN, WIDTH), "ffn_down": (WIDTH, FFN)}
SIZES = [(256, 256), (640, 480), (720, 720)]


def modes(threads: int) -> dict[str, tuple[type[Backend], PawConfig]]:
    return {
        "llama.cpp": (LlamaCpp, PawConfig(n_ctx=4096)),  # no setting named: the official vision runtime's (2 threads, f16 KV)
        "torch default": (Torch, PawConfig(n_ctx=4096, threads=threads)),  # numerics auto: llama.cpp's arithmetic on Q8_0
        "torch float32": (Torch, PawConfig(n_ctx=4096, threads=threads, numerics="native")),
        "torch int8 weights": (Torch, PawConfig(n_ctx=4096, threads=threads, weight_dtype="int8")),
    }


def write_projector(path: Path) -> None:
    """A random projector GGUF laid out as llama.cpp's converter writes Qwen3.5's (architecture clip, qwen3vl_merger)."""
    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.type", "mmproj")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.projection_dim", HIDDEN)
    writer.add_uint32("clip.vision.image_size", int(POSITIONS**0.5) * PATCH)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FFN)
    writer.add_uint32("clip.vision.block_count", DEPTH)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_string("clip.projector_type", "qwen3vl_merger")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.spatial_merge_size", 2)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.is_deepstack_layers", [False] * DEPTH)

    def matrix(name: str, shape: tuple[int, ...]) -> None:
        values = gguf.quants.quantize(random_array(rng, shape, np.float32), gguf.GGMLQuantizationType.BF16)
        writer.add_tensor(name, values, raw_shape=values.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    def vector(name: str, size: int, value: float = 0.0) -> None:
        writer.add_tensor(name, np.full(size, value, dtype=np.float32))

    matrix("v.patch_embd.weight", (WIDTH, 3, PATCH, PATCH))
    matrix("v.patch_embd.weight.1", (WIDTH, 3, PATCH, PATCH))
    vector("v.patch_embd.bias", WIDTH)
    writer.add_tensor("v.position_embd.weight", random_array(rng, (POSITIONS, WIDTH), np.float32))
    for layer in range(DEPTH):
        block = f"v.blk.{layer}."
        for norm in ("ln1", "ln2"):
            vector(f"{block}{norm}.weight", WIDTH, 1.0)
            vector(f"{block}{norm}.bias", WIDTH)
        for name, (rows, columns) in BLOCK_MATRICES.items():
            matrix(f"{block}{name}.weight", (rows, columns))
            vector(f"{block}{name}.bias", rows)
    vector("v.post_ln.weight", WIDTH, 1.0)
    vector("v.post_ln.bias", WIDTH)
    matrix("mm.0.weight", (4 * WIDTH, 4 * WIDTH))
    vector("mm.0.bias", 4 * WIDTH)
    matrix("mm.2.weight", (HIDDEN, 4 * WIDTH))
    vector("mm.2.bias", HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def random_png(width: int, height: int) -> bytes:
    """A PNG of random pixels, the same for a size in every run."""
    pixels = (np.random.default_rng(width * height).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _timings(base: Path, backend: type[Backend], config: PawConfig, runs: int) -> dict[tuple[int, int], float]:
    """Median milliseconds of a one-token call with each image size (after a warm-up call)."""
    options = RuntimeOptions(max_tokens=1)
    figures: dict[tuple[int, int], float] = {}
    with PawFn.specialize(Qwen3_5_0_8B, backend).bare(base=base, template=TEMPLATE, config=config) as bare:
        describe = Positional[str, Image](bare)
        for size in SIZES:
            image = Image(random_png(*size))
            describe.run("Describe the picture.", image, options=options)
            times: list[float] = []
            for _ in range(runs):
                started = time.perf_counter()
                describe.run("Describe the picture.", image, options=options)
                times.append((time.perf_counter() - started) * 1e3)
            figures[size] = statistics.median(times)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    parser.add_argument("--runs", type=int, default=3, help="timed calls per image size, after a warm-up call")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    names = list(modes(1))
    parser.add_argument("--modes", nargs="+", choices=names, default=names, help="modes to run (llama.cpp always)")
    args = parser.parse_args()
    base, _ = prepare(args.workdir)
    projector = base.parent / "mmproj-qwen3.5-0.8b-shape-bf16.gguf"  # beside the base, where pawfn looks for it
    if not projector.is_file():
        print(f"writing {projector} ...", flush=True)
        write_projector(projector)
    configurations = {name: mode for name, mode in modes(args.threads).items() if name == "llama.cpp" or name in args.modes}
    rounds = [{mode: _timings(base, backend, config, args.runs) for mode, (backend, config) in configurations.items()} for _ in range(args.rounds)]
    print(llama_cpp_build())
    print(f"one-token calls with one image, {args.runs} calls a size, {args.rounds} rounds, {args.threads} threads")
    for size in SIZES:
        print(f"image {size[0]}x{size[1]}")
        for mode in configurations:
            call = statistics.median(r[mode][size] for r in rounds)
            ratio = statistics.median(r[mode][size] / r["llama.cpp"][size] for r in rounds)
            print(f"  {mode:20s} median call {call:8.1f} ms   {ratio:5.2f}x llama.cpp's")


if __name__ == "__main__":
    main()
