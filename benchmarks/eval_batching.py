"""`pawfn.evals.evaluate` (every case submitted at once: the engine decodes them together) beside the same cases
called one after another, on the Qwen3-0.6B-shaped program of the batching benchmark, in one process per way:
seconds, cases per second, their ratio, and whether both gave the same outputs.

    python benchmarks/eval_batching.py [--cases 500] [--max-tokens 4] [--workdir /tmp/pawfn-qwen3-shape]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from load_cost import prepare, run_json

_MEASURE = """
import json, sys, time
from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.evals import EvalCase, evaluate
way, base, bundle, count, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
words = ["urgent", "server", "down", "lunch", "invoice", "overdue", "meeting", "friday", "customers", "login", "refund", "thanks"]
cases = [EvalCase(id=str(i), input=" ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 5)), expected="") for i in range(count)]
options = RuntimeOptions(max_tokens=max_tokens)
with PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=PawConfig(progress=False)) as program:
    program.generate(cases[0].input, options)  # warm-up
    started = time.perf_counter()
    if way == "evaluate":
        outputs = [result.output for result in evaluate(program, cases, options=options, progress=False).results]
    else:
        outputs = [program.generate(case.input, options).text for case in cases]
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "outputs": outputs}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=4, help="a label's few tokens (default: 4)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    found: dict[str, dict[str, object]] = {}
    for way in ("sequential", "evaluate"):
        found[way] = run_json(way, _MEASURE, [way, str(base), str(bundle), str(args.cases), str(args.max_tokens)])
    sequential, batched = float(str(found["sequential"]["seconds"])), float(str(found["evaluate"]["seconds"]))
    same = found["sequential"]["outputs"] == found["evaluate"]["outputs"]
    print(f"{args.cases} cases, {args.max_tokens} tokens at most each, default config (Torch, numerics auto, 8 rows a step)")
    print(f"  calls one after another: {sequential:.1f} s ({args.cases / sequential:.2f} cases/s)")
    print(f"  evaluate (batched):      {batched:.1f} s ({args.cases / batched:.2f} cases/s)")
    print(f"  speed-up: {sequential / batched:.2f}x; the same outputs: {same}")


if __name__ == "__main__":
    main()
