"""Calls per second with concurrent callers, pawfn's scheduler beside llama.cpp, on a Qwen3-0.6B-shaped program,
in one run: llama.cpp runs the calls one after another (the official runtime's way; measured before and after
pawfn, the ratios use the mean); pawfn takes them from 1, 2, 4, 8 and 16 threads at once, on one program and on
four programs sharing the base. Every configuration runs in its own process (load, warm-up, then the timed
calls); prints calls/s and the ratio to llama.cpp's. Last, pawfn's calls/s when each call only evaluates its
prompt (max_tokens=1, one caller): prompts are evaluated one by one, so no number of callers exceeds it.

    python benchmarks/batching.py [--workdir /tmp/pawfn-qwen3-shape] [--weight-dtype int8] [--numerics auto] [--calls 16]
        [--batch-invariant on|off|both] [--programs one|four|both] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from load_cost import INPUT, llama_cpp_build, prepare, run_script

_MEASURE = """
import json, statistics, sys, time
from concurrent.futures import ThreadPoolExecutor
from pawfn import LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
backend, base, text = {"torch": Torch, "llamacpp": LlamaCpp}[sys.argv[1]], sys.argv[2], sys.argv[3]
concurrency, calls, weight_dtype, max_tokens = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] or None, int(sys.argv[7])
invariant, numerics, bundles = sys.argv[8] == "on", sys.argv[9], sys.argv[10:]
config = PawConfig(weight_dtype=weight_dtype, max_model_copies=max(concurrency, 1), max_batch_rows=max(concurrency, 1), batch_invariant=invariant)
if backend is Torch:  # llama.cpp runs with no setting named but the copies: as the official SDK runs it
    config = config.with_options(numerics=numerics)
programs = [PawFn[Qwen3_0_6B, backend].load_sync(bundle, base=base, config=config) for bundle in bundles]
options = RuntimeOptions(max_tokens=max_tokens)
for program in programs:
    program.generate(text, options)
times = []
def call(index):
    started = time.perf_counter()
    generation = programs[index % len(programs)].generate(text, options)
    times.append(time.perf_counter() - started)
    return generation.token_ids
started = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    tokens = list(pool.map(call, range(calls)))
wall = time.perf_counter() - started
alone = [programs[i % len(programs)].generate(text, options).token_ids for i in range(len(programs))]
exact = all(tokens[i] == alone[i % len(programs)] for i in range(calls))
print(json.dumps({"calls_per_s": calls / wall, "median_ms": statistics.median(times) * 1e3, "exact": exact}))
"""


def measure(
    backend: str,
    base: Path,
    bundles: list[Path],
    concurrency: int,
    calls: int,
    weight_dtype: str,
    max_tokens: int = 10,
    invariant: str = "on",
    numerics: str = "auto",
) -> dict[str, float]:
    """One fresh process: load `bundles`, then `calls` calls from `concurrency` threads; its figures."""
    arguments = [backend, str(base), INPUT, str(concurrency), str(calls), weight_dtype, str(max_tokens), invariant, numerics, *map(str, bundles)]
    return run_script(f"{backend} x{concurrency}", _MEASURE, arguments)


Row = tuple[str, int, float, dict[str, float]]
"""A configuration's label, callers, ratio to llama.cpp's calls/s and figures."""


def one_run(args: argparse.Namespace, base: Path, bundle: Path, four: list[Path]) -> list[Row]:
    """llama.cpp, then every pawfn configuration, then llama.cpp again; prints the table and returns its rows."""
    before = measure("llamacpp", base, [bundle], 1, min(args.calls, 8), "")
    print(f"llama.cpp, one call after another: {before['calls_per_s']:.2f} calls/s (median call {before['median_ms']:.0f} ms)")
    measured: list[tuple[str, int, dict[str, float]]] = []
    settings = ("on", "off") if args.batch_invariant == "both" else (args.batch_invariant,)
    groups = [group for group in (("one program", [bundle]), ("four programs", four)) if args.programs in ("both", group[0].split()[0])]
    for name, bundles in groups:
        for concurrency in args.concurrency:
            for invariant in settings:
                calls = max(args.calls, 2 * concurrency)
                label = name if len(settings) == 1 else f"{name}, {'row-exact' if invariant == 'on' else 'batched'}"
                figures = measure("torch", base, bundles, concurrency, calls, args.weight_dtype, invariant=invariant, numerics=args.numerics)
                measured.append((label, concurrency, figures))
                print(f"  measured pawfn, {label}, {concurrency} callers", flush=True)
    prompt_only = measure("torch", base, [bundle], 1, args.calls, args.weight_dtype, max_tokens=1, numerics=args.numerics)
    after = measure("llamacpp", base, [bundle], 1, min(args.calls, 8), "")
    print(f"llama.cpp again: {after['calls_per_s']:.2f} calls/s (median call {after['median_ms']:.0f} ms)")
    reference = (before["calls_per_s"] + after["calls_per_s"]) / 2
    rows = [(label, concurrency, figures["calls_per_s"] / reference, figures) for label, concurrency, figures in measured]
    rows.append(("prompts only (1 token)", 1, prompt_only["calls_per_s"] / reference, prompt_only))
    print(
        f"{'pawfn ' + (args.weight_dtype or 'numerics ' + args.numerics):34} {'callers':>7} {'calls/s':>8} {'median call':>12} "
        f"{'vs llama.cpp':>12} {'same tokens as alone':>21}"
    )
    for label, concurrency, ratio, figures in rows:
        exact = "  (no number of callers exceeds this)" if label.startswith("prompts only") else f"{bool(figures['exact'])!s:>21}"
        print(f"{label:34} {concurrency:7} {figures['calls_per_s']:8.2f} {figures['median_ms']:9.0f} ms {ratio:11.2f}x {exact}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--weight-dtype", default="int8", choices=("", "float16", "int8"), help="'' for none")
    parser.add_argument("--numerics", default="auto", choices=("auto", "native", "llamacpp"), help="pawfn's arithmetic (auto: the default)")
    parser.add_argument("--calls", type=int, default=16, help="timed calls per configuration (at least 2x the callers)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--batch-invariant", choices=("on", "off", "both"), default="on", help="row-exact decode steps (the CPU's default), batched ones, or both"
    )
    parser.add_argument("--programs", choices=("one", "four", "both"), default="both", help="one program, four on the base, or both")
    parser.add_argument("--runs", type=int, default=1, help="whole runs one after another (llama.cpp measured in each); then each ratio per run")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    four = [bundle]
    for index in range(1, 4):  # four programs: the bundle under four folders, so four adapters and prefixes
        copy = args.workdir / f"bundle-{index}"
        if not copy.exists():
            shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns(".pawfn*"))
        four.append(copy)
    print(llama_cpp_build())
    runs: list[list[Row]] = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"run {run + 1} of {args.runs}")
        runs.append(one_run(args, base, bundle, four))
    if args.runs > 1:
        print("vs llama.cpp, run by run:")
        for index, (label, concurrency, _, _) in enumerate(runs[0]):
            ratios = [rows[index][2] for rows in runs]
            exact = all(bool(rows[index][3].get("exact", True)) for rows in runs)
            shown = ", ".join(f"{ratio:.2f}x" for ratio in ratios)
            print(f"  {label:34} {concurrency:3} callers: {shown}; lowest {min(ratios):.2f}x; every output as alone: {exact}")


if __name__ == "__main__":
    main()
