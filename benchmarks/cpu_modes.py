"""pawfn's CPU modes beside llama.cpp on a Qwen3-0.6B-shaped program, in one run: each configuration is one
`pawfn bench --json` in a fresh process (load, then a warm-up and --runs 10-token calls), and --rounds rounds
run every configuration in turn (after one process each that stores the prefix and converted weights). Prints
the median figures and the median of each round's ratios to llama.cpp.

    python benchmarks/cpu_modes.py [--workdir /tmp/pawfn-qwen3-shape] [--runs 5] [--rounds 3] [--threads N] [--modes ...]
        [--repeat-input N]

`--repeat-input N` makes the input N copies of the usual one: a long prompt (N=20: ~800 tokens, within the default
2,048-token context), whose time is the prompt's (llama.cpp evaluates it in batches; pawfn one 128-token batch a pass).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from load_cost import INPUT, llama_cpp_build, prepare

MODES: dict[str, list[str]] = {
    "llama.cpp": ["--backend", "llamacpp"],  # no setting named: as the official SDK runs it (f16 KV cache)
    "torch default": [],  # numerics auto: llama.cpp's arithmetic on this quantized base
    "torch float32": ["--numerics", "native"],
    "torch float16 weights": ["--weight-dtype", "float16", "--numerics", "native"],
    "torch int8 weights": ["--weight-dtype", "int8", "--numerics", "native"],
    "torch llamacpp numerics": ["--numerics", "llamacpp"],
}


def bench(
    base: Path, bundle: Path, flags: list[str], runs: int, threads: int | None, text: str = INPUT, timeout_s: float = 1800
) -> dict[str, object]:
    """The figures of one `pawfn bench --json` process (its warnings silenced: stderr is read only on a failure)."""
    command = [
        sys.executable,
        "-m",
        "pawfn",
        "bench",
        "--program",
        str(bundle),
        "--base",
        str(base),
        "--input",
        text,
        "--runs",
        str(runs),
        "--json",
        *flags,
        *(["--threads", str(threads)] if threads else []),
    ]
    environment = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout_s, env=environment)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(flags) or 'torch'} failed: {result.stderr.strip()}")
    figures: dict[str, object] = json.loads(result.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=5, help="timed calls per process, after a warm-up call")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every mode once, in turn")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="modes to run (llama.cpp always)")
    parser.add_argument("--repeat-input", type=int, default=1, metavar="N", help="the input N times over: a long prompt")
    args = parser.parse_args()
    text = " ".join([INPUT] * args.repeat_input)
    modes = {name: flags for name, flags in MODES.items() if name == "llama.cpp" or name in args.modes}
    base, bundle = prepare(args.workdir)
    for flags in modes.values():  # a first process stores what later ones read (prefix, converted weights)
        bench(base, bundle, flags, 1, args.threads, text)
    rounds: list[dict[str, dict[str, object]]] = []
    for _ in range(args.rounds):  # modes alternate, so the machine's drift reaches every mode alike
        rounds.append({mode: bench(base, bundle, flags, args.runs, args.threads, text) for mode, flags in modes.items()})

    def value(figures: dict[str, object], key: str) -> float:
        return float(str(figures[key]))

    print(llama_cpp_build())
    print(
        f"{'mode':24} {'median call':>12} {'ms/token':>9} {'load':>8} {'peak RSS':>9}   "
        "ratios to llama.cpp (call, load, RSS), median of the rounds' ratios"
    )
    for mode in modes:
        figures = {key: statistics.median(value(r[mode], key) for r in rounds) for key in ("median_ms", "ms_per_token", "load_s", "peak_rss_mb")}
        ratios = [
            statistics.median(value(r[mode], key) / value(r["llama.cpp"], key) for r in rounds) for key in ("median_ms", "load_s", "peak_rss_mb")
        ]
        print(
            f"{mode:24} {figures['median_ms']:9.0f} ms {figures['ms_per_token']:9.1f} {figures['load_s']:6.2f} s "
            f"{figures['peak_rss_mb']:6.0f} MiB   " + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
        )
    for mode in modes:
        if mode != "llama.cpp":
            calls = ", ".join(f"{value(r[mode], 'median_ms') / value(r['llama.cpp'], 'median_ms'):.2f}x" for r in rounds)
            print(f"{mode} call / llama.cpp call per round: {calls}")


if __name__ == "__main__":
    main()
