"""Check that pawfn's Torch backend gives llama.cpp's greedy tokens for a program (no API key needed).

    python examples/verify_backend.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --input a --input b

Exits 1 when any input's tokens differ, naming the first differing position.
"""

from __future__ import annotations

import argparse
import sys

from pawfn import LlamaCpp, PawError, PawFn, RuntimeOptions, Torch


def main() -> int:
    parser = argparse.ArgumentParser(description="Compare Torch's greedy tokens with llama.cpp's.")
    parser.add_argument("--program", required=True, help=".paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="base GGUF file; default: the cache's or the hub's")
    parser.add_argument("--input", action="append", required=True, help="input text (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per call")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    mismatches = 0
    try:
        with (
            PawFn.load_any_sync(args.program, Torch, base=args.base) as torch_program,
            PawFn.load_any_sync(args.program, LlamaCpp, base=args.base) as llama_program,
        ):
            for text in args.input:
                ours = torch_program.generate(text, options).token_ids
                reference = llama_program.generate(text, options).token_ids
                if ours == reference:
                    print(f"ok    {text!r}: {len(ours)} tokens")
                    continue
                mismatches += 1
                first = next((i for i, (a, b) in enumerate(zip(ours, reference, strict=False)) if a != b), min(len(ours), len(reference)))
                print(
                    f"DIFF  {text!r}: first difference at token {first} (torch {ours[first : first + 3]}, llama.cpp {reference[first : first + 3]})"
                )
    except PawError as exc:
        print(f"verify_backend: {exc}", file=sys.stderr)
        return 1
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
