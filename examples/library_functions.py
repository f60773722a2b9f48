"""Typed program functions for libraries: accept any Qwen3 program on any backend, or any program at all.

python examples/library_functions.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --input "Server down!"
"""

from __future__ import annotations

import argparse
import sys
from typing import TypeVar

from pawfn import Backend, InterpreterModel, PawError, PawFn, Qwen3_0_6B, RuntimeOptions, Torch

B = TypeVar("B", bound=Backend)
M = TypeVar("M", bound=InterpreterModel)


def triage(program: PawFn[Qwen3_0_6B, B], message: str) -> str:
    """Only Qwen3 programs type-check here (the model parameter is invariant); the backend is free."""
    return program.run_with(message, RuntimeOptions(max_tokens=8))


def describe(program: PawFn[M, B]) -> str:
    """Any program at all: model and backend are both type variables."""
    return f"{program.program_id or 'local program'} on {program.interpreter}, {program.n_ctx}-token context"


def main() -> int:
    parser = argparse.ArgumentParser(description="Typed program functions for libraries.")
    parser.add_argument("--program", required=True, help="a Qwen3 program: .paw file, bundle folder, id or slug")
    parser.add_argument("--base", help="Qwen3-0.6B weights (GGUF or HF folder); omitted: from the hub's manifest")
    parser.add_argument("--input", required=True, help="the message to triage")
    args = parser.parse_args()
    try:
        with PawFn[Qwen3_0_6B, Torch].load_sync(args.program, base=args.base) as program:
            print(describe(program))
            print(triage(program, args.input))
    except PawError as exc:
        print(f"library_functions: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
