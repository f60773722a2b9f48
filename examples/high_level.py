"""Builder, compile then run: a spec compiled on the PAW hub, loaded with the interpreter it names (API key).

PAW_API_KEY=... python examples/high_level.py --spec "Classify sentiment: POSITIVE or NEGATIVE" --input "I love it"
"""

from __future__ import annotations

import argparse
import sys

from pawfn import PawConfig, PawError, PawFnBuilder, RuntimeOptions


def main() -> int:
    parser = argparse.ArgumentParser(description="Compile a spec on the PAW hub and run the program locally.")
    parser.add_argument("--spec", default="Classify sentiment: POSITIVE or NEGATIVE", help="the function, in English")
    parser.add_argument("--input", action="append", default=[], help="input text (repeatable)")
    args = parser.parse_args()
    try:
        config = PawConfig.from_env()
        if config.api_key is None:
            print("high_level: compiling needs a PAW API key: set PAW_API_KEY or run `pawfn login`", file=sys.stderr)
            return 1
        with PawFnBuilder.builder().config(config).spec(args.spec).compile_sync() as program:
            print(f"compiled {program.program_id} for {program.interpreter}")
            for text in args.input or ["I love this product", "This is terrible"]:
                print(f"{text!r} -> {program.run_with(text, RuntimeOptions(max_tokens=16))!r}")
    except PawError as exc:
        print(f"high_level: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
