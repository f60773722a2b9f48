"""Latency of one program on llama.cpp (the official runtime) behind pawfn's typed API (no API key needed).

python examples/llamacpp_benchmark.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --runs 10
"""

from __future__ import annotations

import argparse
import statistics
import sys

from pawfn import InterpreterModel, LlamaCpp, PawError, PawFn, RuntimeOptions


def main() -> int:
    parser = argparse.ArgumentParser(description="Time calls of a program on the LlamaCpp backend.")
    parser.add_argument("--program", required=True, help=".paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="base GGUF file; default: the cache's or the hub's")
    parser.add_argument("--input", default="Urgent: the server is down!", help="input text")
    parser.add_argument("--runs", type=int, default=10, help="timed calls after one warm-up call")
    parser.add_argument("--max-tokens", type=int, default=10, help="tokens per call")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    try:
        program: PawFn[InterpreterModel, LlamaCpp] = PawFn.load_any_sync(args.program, LlamaCpp, base=args.base)
        with program:
            program.generate(args.input, options)  # warm-up
            results = [program.generate(args.input, options) for _ in range(args.runs)]
    except PawError as exc:
        print(f"llamacpp_benchmark: {exc}", file=sys.stderr)
        return 1
    per_call = [r.timings.total_ms for r in results]
    tokens = sum(len(r.token_ids) for r in results)
    print(
        f"{program.interpreter} on llama.cpp: load {program.load_ms:.0f} ms, median {statistics.median(per_call):.1f} ms "
        f"per call over {args.runs} calls, {1e3 * tokens / sum(per_call):.1f} tokens/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
