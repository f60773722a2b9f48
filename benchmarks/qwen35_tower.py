"""Where an image's tower time goes, against mtmd's: the Qwen3.5-0.8B-shaped BF16 projector of `qwen35_images.py`,
each image size encoded by mtmd (`mtmd_encode_chunk`, as the official vision runtime runs it: 2 threads, flash
attention) and by pawfn's default tower (mtmd's arithmetic on the C kernels, its embeddings mtmd's bit for bit), its
time split by operation, with the floor the cores allow for its two big parts at `--ghz`: the products' multiply-adds
at one `vdpbf16ps` a cycle (32 of them; 16 FMAs where the CPU has no AVX-512 BF16), attention's (the exact order
leaves no shortcut) at one 16-lane FMA a cycle. A profile in one process.

    python benchmarks/qwen35_tower.py [--workdir /tmp/pawfn-qwen35-shape] [--runs 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from qwen35 import prepare
from qwen35_images import DEPTH, FFN, HEADS, SIZES, WIDTH, random_png, write_projector
from pawfn import Image, Qwen3_5_0_8B
from pawfn.torch.engine.vision import VisionTower
from pawfn.torch.model.arithmetic import llamacpp_arithmetic, simd_width
from pawfn.torch.model.arithmetic.choice import bf16_pairs
from pawfn.torch.model.arithmetic.tower import TowerArithmetic

OPERATIONS = ("rotation", "rotate", "attention", "gelu", "layer_norm", "position_table")


def mtmd_times(base: Path, projector: Path, threads: int, runs: int) -> dict[tuple[int, int], float]:
    """The fastest of `runs` encodes of each size by mtmd, milliseconds."""
    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd

    llm = llama_cpp.Llama(str(base), n_ctx=4096, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.n_threads = False, False, threads
    assert Qwen3_5_0_8B.image_tokens is not None
    params.image_min_tokens, params.image_max_tokens = Qwen3_5_0_8B.image_tokens
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    context = mtmd.mtmd_init_from_file(str(projector).encode(), llm.model, params)
    times: dict[tuple[int, int], float] = {}
    for size in SIZES:
        data = random_png(*size)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(context, buffer, len(data), False)
        chunks = mtmd.mtmd_input_chunks_init()
        marker = mtmd.mtmd_default_marker()
        given = mtmd.mtmd_input_text()
        given.text, given.text_len, given.add_special, given.parse_special = marker, len(marker), False, True
        mtmd.mtmd_tokenize(context, chunks, ctypes.byref(given), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                mtmd.mtmd_encode_chunk(context, chunk)  # warm-up
                times[size] = min(_timed(functools.partial(mtmd.mtmd_encode_chunk, context, chunk)) for _ in range(runs))
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(context)
    llm.close()
    return times


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1e3


@contextmanager
def timing(tower: VisionTower, arithmetic: TowerArithmetic, spent: collections.Counter[str]) -> Iterator[None]:
    """Every operation of `tower` and each kind of its matrices timed into `spent` (milliseconds) while inside."""

    def timed(label: str, function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: object) -> torch.Tensor:
            started = time.perf_counter()
            result = function(*args)
            spent[label] += (time.perf_counter() - started) * 1e3
            return result

        return run

    matrices = dict(tower._matrices)  # pyright: ignore[reportPrivateUsage]  # a profile reaches inside
    patches = tower._patches  # pyright: ignore[reportPrivateUsage]  # the profile times the tower's own parts
    for name, matrix in matrices.items():
        tower._matrices[name] = timed("product " + name.rsplit(".", 1)[-1], matrix)  # pyright: ignore[reportPrivateUsage]  # the profile times the tower's own parts
    tower._patches = timed("patches", patches)  # pyright: ignore[reportPrivateUsage]  # the profile times the tower's own parts
    for operation in OPERATIONS:
        setattr(arithmetic, operation, timed(operation, getattr(arithmetic, operation)))
    try:
        yield
    finally:
        tower._matrices.update(matrices)  # pyright: ignore[reportPrivateUsage]  # the profile times the tower's own parts
        tower._patches = patches  # pyright: ignore[reportPrivateUsage]  # the profile times the tower's own parts
        for operation in OPERATIONS:
            delattr(arithmetic, operation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ghz", type=float, default=3.0, help="the cores' clock, for attention's floor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, _ = prepare(args.workdir)
    projector = base.parent / "mmproj-qwen3.5-0.8b-shape-bf16.gguf"
    if not projector.is_file():
        write_projector(projector)
    mtmd = mtmd_times(base, projector, args.threads, args.runs)
    arithmetic = llamacpp_arithmetic(simd_width(), False, bf16_pairs()).tower()
    tower = VisionTower.read(projector, torch.device("cpu"), Qwen3_5_0_8B.image_tokens, arithmetic)
    lanes = 32 if bf16_pairs() else 16
    print(f"tower: {type(arithmetic).__name__}, {args.threads} threads; floors at {args.ghz} GHz, {lanes} multiply-adds a cycle in products")
    for size in SIZES:
        prepared = tower.prepare(Image(random_png(*size)))
        tower.encode(prepared)  # warm-up
        best: collections.Counter[str] | None = None
        for _ in range(args.runs):
            spent: collections.Counter[str] = collections.Counter()
            with timing(tower, arithmetic, spent):
                spent["encode"] = _timed(functools.partial(tower.encode, prepared))
            best = spent if best is None or spent["encode"] < best["encode"] else best
        assert best is not None
        patches = 4 * prepared.n_tokens
        per_patch = WIDTH * (3 * WIDTH + WIDTH + 2 * FFN)
        product_floor = DEPTH * patches * per_patch / lanes / cycles(args.threads, args.ghz)
        attention_floor = DEPTH * HEADS * 2 * patches * patches * (WIDTH // HEADS) / 16 / cycles(args.threads, args.ghz)
        encode = best.pop("encode")
        print(f"image {size[0]}x{size[1]} ({prepared.n_tokens} tokens): mtmd {mtmd[size]:.0f} ms, pawfn {encode:.0f} ms ({encode / mtmd[size]:.2f}x)")
        print(f"  products' floor {product_floor:.0f} ms, attention's {attention_floor:.0f} ms")
        for label, milliseconds in best.most_common():
            print(f"  {label:20s} {milliseconds:7.0f} ms")


def cycles(threads: int, ghz: float) -> float:
    """Cycles a millisecond on `threads` cores at `ghz`."""
    return threads * ghz * 1e6


if __name__ == "__main__":
    main()
