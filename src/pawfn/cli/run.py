"""`pawfn run`: a program on one or more inputs."""

from __future__ import annotations


import argparse
from collections import deque
from collections.abc import Callable
from pathlib import Path

from typing_extensions import Unpack


from ..core.backends import Backend
from ..calls.pending import PendingGeneration, wait_interruptibly
from ..core.images import Image
from ..api.function import PawFn
from ..core.models import InterpreterModel
from ..api.positional import Positional
from ..core.results import Generation

from .shared import CliError, escape_control, program_options, config_of, options_of, positive, inputs_of, print_json, load_program


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    program = program_options()
    run = add("run", parents=[common, program], help="run a program on one or more inputs")
    run.add_argument("--max-tokens", type=int, metavar="N", help="most tokens to generate (default: to EOS)")
    run.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help="inputs decoded together, each with the tokens it gets alone (default: 8; llama.cpp runs them in turn)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object per input (JSON Lines); plain output escapes control characters")
    typed = run.add_mutually_exclusive_group()
    typed.add_argument("--choices", metavar="A,B,C", help="the output must be one of these comma-separated texts")
    typed.add_argument("--pattern", metavar="REGEX", help="the output must match this regular expression as a whole")
    typed.add_argument("--json-schema", type=Path, metavar="FILE", help="the output must be a JSON value of the schema in FILE")


def _print_first(args: argparse.Namespace, program: PawFn[InterpreterModel, Backend], window: deque[tuple[str, PendingGeneration]]) -> None:
    """Wait for the window's first call, print it and drop it; interrupted, the call stays in the window to be cancelled."""
    text, running = window[0]
    wait_interruptibly([running])
    _print_generation(args, program, text, running.result())
    window.popleft()


def command(args: argparse.Namespace) -> int:
    positive("--batch-size", args.batch_size)
    config = config_of(args)
    copies = max(config.max_model_copies, args.batch_size)  # every row of a batch holds a copy while it runs
    config = config.with_options(max_batch_rows=args.batch_size, max_model_copies=copies)
    options = options_of(args)
    if args.arg is not None:
        if args.input or args.input_file is not None:
            raise CliError("--arg and --image give one call's arguments; drop --input/--input-file (or give one --input per call)")
        with load_program(args, config) as program:
            call: Positional[Unpack[tuple[str | Image, ...]]] = Positional(program)  # the count is checked against the template
            shown = [argument if isinstance(argument, str) else repr(argument) for argument in args.arg]
            _print_generation(args, program, shown, call.generate(*args.arg, options=options))
        return 0
    inputs = inputs_of(args)
    with load_program(args, config) as program:
        # at most --batch-size calls in flight (the base's scheduler decodes them together; a server gets no more at
        # once); each output prints as soon as it and those before it are done, in input order
        window: deque[tuple[str, PendingGeneration]] = deque()
        try:
            for text in inputs:
                window.append((text, program.submit(text, options)))
                if len(window) >= args.batch_size:
                    _print_first(args, program, window)
            while window:
                _print_first(args, program, window)
        finally:
            for _, running in window:
                running.cancel()  # after an error or a broken pipe: stop what still runs
    return 0


def _print_generation(args: argparse.Namespace, program: PawFn[InterpreterModel, Backend], text: str | list[str], generation: Generation) -> None:
    if not args.json:
        print(escape_control(generation.text), flush=True)
        return
    print_json(
        {
            "program": program.program_id or args.program or args.interpreter,
            "interpreter": program.interpreter,
            "input": text,
            "output": generation.text,
            "tokens": list(generation.token_ids),
            "stop_reason": generation.stop_reason,
            "prefix_tokens": generation.prefix_tokens,
            "prompt_tokens": generation.prompt_tokens,
            "numerics": generation.numerics,
            "timings": generation.timings.model_dump(),
        }
    )
