"""Where a one-token call with an image goes in the default mode, on the Qwen3.5-0.8B-shaped base and projector of
`qwen35_images.py`: the tower (`VisionTower.encode`) and every C kernel call of the call, named by kernel and shape
(block products by rows x width -> outputs, float products by type, flash attention by rows and cells), each
marked as the tower's or the text pass's, in one
process. A profile, not a comparison (`qwen35_images.py` compares with llama.cpp+mtmd; `qwen35_tower.py` splits the
tower by operation).

    python benchmarks/image_call_profile.py [--size 720 720] [--threads 2] [--top 25]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from qwen35 import prepare
from qwen35_images import TEMPLATE, random_png, write_projector
from where_time_goes import calls, seconds, timed, timed_phase

from pawfn import Image, PawConfig, PawFn, Positional, Qwen3_5_0_8B, RuntimeOptions, Torch
from pawfn.torch.engine import vision
from pawfn.torch.ggml import c_kernels
from pawfn.torch.ggml.interface import FlashOnlineCall, FlashTiledCall, FloatKind, FloatProductCall, Kernel, KernelCall, Out


def _run_name(call: KernelCall, count: int, work: int) -> str:
    if isinstance(call, FlashTiledCall):
        return f"flash tiled, {call.rows} rows over {call.length} cells"
    if isinstance(call, FloatProductCall):
        return f"float {FloatKind(call.kind).name.lower()} {call.rows}x{call.width}->{count}"
    if isinstance(call, FlashOnlineCall):
        return f"flash one-chunk, {call.rows} rows over cells {call.first}-{call.last}"
    return call.kernel.name.lower()


def _block_name(kernel: Kernel, x: int, rows: int, width: int, codes: int, sub: int, scale: int, out: int, target: Out, work: int) -> str:
    return f"{kernel.name.lower()} {rows}x{width}->{out}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen35-shape"))
    parser.add_argument("--size", type=int, nargs=2, default=[720, 720], metavar=("WIDTH", "HEIGHT"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="kernel entries printed, largest first")
    args = parser.parse_args()
    base, _ = prepare(args.workdir)
    projector = base.parent / "mmproj-qwen3.5-0.8b-shape-bf16.gguf"
    if not projector.is_file():
        write_projector(projector)
    kernels = c_kernels.native_kernels()
    if kernels is None:
        raise SystemExit("the C kernels did not build here: nothing to profile")
    config = PawConfig(n_ctx=4096, threads=args.threads)
    with PawFn.specialize(Qwen3_5_0_8B, Torch).bare(base=base, template=TEMPLATE, config=config) as bare:
        describe = Positional[str, Image](bare)
        image, options = Image(random_png(*args.size)), RuntimeOptions(max_tokens=1)
        describe.run("Describe the picture.", image, options=options)  # warm-up, untimed
        kernels.run = timed(_run_name, kernels.run)  # type: ignore[method-assign]  # timed in place to profile
        kernels.block_product = timed(_block_name, kernels.block_product)  # type: ignore[method-assign]  # timed in place
        vision.VisionTower.encode = timed_phase("tower", vision.VisionTower.encode)  # type: ignore[method-assign]  # timed in place
        started = time.perf_counter()
        describe.run("Describe the picture.", image, options=options)
        wall = time.perf_counter() - started
    tower = seconds["[towers]"]
    in_tower = sum(value for name, value in seconds.items() if name.endswith("@ tower"))
    in_text = sum(value for name, value in seconds.items() if name.endswith("@ other"))
    print(f"image {args.size[0]}x{args.size[1]}: call {wall * 1e3:.0f} ms; the tower {tower * 1e3:.0f} ms (C kernels {in_tower * 1e3:.0f} ms),")
    print(
        f"  the rest {(wall - tower) * 1e3:.0f} ms (C kernels {in_text * 1e3:.0f} ms: the text model's pass over the prompt and the image's tokens)"
    )
    for name, value in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
        if not name.startswith("["):
            print(f"  {name.replace('@ other', '@ text'):56} {value * 1e3:8.1f} ms  {calls[name]:5} calls")


if __name__ == "__main__":
    main()
