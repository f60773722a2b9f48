"""Static types and a shared base: two programs typed by their interpreter, each a reference or a local bundle.

    python examples/typed_api.py --qwen3-program email-triage --gpt2-program word-count --input "Server down!"
    python examples/typed_api.py --qwen3-program triage.paw --qwen3-base qwen3-0.6b-q6_k.gguf \\
        --gpt2-program word-count.paw --gpt2-base gpt2-q8_0.gguf --input "Urgent: the server is down!"

A reference (slug or id) downloads what is missing from the PAW hub (no API key needed for public programs).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from pawfn import GPT2, PawError, PawFn, Qwen3_0_6B, RuntimeOptions, Torch


def triage(program: PawFn[Qwen3_0_6B, Torch], text: str, options: RuntimeOptions) -> str:
    """Only a Qwen3 program on Torch type-checks here; a PawFn[GPT2, Torch] is refused by mypy and pyright."""
    return program.run_with(text, options)


async def main() -> int:
    parser = argparse.ArgumentParser(description="Run a Qwen3 program and a GPT-2 program through the typed API.")
    parser.add_argument("--qwen3-program", required=True, help="a Qwen3 program: slug, id, .paw file or bundle folder")
    parser.add_argument("--qwen3-base", help="Qwen3-0.6B weights (GGUF file or HF folder); default: the hub's")
    parser.add_argument("--gpt2-program", required=True, help="a GPT-2 program: slug, id, .paw file or bundle folder")
    parser.add_argument("--gpt2-base", help="GPT-2 weights (GGUF file or HF folder); default: the hub's")
    parser.add_argument("--input", required=True, help="text to run both programs on")
    parser.add_argument("--max-tokens", type=int, default=32, help="most tokens each program generates")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=args.max_tokens)
    try:
        qwen = await PawFn[Qwen3_0_6B, Torch].load(args.qwen3_program, base=args.qwen3_base)
        gpt2 = await PawFn[GPT2, Torch].load(args.gpt2_program, base=args.gpt2_base)
        with qwen, gpt2:
            print(f"qwen3 ({qwen.interpreter}): {triage(qwen, args.input, options)!r}")
            print(f"gpt2 ({gpt2.interpreter}): {await gpt2.arun(args.input, options)!r}")
    except PawError as exc:
        print(f"typed_api: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
