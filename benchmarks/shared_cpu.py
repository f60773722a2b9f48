"""A 10-token call with and without a busy process beside it, pawfn beside llama.cpp, in one run: each
configuration is one `pawfn bench --json` in a fresh process, idle and then with one busy-looping process per
--busy (default 1) started before it and stopped after; rounds alternate the configurations. Prints each one's
median call, idle and busy, and the busy/idle ratio, and pawfn's ratio over llama.cpp's.

    python benchmarks/shared_cpu.py [--workdir /tmp/pawfn-qwen3-shape] [--runs 3] [--rounds 2] [--busy 1] [--modes ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import cpu_modes
from load_cost import llama_cpp_build, prepare

MODES: dict[str, list[str]] = {
    "llama.cpp": ["--backend", "llamacpp"],
    "torch llamacpp numerics": ["--numerics", "llamacpp"],
    "torch int8 weights": ["--weight-dtype", "int8"],
    "torch float32": ["--numerics", "native"],
}


def bench(base: Path, bundle: Path, flags: list[str], runs: int, busy: int) -> float:
    """The median call (ms) of one `pawfn bench` process, with `busy` busy-looping processes beside it."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        return float(str(cpu_modes.bench(base, bundle, flags, runs, None, timeout_s=3600)["median_ms"]))
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=3, help="timed calls per process, after a warm-up call")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="busy-looping processes beside the busy runs")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES)[:3], help="modes to run (llama.cpp always)")
    args = parser.parse_args()
    modes = {name: flags for name, flags in MODES.items() if name == "llama.cpp" or name in args.modes}
    base, bundle = prepare(args.workdir)
    for flags in modes.values():  # a first process stores what later ones read (prefix, converted weights)
        bench(base, bundle, flags, 1, 0)
    idle: dict[str, list[float]] = {mode: [] for mode in modes}
    busy: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode, flags in modes.items():
            idle[mode].append(bench(base, bundle, flags, args.runs, 0))
            busy[mode].append(bench(base, bundle, flags, args.runs, args.busy))
    print(llama_cpp_build())
    print(f"{os.cpu_count()} CPUs, {args.busy} busy process(es) beside the busy runs")
    print(f"{'mode':24} {'idle call':>10} {'busy call':>10} {'busy/idle':>10} {'vs llama.cpp':>13}")
    reference = statistics.median(b / i for b, i in zip(busy["llama.cpp"], idle["llama.cpp"], strict=True))
    for mode in modes:
        ratio = statistics.median(b / i for b, i in zip(busy[mode], idle[mode], strict=True))
        print(f"{mode:24} {statistics.median(idle[mode]):8.0f} ms {statistics.median(busy[mode]):8.0f} ms {ratio:9.2f}x {ratio / reference:12.2f}x")


if __name__ == "__main__":
    main()
