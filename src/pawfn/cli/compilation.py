"""`pawfn compile`: compile a spec into a program on the hub."""

from __future__ import annotations


import argparse
import sys
from collections.abc import Callable
from pathlib import Path


from .. import evals
from ..core.config import PawConfig
from ..api.function import PawFn
from ..hub.prepare import compile_spec
from ..hub.types import compile_request
from ..core.options import RuntimeOptions

from .shared import BACKENDS, CliError, engine_options, config_of, print_json


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    compile_ = add("compile", parents=[common, engine_options()], help="compile a spec into a program on the hub")
    compile_.add_argument("--spec", required=True, metavar="TEXT", help="what the function does, in plain English")
    compile_.add_argument("--compiler", metavar="NAME", help="compiler (default: the server's)")
    compile_.add_argument("--slug", metavar="SLUG", help="publish under your slug (needs an API key)")
    compile_.add_argument("--name", metavar="NAME", help="display name")
    compile_.add_argument("--private", action="store_true", help="do not list the program publicly")
    compile_.add_argument("--ephemeral", action="store_true", help="ask the server not to keep the program")
    compile_.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    compile_.add_argument(
        "--eval", type=Path, metavar="CASES", help="evaluate the compiled program on CASES first; with --slug, publish it only if it passes"
    )
    compile_.add_argument("--min-accuracy", type=float, metavar="X", help="with --eval: the accuracy (0 to 1) it must reach (default: 1)")
    compile_.add_argument("--max-tokens", type=int, metavar="N", help="with --eval: most tokens a call generates (default: to EOS)")


def command(args: argparse.Namespace) -> int:
    config = config_of(args)
    evaluated = None if args.eval is None else _evaluated_draft(args, config)
    if evaluated is False:
        return 1
    request = compile_request(args.spec, args.compiler, slug=args.slug, name=args.name, public=not args.private, ephemeral=args.ephemeral)
    result = compile_spec(request, config)
    if isinstance(evaluated, str) and result.program_id != evaluated:
        raise CliError(
            f"the hub built {result.program_id} for the publishing compile, not the evaluated {evaluated}; evaluate what "
            f"{args.slug or 'it'} names now with `pawfn eval --program {result.program_id} --cases {args.eval}`"
        )
    if args.json:
        print_json(result.model_dump(mode="json"))
    else:
        print(f"program: {result.program_id}")
        if result.slug:
            print(f"slug: {result.slug}" + (f" v{result.version}" if result.version else ""))
        print(f"status: {result.status}")
        print(f"run it: pawfn run --program {result.slug or result.program_id} --input TEXT")
    return 0


def _evaluated_draft(args: argparse.Namespace, config: PawConfig) -> str | bool:
    """`pawfn compile --eval`: compile unpublished, evaluate on the cases, print the report. The draft's id when it
    reached --min-accuracy (the publishing compile that follows gets the same program: the hub answers a spec and
    compiler it built with that program, which the caller checks), False when it did not."""
    minimum = 1.0 if args.min_accuracy is None else args.min_accuracy
    if not 0 <= minimum <= 1:
        raise CliError(f"--min-accuracy {minimum}: give a share between 0 and 1 (0.9 for 90%)")
    cases = evals.read_cases(args.eval)
    draft = compile_spec(compile_request(args.spec, args.compiler, name=args.name, public=False), config)
    assert draft.program_id is not None  # compile_spec raises CompileError without one
    base = None if args.base is None else Path(args.base)
    with PawFn.load_any_sync(draft.program_id, BACKENDS[args.backend], base=base, config=config) as program:
        report = program.evaluate(cases, options=RuntimeOptions(max_tokens=args.max_tokens), name=draft.program_id, progress=config.progress)
    print(evals.render_text(report), file=sys.stderr if args.json else sys.stdout)
    if report.accuracy < minimum:
        where = f"; not published as {args.slug}" if args.slug else ""
        print(f"pawfn: program {draft.program_id}: accuracy {report.accuracy:.4f} is below {minimum}{where}", file=sys.stderr)
        return False
    return draft.program_id
