"""pawfn's GPU modes on the Qwen3-0.6B-shaped program (benchmarks/load_cost.py writes it), in one run: each mode
is one `pawfn bench --json` in a fresh process (load, a warm-up, then --runs 10-token calls, one caller and
--concurrency callers; batched decode steps, `--batch-invariant off`, CUDA's default, and bfloat16 also with
row-exact ones, `--batch-invariant on`). llama.cpp runs beside them when llama-cpp-python is installed (built for whatever it was
built for). Prints the figures and the ratios to the first mode. `benchmarks/gpu.sh` runs it on a CUDA machine.

    python benchmarks/gpu_modes.py [--device cuda] [--workdir /tmp/pawfn-qwen3-shape] [--runs 10]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from cpu_modes import bench
from load_cost import llama_cpp_build, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    # batched decode steps (a GPU's default), and bfloat16's row-exact ones (the CPU's default) priced beside them
    modes = {
        f"torch {dtype}": ["--device", args.device, "--dtype", dtype, "--batch-invariant", "off"] for dtype in ("bfloat16", "float16", "float32")
    }
    modes["torch bfloat16 row-exact"] = ["--device", args.device, "--dtype", "bfloat16", "--batch-invariant", "on"]
    if importlib.util.find_spec("llama_cpp") is not None:
        modes["llama.cpp"] = ["--backend", "llamacpp"]
        print(llama_cpp_build())
    print(f"{'mode':26} {'callers':>7} {'median call':>12} {'ms/token':>9} {'calls/s':>8} {'load':>8} {'peak RSS':>9}")
    reference: float | None = None
    for mode, flags in modes.items():
        for callers in (1, args.concurrency):
            figures = bench(base, bundle, [*flags, "--concurrency", str(callers)], args.runs, None)
            median = float(str(figures["median_ms"]))
            reference = reference or median
            print(
                f"{mode:26} {callers:7d} {median:9.1f} ms {float(str(figures['ms_per_token'])):9.2f} "
                f"{float(str(figures['calls_per_s'])):8.2f} {float(str(figures['load_s'])):6.2f} s "
                f"{float(str(figures['peak_rss_mb'])):6.0f} MiB   call {median / reference:.2f}x of the first row"
            )


if __name__ == "__main__":
    main()
