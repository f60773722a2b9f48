"""Typed outputs: one program asked for a label, a flag, a number and a JSON object, each call decoded under its
type's grammar and returned as that type.

    python examples/typed_outputs.py --program triage.paw --base qwen3-0.6b-q6_k.gguf --input "Urgent: the server is down!"
"""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import BaseModel

from pawfn import OutputTypeError, PawFn, Qwen3_0_6B, RuntimeOptions, Torch


class Ticket(BaseModel):
    urgency: Literal["high", "low"]
    minutes: int


def main() -> None:
    parser = argparse.ArgumentParser(description="Typed outputs of one program: a label, a flag, a number and a JSON object.")
    parser.add_argument("--program", required=True, help="a .paw file or bundle folder of a Qwen3 program")
    parser.add_argument("--base", required=True, help="the Qwen3-0.6B base weights (GGUF or HF folder)")
    parser.add_argument("--input", default="Urgent: the server is down!")
    args = parser.parse_args()
    options = RuntimeOptions(max_tokens=128)
    with PawFn[Qwen3_0_6B, Torch].load_sync(args.program, base=args.base) as program:
        label: Literal["immediate", "later", "never"] = program.returning(Literal["immediate", "later", "never"]).run(args.input, options)
        urgent: bool = program.returning(bool).run(args.input, options)
        minutes: int = program.returning(int).run(args.input, options)
        print(f"label={label!r} urgent={urgent!r} minutes={minutes!r}")
        try:
            ticket = program.returning(Ticket).run(args.input, options)
        except OutputTypeError as exc:  # no Ticket finished within 128 tokens
            print(f"no ticket: {exc}")
        else:
            print(f"ticket={ticket!r}")


if __name__ == "__main__":
    main()
