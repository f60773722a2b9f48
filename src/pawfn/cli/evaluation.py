"""`pawfn eval`: evaluate a program on cases."""

from __future__ import annotations


import argparse
import sys
from collections.abc import Callable
from pathlib import Path


from .. import evals
from ..api.function import PawFn

from .shared import BACKENDS, CliError, engine_options, config_of, options_of, print_json


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    evaluation = add(
        "eval", parents=[common, engine_options()], help="evaluate a program on cases: accuracy, per label and tag, JUnit XML, --compare"
    )
    evaluation.add_argument("--program", required=True, metavar="REF", help="program id, user/slug, slug@vN, .paw file or folder")
    evaluation.add_argument("--cases", type=Path, metavar="FILE", help="cases: .jsonl, .json or .csv, each with input and expected (and id, tags)")
    evaluation.add_argument("--from-spec", action="store_true", help="also the Input:/Output: examples of the program's spec")
    evaluation.add_argument(
        "--from-log",
        action="append",
        type=Path,
        default=[],
        metavar="LOG",
        help="also cases from a call log (--call-log): each call's expected, else its output",
    )
    evaluation.add_argument("--log-program", metavar="ID", help="with --from-log: only the calls of this program id")
    scoring = evaluation.add_mutually_exclusive_group()
    scoring.add_argument("--normalize", action="store_true", help="an output is right up to case and runs of white space (default: exact)")
    scoring.add_argument("--scorer", metavar="MODULE:FUNCTION", help="your scorer: function(case, output) -> bool")
    evaluation.add_argument("--compare", metavar="REF", help="another program (or version: user/slug@v2) on the same cases: paired counts, McNemar")
    evaluation.add_argument(
        "--compare-backend", choices=sorted(BACKENDS), help="the compared run on this backend (alone: the same program on two backends)"
    )
    evaluation.add_argument("--min-accuracy", type=float, metavar="X", help="exit 1 when the accuracy (0 to 1) is below X")
    typed_eval = evaluation.add_mutually_exclusive_group()
    typed_eval.add_argument("--choices", metavar="A,B,C", help="calls constrained to one of these texts, as pawfn run --choices")
    typed_eval.add_argument("--pattern", metavar="REGEX", help="calls constrained to this regular expression, as pawfn run --pattern")
    typed_eval.add_argument(
        "--json-schema", type=Path, metavar="FILE", help="calls constrained to the schema in FILE; outputs compared as JSON values, key by key"
    )
    evaluation.add_argument("--max-tokens", type=int, metavar="N", help="most tokens a call generates (default: to EOS)")
    evaluation.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    evaluation.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in (0, 1] (default: 1)")
    evaluation.add_argument("--seed", type=int, metavar="S", help="sampling seed")
    evaluation.add_argument("--parse-special", action="store_true", help="parse special-token text in inputs (the official SDK's behaviour)")
    evaluation.add_argument("--no-progress", action="store_true", help="no progress bar (default: one on a terminal)")
    report = evaluation.add_mutually_exclusive_group()
    report.add_argument("--json", action="store_true", help="print the report as JSON (every case, every figure)")
    report.add_argument("--markdown", action="store_true", help="print the report as Markdown (a CI summary, a pull request comment)")
    evaluation.add_argument("--junit-xml", type=Path, metavar="PATH", help="also write JUnit XML there, one test case per case")


def command(args: argparse.Namespace) -> int:
    if args.cases is None and not args.from_spec and not args.from_log:
        raise CliError("no cases: give --cases FILE (.jsonl, .json or .csv), --from-spec (the program's Input:/Output: examples) or --from-log LOG")
    if args.min_accuracy is not None and not 0 <= args.min_accuracy <= 1:
        raise CliError(f"--min-accuracy {args.min_accuracy}: give a share between 0 and 1 (0.9 for 90%)")
    config = config_of(args)
    scorer = evals.load_scorer(args.scorer) if args.scorer else evals.normalized if args.normalize else None
    options = options_of(args)
    base = None if args.base is None else Path(args.base)
    cases = [] if args.cases is None else evals.read_cases(args.cases)
    for log in args.from_log:
        cases += [case.model_copy(update={"id": f"{log.name}:{case.id}"}) for case in evals.log_cases(log, args.log_program)]
    progress = False if args.no_progress else config.progress
    reports: list[evals.EvalReport] = []
    runs = [(args.program, args.backend)]
    if args.compare or args.compare_backend:
        runs.append((args.compare or args.program, args.compare_backend or args.backend))
    for reference, backend in runs:
        with PawFn.load_any_sync(reference, BACKENDS[backend], base=base, config=config) as program:
            if args.from_spec and not reports:  # the first program's examples: both runs take the same cases
                given = {case.id for case in cases}
                cases += [case for case in evals.spec_cases(program.spec or "", f"{reference}'s spec") if case.id not in given]
            name = reference if runs[0][1] == runs[-1][1] else f"{reference} on {backend}"
            reports.append(evals.evaluate(program, cases, scorer=scorer, options=options, name=name, progress=progress))
    report = reports[0]
    comparison = evals.compare(report, reports[1]) if len(reports) > 1 else None
    if args.junit_xml is not None:
        args.junit_xml.write_text(evals.render_junit(report), encoding="utf-8")
    if args.json:
        data: dict[str, object] = {"report": report.model_dump(mode="json")}
        if comparison is not None:
            data["second"] = comparison.second.model_dump(mode="json")
            data["comparison"] = comparison.model_dump(mode="json", exclude={"first", "second"})
        print_json(data)
    elif args.markdown:
        print(evals.render_markdown(report))
    else:
        print(evals.render_text(report) + ("" if comparison is None else "\n\n" + evals.render_comparison(comparison)))
    if args.min_accuracy is not None and report.accuracy < args.min_accuracy:
        print(f"pawfn: accuracy {report.accuracy:.4f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0
