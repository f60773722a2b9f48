"""One program on both backends, side by side: outputs and time per call (no API key needed).

python examples/compare_backends.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --input "Server down!"
"""

from __future__ import annotations

import argparse
import sys

from pawfn import Backend, LlamaCpp, PawError, PawFn, RuntimeOptions, Torch


def main() -> int:
    parser = argparse.ArgumentParser(description="Run one program on the Torch and LlamaCpp backends.")
    parser.add_argument("--program", required=True, help=".paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="base GGUF file; default: the cache's or the hub's")
    parser.add_argument("--input", action="append", required=True, help="input text (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per call")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    backends: tuple[type[Backend], ...] = (Torch, LlamaCpp)
    try:
        for backend in backends:
            with PawFn.load_any_sync(args.program, backend, base=args.base) as program:
                for text in args.input:
                    result = program.generate(text, options)
                    print(f"{backend.name:8} {text!r} -> {result.text!r} ({result.timings.total_ms:.1f} ms)")
    except PawError as exc:
        print(f"compare_backends: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
