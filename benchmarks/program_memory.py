"""Memory of many programs on one Qwen3-0.6B-shaped base: pawfn's Torch backend (the default mode, llama.cpp's
arithmetic; every program shares the base) beside llama.cpp as the official SDK holds programs (one `Llama`, with
its own context and a mapping of the base, per function: pawfn's LlamaCpp backend), in one run.

Each backend runs in a fresh process: it loads --programs programs one after another (each a copy of the benchmark's
bundle in its own folder, so its own adapter and prefix) and makes one 10-token call on each as it arrives; after
every program it reads the process's resident memory (VmRSS) and its anonymous part (RssAnon: memory of the process
alone; file pages of a mapped base count once per mapping in VmRSS, but are shared with the page cache). Prints the
first program's figures, the median growth and load time per further program (a cold program on a warm base: its
adapter read, its prefix evaluated or read where a previous run stored it) and the ratios to llama.cpp's.

    python benchmarks/program_memory.py [--workdir /tmp/pawfn-qwen3-shape] [--programs 6]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from load_cost import INPUT, llama_cpp_build, prepare, run_json

_MEASURE = """
import json, sys, time
from pawfn import LlamaCpp, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
backend, base, text, bundles = {"torch": Torch, "llamacpp": LlamaCpp}[sys.argv[1]], sys.argv[2], sys.argv[3], sys.argv[4:]
def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "RssAnon")}
programs, figures = [], []
for bundle in bundles:
    started = time.perf_counter()
    program = PawFn[Qwen3_0_6B, backend].load_sync(bundle, base=base)
    loaded = time.perf_counter()
    program.generate(text, RuntimeOptions(max_tokens=10))
    programs.append(program)  # kept: every program stays loaded, as a server keeps them
    figures.append(memory() | {"load_s": loaded - started, "first_call_s": time.perf_counter() - loaded})
print(json.dumps({"figures": figures}))
"""


def measure(backend: str, base: Path, bundles: list[Path]) -> list[dict[str, float]]:
    """One fresh process loading `bundles` one after another on `backend`; its memory (MiB) after each."""
    figures: list[dict[str, float]] = run_json(backend, _MEASURE, [backend, str(base), INPUT, *map(str, bundles)])["figures"]
    return figures


def growth(figures: list[dict[str, float]], key: str) -> float:
    """The median growth of `key` per program after the first (MiB)."""
    return statistics.median(after[key] - before[key] for before, after in zip(figures[:-1], figures[1:], strict=True))


def further_load(figures: list[dict[str, float]]) -> float:
    """The median load time of the programs after the first (s): a cold program on a warm base."""
    return statistics.median(figure["load_s"] for figure in figures[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--programs", type=int, default=6, help="programs loaded one after another (at least 2)")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    bundles = [bundle]
    for index in range(1, max(args.programs, 2)):  # the bundle under its own folder: its own adapter and prefix
        copy = args.workdir / f"bundle-{index}"
        if not copy.exists():
            shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns(".pawfn*"))
        bundles.append(copy)
    print(llama_cpp_build())
    results = {"llama.cpp (a Llama per function)": measure("llamacpp", base, bundles), "pawfn default (one base)": measure("torch", base, bundles)}
    reference = results["llama.cpp (a Llama per function)"]
    print(f"{len(bundles)} programs, each called once as it loads; MiB, and each further program's load on the warm base")
    header = f"{'backend':34} {'first RSS':>10} {'anon':>8} {'further RSS':>12} {'anon':>8} {'all RSS':>9} {'further load':>13}"
    print(header + "   ratios to llama.cpp (first, further RSS, further anon, further load)")
    for name, figures in results.items():
        first, last = figures[0], figures[-1]
        ratios = (
            first["VmRSS"] / reference[0]["VmRSS"],
            growth(figures, "VmRSS") / growth(reference, "VmRSS"),
            growth(figures, "RssAnon") / growth(reference, "RssAnon"),
            further_load(figures) / further_load(reference),
        )
        print(
            f"{name:34} {first['VmRSS']:10.0f} {first['RssAnon']:8.0f} {growth(figures, 'VmRSS'):12.1f} {growth(figures, 'RssAnon'):8.1f} "
            f"{last['VmRSS']:9.0f} {further_load(figures) * 1e3:10.0f} ms   " + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
        )


if __name__ == "__main__":
    main()
