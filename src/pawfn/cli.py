"""The `pawfn` command line."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from .backends import Torch
from .bundle import open_bundle
from .errors import PawError
from .function import PawFn
from .models import model_for_interpreter
from .options import DType, PawConfig, RuntimeOptions

__all__ = ["main"]


class _CliError(Exception):
    """A usage problem found after parsing (printed as one line, exit 2)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pawfn", description="Run ProgramAsWeights neural programs locally.")
    parser.add_argument("--debug", action="store_true", help="print tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a program on one or more inputs")
    run.add_argument("--program", required=True, metavar="PATH", help="a .paw file or an extracted bundle folder")
    run.add_argument("--input", required=True, action="append", metavar="TEXT", help="input text (repeatable)")
    run.add_argument("--base", metavar="PATH", help="base weights: a GGUF file or a Hugging Face model folder")
    run.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    run.add_argument("--dtype", default="float32", choices=get_args(DType), help="compute dtype (default: float32)")
    run.add_argument("--n-ctx", type=int, default=2048, metavar="N", help="context window in tokens (default: 2048)")
    run.add_argument("--max-tokens", type=int, metavar="N", help="most tokens to generate (default: to EOS)")
    run.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    run.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default: 1)")
    run.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    run.add_argument(
        "--parse-special", action="store_true", help="parse special-token text in inputs (the official SDK's behaviour)"
    )
    run.add_argument("--json", action="store_true", help="print one JSON object per input (JSON Lines)")
    parser.add_argument("--version", action="version", version=_version())
    return parser


def _version() -> str:
    from . import __version__

    return f"pawfn {__version__}"


def _options(args: argparse.Namespace) -> tuple[PawConfig, RuntimeOptions]:
    try:
        config = PawConfig(device=args.device, dtype=args.dtype, n_ctx=args.n_ctx)
        options = RuntimeOptions(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            parse_special_in_input=args.parse_special,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]).replace("_", "-")
        raise _CliError(f"invalid --{field}: {first['msg']}") from exc
    return config, options


def _run(args: argparse.Namespace) -> int:
    config, options = _options(args)
    with open_bundle(Path(args.program)) as bundle:
        interpreter = bundle.meta.interpreter
    model = model_for_interpreter(interpreter)
    if model is None:
        raise _CliError(f"program {args.program} needs interpreter {interpreter!r}, which pawfn does not know")
    with PawFn.specialize(model, Torch).from_path(args.program, base=args.base, config=config) as program:
        for text in args.input:
            generation = program.generate(text, options)
            if args.json:
                record = {
                    "program": program.program_id or args.program,
                    "interpreter": program.interpreter,
                    "input": text,
                    "output": generation.text,
                    "tokens": list(generation.token_ids),
                    "stop_reason": generation.stop_reason,
                    "prefix_tokens": generation.prefix_tokens,
                    "prompt_tokens": generation.prompt_tokens,
                    "timings": generation.timings.model_dump(),
                }
                print(json.dumps(record, ensure_ascii=False), flush=True)
            else:
                print(generation.text, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pawfn`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        raise _CliError(f"unknown command {args.command!r}")  # argparse already refuses these
    except _CliError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 2
    except (PawError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pawfn: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pawfn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
