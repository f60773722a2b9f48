"""pawfn at an earlier commit beside this checkout, on concurrent callers of the Qwen3-0.6B-shaped program, in one
run: each version in its own fresh processes, alternating (old, new, old, new ...), so a shared machine's drift
falls on both. Each process loads the program (the default mode, llama.cpp's arithmetic), warms up, times
`--calls` calls from `--callers` threads `--repeats` times, then one prompt-only call; prints every figure, the
means and their ratio. An A/B of pawfn's own changes (`batching.py` compares with llama.cpp).

    python benchmarks/versions.py BASE_COMMIT [--rounds 3] [--repeats 3] [--callers 8] [--calls 16] [--max-tokens 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from load_cost import INPUT, prepare, run_json

_MEASURE = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
base, bundle, text = sys.argv[1], sys.argv[2], sys.argv[3]
callers, calls, repeats, max_tokens = (int(value) for value in sys.argv[4:8])
program = PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=PawConfig(max_model_copies=callers, max_batch_rows=callers))
options = RuntimeOptions(max_tokens=max_tokens)
alone = program.generate(text, options).token_ids
rates, exact = [], True
for _ in range(repeats):
    started = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        outputs = list(pool.map(lambda _: program.generate(text, options).token_ids, range(calls)))
    rates.append(calls / (time.perf_counter() - started))
    exact = exact and all(output == alone for output in outputs)
started = time.perf_counter()
program.generate(text, RuntimeOptions(max_tokens=1))
print(json.dumps({"rates": rates, "prompt_ms": (time.perf_counter() - started) * 1e3, "exact": exact}))
"""


class Measured(NamedTuple):
    rates: list[float]
    """calls/s of each timed batch"""
    prompt_ms: float
    exact: bool
    """every call's tokens those of the call alone"""


def measure(label: str, source: Path, arguments: list[str]) -> Measured:
    """One fresh process importing pawfn from `source`; its figures."""
    figures = run_json(label, _MEASURE, arguments, {**os.environ, "PYTHONPATH": str(source)})
    return Measured([float(rate) for rate in figures["rates"]], float(figures["prompt_ms"]), bool(figures["exact"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("base_commit", help="the earlier version (any git revision of this repository)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--rounds", type=int, default=3, help="processes per version, alternating")
    parser.add_argument("--repeats", type=int, default=3, help="timed batches of calls per process")
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=10)
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    repository = Path(__file__).resolve().parent.parent
    arguments = [str(base), str(bundle), INPUT, str(args.callers), str(args.calls), str(args.repeats), str(args.max_tokens)]
    with tempfile.TemporaryDirectory() as scratch:
        earlier = Path(scratch) / "earlier"
        subprocess.run(["git", "-C", str(repository), "worktree", "add", "--detach", str(earlier), args.base_commit], check=True, capture_output=True)
        try:
            sources = {args.base_commit: earlier / "src", "this checkout": repository / "src"}
            figures: dict[str, list[Measured]] = {label: [] for label in sources}
            for round_index in range(args.rounds):
                for label, source in sources.items():
                    measured = measure(label, source, arguments)
                    figures[label].append(measured)
                    rates = " ".join(f"{rate:.2f}" for rate in measured.rates)
                    prompt = f"a prompt {measured.prompt_ms:.0f} ms, same tokens as alone: {measured.exact}"
                    print(f"round {round_index + 1} {label:>14}: {rates} calls/s, {prompt}")
        finally:
            subprocess.run(["git", "-C", str(repository), "worktree", "remove", "--force", str(earlier)], check=False, capture_output=True)
    means = {label: statistics.mean(rate for measured in runs for rate in measured.rates) for label, runs in figures.items()}
    for label, mean in means.items():
        print(f"{label:>14}: mean {mean:.2f} calls/s from {args.callers} callers")
    earlier_mean, current_mean = means.values()
    print(f"this checkout / {args.base_commit}: {current_mean / earlier_mean:.2f}x")


if __name__ == "__main__":
    main()
