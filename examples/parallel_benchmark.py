"""Calls per second of one program from several callers at once: sequential calls, then threads whose calls the
Torch backend decodes together, each call checked to give the tokens it gives alone (no API key needed).

    python examples/parallel_benchmark.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --concurrency 8
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pawfn import InterpreterModel, PawConfig, PawError, PawFn, RuntimeOptions, Torch
from pawfn.core.options import WeightDType


def main() -> int:
    parser = argparse.ArgumentParser(description="Sequential vs concurrent calls of one program on the Torch backend.")
    parser.add_argument("--program", required=True, help=".paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="base weights; default: the cache's or the hub's")
    parser.add_argument("--input", default="Urgent: the server is down!", help="input text")
    parser.add_argument("--concurrency", type=int, default=8, help="callers at once")
    parser.add_argument("--calls", type=int, default=16, help="calls per measurement")
    parser.add_argument("--max-tokens", type=int, default=10, help="tokens per call")
    parser.add_argument("--weight-dtype", choices=("float16", "int8"), help="compact CPU weights (default: float32)")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    weight_dtype: WeightDType | None = args.weight_dtype
    config = PawConfig(max_model_copies=args.concurrency, max_batch_rows=args.concurrency, weight_dtype=weight_dtype)
    try:
        program: PawFn[InterpreterModel, Torch] = PawFn.load_any_sync(args.program, Torch, base=args.base, config=config)
        with program:
            alone = program.generate(args.input, options)  # also the warm-up
            started = time.perf_counter()
            for _ in range(args.calls):
                program.generate(args.input, options)
            sequential = args.calls / (time.perf_counter() - started)
            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(program.generate, [args.input] * args.calls, [options] * args.calls))
            concurrent = args.calls / (time.perf_counter() - started)
    except PawError as exc:
        print(f"parallel_benchmark: {exc}", file=sys.stderr)
        return 1
    exact = all(result.token_ids == alone.token_ids for result in results)
    print(
        f"{program.interpreter}: {sequential:.2f} calls/s one after another, {concurrent:.2f} calls/s from "
        f"{args.concurrency} callers ({concurrent / sequential:.2f}x); same tokens as alone: {exact}"
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
