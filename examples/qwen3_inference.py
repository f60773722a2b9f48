"""Run an existing Qwen3 program on a few inputs and print each output with its timings (no API key needed).

python examples/qwen3_inference.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --input "Server down!"
"""

from __future__ import annotations

import argparse
import sys

from pawfn import PawError, PawFn, Qwen3_0_6B, RuntimeOptions, Torch


def main() -> int:
    parser = argparse.ArgumentParser(description="Run an existing Qwen3 program locally.")
    parser.add_argument("--program", required=True, help=".paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="Qwen3-0.6B weights (GGUF file or HF folder); default: the cache's or the hub's")
    parser.add_argument("--input", action="append", required=True, help="input text (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens per call")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    try:
        with PawFn[Qwen3_0_6B, Torch].load_sync(args.program, base=args.base) as program:
            print(f"loaded in {program.load_ms:.0f} ms; prefix {program.prefix_tokens} tokens, context {program.n_ctx}")
            for text in args.input:
                result = program.generate(text, options)
                print(f"{text!r} -> {result.text!r} ({len(result.token_ids)} tokens, {result.stop_reason}, {result.timings.total_ms:.0f} ms)")
    except PawError as exc:
        print(f"qwen3_inference: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
