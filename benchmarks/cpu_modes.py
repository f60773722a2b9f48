"""pawfn's CPU modes beside llama.cpp on a Qwen3-0.6B-shaped program, in one run: each configuration is one
`pawfn bench --json` in a fresh process (load, then a warm-up and --runs 10-token calls). Prints the figures and
the ratios to llama.cpp.

    python benchmarks/cpu_modes.py [--workdir /tmp/pawfn-qwen3-shape] [--runs 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from load_cost import INPUT, prepare

MODES: dict[str, list[str]] = {
    "llama.cpp": ["--backend", "llamacpp"],
    "torch float32": [],
    "torch float16 weights": ["--weight-dtype", "float16"],
    "torch int8 weights": ["--weight-dtype", "int8"],
}


def bench(base: Path, bundle: Path, flags: list[str], runs: int, threads: int | None) -> dict[str, object]:
    command = [sys.executable, "-m", "pawfn", "bench", "--program", str(bundle), "--base", str(base), "--input", INPUT,
               "--runs", str(runs), "--json", *flags, *(["--threads", str(threads)] if threads else [])]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(flags) or 'torch'} failed: {result.stderr.strip()}")
    figures: dict[str, object] = json.loads(result.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    results = {mode: bench(base, bundle, flags, args.runs, args.threads) for mode, flags in MODES.items()}
    reference = results["llama.cpp"]
    print(f"{'mode':24} {'median call':>12} {'ms/token':>9} {'load':>8} {'peak RSS':>9}   ratios to llama.cpp (call, load, RSS)")
    for mode, figures in results.items():
        ratios = [float(str(figures[key])) / float(str(reference[key])) for key in ("median_ms", "load_s", "peak_rss_mb")]
        print(f"{mode:24} {float(str(figures['median_ms'])):9.0f} ms {float(str(figures['ms_per_token'])):9.1f} "
              f"{float(str(figures['load_s'])):6.2f} s {float(str(figures['peak_rss_mb'])):6.0f} MiB   "
              + ", ".join(f"{ratio:.2f}x" for ratio in ratios))


if __name__ == "__main__":
    main()
