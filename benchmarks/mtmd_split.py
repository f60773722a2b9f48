"""Where llama.cpp+mtmd's one-token call with an image goes, on the shapes of `qwen35_images.py`: the tower
(`mtmd_encode_chunk`), the text model's pass over the image's embeddings (`mtmd_helper_decode_image_chunk`, batches of
128) and the text before and after the image (`llama_decode` of the prompt's text chunks), each call's wall time
split as the official vision runtime makes it. A profile of the reference, not a comparison (`qwen35_images.py`
compares; `image_call_profile.py` splits pawfn's call).

    python benchmarks/mtmd_split.py [--runs 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

from qwen35 import prepare
from qwen35_images import SIZES, TEMPLATE, random_png
from pawfn import Image, LlamaCpp, PawConfig, PawFn, Positional, Qwen3_5_0_8B, RuntimeOptions

seconds: dict[str, float] = {"tower": 0.0, "image tokens": 0.0, "text tokens": 0.0}


def _split_eval(
    vision: mtmd.mtmd_context_p,
    context: llama_cpp.llama_context_p,
    chunk: mtmd.mtmd_input_chunk_p,
    past: int,
    sequence: int,
    batch: int,
    logits_last: bool,
    end: object,  # llama_pos *, passed through
) -> int:
    """`mtmd_helper_eval_chunk_single` for an image chunk as its two steps, each timed."""
    started = time.perf_counter()
    if mtmd.mtmd_encode_chunk(vision, chunk) != 0:
        return 1
    encoded = time.perf_counter()
    embeddings = mtmd.mtmd_get_output_embd(vision)
    none = mtmd.mtmd_helper_post_decode_callback(0)
    status = mtmd.mtmd_helper_decode_image_chunk(vision, context, chunk, embeddings, past, sequence, batch, end, none, None)
    seconds["tower"] += encoded - started
    seconds["image tokens"] += time.perf_counter() - encoded
    return int(status)


Decode = Callable[[llama_cpp.llama_context_p, llama_cpp.llama_batch], int]


def _timed_decode(decode: Decode) -> Decode:
    def timed(context: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        started = time.perf_counter()
        status = int(decode(context, batch))
        seconds["text tokens"] += time.perf_counter() - started
        return status

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    parser.add_argument("--runs", type=int, default=3, help="timed calls per image size, after a warm-up call")
    args = parser.parse_args()
    base, _ = prepare(args.workdir)
    mtmd.mtmd_helper_eval_chunk_single = _split_eval  # type: ignore[assignment]  # the image chunk's two steps timed apart
    llama_cpp.llama_decode = _timed_decode(llama_cpp.llama_decode)  # text chunks (the image's batches go through C)
    options = RuntimeOptions(max_tokens=1)
    with PawFn.specialize(Qwen3_5_0_8B, LlamaCpp).bare(base=base, template=TEMPLATE, config=PawConfig(n_ctx=4096)) as bare:
        describe = Positional[str, Image](bare)
        for size in SIZES:
            image = Image(random_png(*size))
            describe.run("Describe the picture.", image, options=options)  # warm-up, untimed
            for _ in range(args.runs):
                for name in ("tower", "image tokens", "text tokens"):
                    seconds[name] = 0.0
                started = time.perf_counter()
                describe.run("Describe the picture.", image, options=options)
                wall = time.perf_counter() - started
                parts = ", ".join(f"{name} {value * 1e3:.0f} ms" for name, value in seconds.items())
                rest = wall - sum(seconds.values())
                print(f"{size[0]}x{size[1]}: call {wall * 1e3:.0f} ms: {parts}, the rest {rest * 1e3:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
