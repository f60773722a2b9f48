"""Run a Qwen3 program and a GPT-2 program through the typed API.

    python examples/typed_api.py --qwen3-program email-triage.paw --qwen3-base qwen3-0.6b-q6_k.gguf \\
        --gpt2-program word-count.paw --gpt2-base gpt2-q8_0.gguf --input "Urgent: the server is down!"
"""

from __future__ import annotations

import argparse
import asyncio

from pawfn import GPT2, PawFn, Qwen3_0_6B, RuntimeOptions, Torch


def triage(program: PawFn[Qwen3_0_6B, Torch], text: str) -> str:
    """Only a Qwen3 program on Torch type-checks here; a PawFn[GPT2, Torch] is refused by mypy."""
    return program.run(text)


async def main() -> None:
    parser = argparse.ArgumentParser(description="Run a Qwen3 program and a GPT-2 program through the typed API.")
    parser.add_argument("--qwen3-program", required=True, help=".paw file or bundle folder of a Qwen3 program")
    parser.add_argument("--qwen3-base", required=True, help="Qwen3-0.6B weights: GGUF file or HF folder")
    parser.add_argument("--gpt2-program", required=True, help=".paw file or bundle folder of a GPT-2 program")
    parser.add_argument("--gpt2-base", required=True, help="GPT-2 weights: GGUF file or HF folder")
    parser.add_argument("--input", required=True, help="text to run both programs on")
    parser.add_argument("--max-tokens", type=int, default=32, help="most tokens each program generates")
    args = parser.parse_args()

    qwen: PawFn[Qwen3_0_6B, Torch] = PawFn[Qwen3_0_6B, Torch].from_path(args.qwen3_program, base=args.qwen3_base)
    gpt2: PawFn[GPT2, Torch] = PawFn[GPT2, Torch].from_path(args.gpt2_program, base=args.gpt2_base)
    options = RuntimeOptions(max_tokens=args.max_tokens)
    with qwen, gpt2:
        print(f"qwen3 ({qwen.interpreter}): {triage(qwen, args.input)!r}")
        print(f"gpt2 ({gpt2.interpreter}): {await gpt2.arun(args.input, options)!r}")


if __name__ == "__main__":
    asyncio.run(main())
