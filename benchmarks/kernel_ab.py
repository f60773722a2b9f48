"""Two builds of the C kernels side by side in one process: the working tree's `kernels.c` against another revision's
(`--base`, default HEAD), on the block and BF16 products a call with an image runs, the two builds taking turns call
by call so that a noisy machine's drift falls on both alike; each shape's outputs compared bit for bit. For kernel
changes meant to keep every bit (an A/B of speed: `qwen35_images.py` compares with llama.cpp).

    python benchmarks/kernel_ab.py [--base HEAD] [--rounds 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from pawfn.torch.ggml import build
from pawfn.torch.ggml.floats import float_matrix
from pawfn.torch.ggml.library import NativeKernels
from pawfn.torch.ggml.native_blocks import native_block_matrix
from pawfn.torch.model.arithmetic.choice import bf16_pairs, simd_width

SOURCE = Path(build.__file__).with_name("kernels.c")
# rows x width -> outputs: the text model's Q8_0 products over a 256x256 call's 162 rows and a 720x720 call's 582,
# the last row's; the tower's BF16 products over 256 and 1936 patches
Q8_0_SHAPES = [(162, 1024, 7168), (162, 3584, 1024), (582, 1024, 8224), (1, 1024, 7168)]
BF16_SHAPES = [(256, 768, 3072), (1936, 768, 3072), (1936, 3072, 768)]
MATRICES = 4  # taken in turn, so that a product's weights are not the last call's (7-30 MB each: L3 holds two or three)


def compiled(source: Path, folder: Path, name: str) -> NativeKernels:
    """`source` compiled as pawfn compiles its kernels (its flags, OpenMP), loaded."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler found: nothing to compare")
    target = folder / f"{name}.so"
    command = [str(source) if part == str(SOURCE) else part for part in build.compile_command(compiler, ["-fopenmp"], target)]
    subprocess.run(command, check=True)
    return NativeKernels(ctypes.CDLL(str(target)), target)


def quantized(rng: np.random.Generator, out: int, width: int, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """A random [out, width] matrix as the GGUF file's bytes of `kind` (Q8_0, or BF16 by truncation)."""
    weights = rng.standard_normal((out, width)).astype(np.float32)
    if kind == gguf.GGMLQuantizationType.BF16:
        return (weights.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    return np.asarray(gguf.quants.quantize(weights, kind)).reshape(-1).view(np.uint8)


def compare(label: str, products: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]], x: torch.Tensor, rounds: int) -> None:
    """Each build's median call over `rounds` turns of every matrix, the builds alternating; their outputs first."""
    first = {name: calls[0](x) for name, calls in products.items()}
    same = torch.equal(first["base"], first["tree"])
    times: dict[str, list[float]] = {name: [] for name in products}
    for turn in range(rounds):
        for name in ("base", "tree") if turn % 2 else ("tree", "base"):
            for call in products[name]:
                started = time.perf_counter()
                call(x)
                times[name].append(time.perf_counter() - started)
    median = {name: sorted(spent)[len(spent) // 2] * 1e3 for name, spent in times.items()}
    print(
        f"  {label:26s} base {median['base']:8.2f} ms  tree {median['tree']:8.2f} ms  tree/base {median['tree'] / median['base']:.3f}"
        f"  {'outputs identical' if same else 'OUTPUTS DIFFER'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", default="HEAD", help="the git revision whose kernels.c is the base")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        relative = SOURCE.relative_to(Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], cwd=SOURCE.parent, text=True).strip()))
        base_source = folder / "kernels.c"
        base_source.write_bytes(subprocess.check_output(["git", "show", f"{args.base}:{relative}"], cwd=SOURCE.parent))
        builds = {"base": compiled(base_source, folder, "base"), "tree": compiled(SOURCE, folder, "tree")}
        print(f"{args.base}'s kernels.c (base) against the working tree's (tree), {args.threads} threads, {args.rounds} rounds, medians")
        rng = np.random.default_rng(0)
        pairs, lanes = bf16_pairs(), simd_width()
        for kind, shapes in ((gguf.GGMLQuantizationType.Q8_0, Q8_0_SHAPES), (gguf.GGMLQuantizationType.BF16, BF16_SHAPES)):
            for rows, width, out in shapes:
                raws = [quantized(rng, out, width, kind) for _ in range(MATRICES)]
                products = {name: [matrix(kernels, raw, kind, out, lanes, pairs) for raw in raws] for name, kernels in builds.items()}
                compare(f"{kind.name} {rows}x{width}->{out}", products, torch.randn(rows, width), args.rounds)


def matrix(
    kernels: NativeKernels, raw: np.ndarray, kind: gguf.GGMLQuantizationType, out: int, lanes: int, pairs: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The matrix of `raw` bytes on `kernels` as pawfn keeps it (Q8_0 grouped by eights, BF16 as bits)."""
    if kind == gguf.GGMLQuantizationType.Q8_0:
        found = native_block_matrix(kernels, raw, kind, out)
    else:
        found = float_matrix(kernels, raw, kind, out, lanes, pairs)
    if found is None:
        raise SystemExit(f"{kind.name} has no C kernel here")
    return found


if __name__ == "__main__":
    main()
