"""`pawfn bench`: time calls of a program (load, latency, memory)."""

from __future__ import annotations


import argparse
import time
from collections.abc import Callable


from ..api.bench import run_bench

from .shared import program_options, config_of, options_of, positive, inputs_of, print_json, load_program


def register(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """Add the command's parser by `add` (`add_parser` of pawfn's subcommands), its common options from `common`."""
    program = program_options()
    bench = add("bench", parents=[common, program], help="time calls of a program (load, latency, memory)")
    bench.add_argument("--max-tokens", type=int, default=10, metavar="N", help="tokens per call (default: 10)")
    bench.add_argument("--runs", type=int, default=10, metavar="N", help="timed calls after one warm-up (default: 10)")
    bench.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="callers at once (default: 1); Torch decodes their calls together, up to --max-model-copies",
    )
    bench.add_argument("--max-model-copies", type=int, metavar="N", help="model copies, so concurrent runs (default: 8)")
    bench.add_argument("--max-batch-rows", type=int, metavar="N", help="rows per forward pass of a decode step (default: 8)")
    bench.add_argument("--json", action="store_true", help="print one JSON object with the figures and the configuration")


_BENCH_INPUT = "Urgent: the server is down! Customers cannot log in."


def command(args: argparse.Namespace) -> int:
    config = config_of(args)
    options = options_of(args)
    inputs = inputs_of(args) if args.input_file is not None or args.input else [_BENCH_INPUT]
    positive("--runs", args.runs)
    positive("--concurrency", args.concurrency)
    started = time.perf_counter()
    with load_program(args, config) as program:
        load_s = time.perf_counter() - started
        result, _ = run_bench(
            program, inputs, options, runs=args.runs, concurrency=args.concurrency, load_s=load_s, reference=args.program or args.interpreter
        )
    if args.json:
        print_json(result.model_dump())
        return 0
    print(
        f"{result.program} ({result.interpreter}) on {result.backend}, {result.device}, {result.dtype}, "
        f"threads {result.threads or 'default'}, {result.concurrency} caller(s), {result.runs} runs"
    )
    if result.engine is not None:
        print(f"  {result.engine}")
    rows = [
        ("load (ready to run)", f"{result.load_s:.2f} s"),
        ("median call", f"{result.median_ms:.1f} ms"),
        ("p90 call", f"{result.p90_ms:.1f} ms"),
        ("per token", f"{result.ms_per_token:.1f} ms"),
        ("tokens per call", f"{result.tokens_per_call:.1f}"),
        ("calls per second", f"{result.calls_per_s:.2f}"),
        ("peak RSS", f"{result.peak_rss_mb:.0f} MiB"),
    ]
    for label, value in rows:
        print(f"  {label:20} {value}")
    return 0
