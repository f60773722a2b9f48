"""Builder, load then run: an existing program by slug or id, narrowed to its precise type (network, no key).

python examples/low_level.py --slug email-triage --input "Urgent: the server is down!"
"""

from __future__ import annotations

import argparse
import sys

from pawfn import PawError, PawFn, PawFnBuilder, Qwen3_0_6B, Torch


def main() -> int:
    parser = argparse.ArgumentParser(description="Load a program from the PAW hub and run it locally.")
    parser.add_argument("--slug", default="email-triage", help="user/slug, an official slug or user/slug@vN")
    parser.add_argument("--input", default="Urgent: the server is down!", help="input text")
    args = parser.parse_args()
    try:
        with PawFnBuilder.builder().slug(args.slug).load_sync() as loaded:
            qwen: PawFn[Qwen3_0_6B, Torch] = PawFn[Qwen3_0_6B, Torch].narrow(loaded)  # the precise type, checked
            print(f"{qwen.program_id} ({qwen.interpreter}): {qwen.run(args.input)!r}")
    except PawError as exc:
        print(f"low_level: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
