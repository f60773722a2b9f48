"""How much of a load's memory comes back when its last program closes, in a process that goes on, on the
Qwen3-0.6B-shaped program (benchmarks/load_cost.py writes it): each mode in fresh processes (--runs each), anonymous
RSS before the load, after one call, and after `close()` with the PawFn still referenced. With --arena-max N the
processes run under `MALLOC_ARENA_MAX=N` (glibc's per-thread arenas keep some free space; see
docs/how-it-runs.md). tests/api/test_lifetimes.py checks the same on a smaller model.

    python benchmarks/close_memory.py [--workdir /tmp/pawfn-qwen3-shape] [--runs 3] [--arena-max N]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from load_cost import prepare, run_script

_MEASURE = """
import json, sys
import torch  # its own libraries are not the load's memory
from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch

def rss_mb():  # the anonymous part: mapped file pages come and go with the page cache
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssAnon"))

bundle, base, mode = sys.argv[1:4]
config = {"float32": PawConfig(numerics="native"), "int8": PawConfig(weight_dtype="int8"), "numerics": PawConfig(numerics="llamacpp")}[mode]
before = rss_mb()
program = PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=config)
program.generate("hello", RuntimeOptions(max_tokens=4))
loaded = rss_mb()
program.close()
print(json.dumps({"before": before, "loaded": loaded, "closed": rss_mb()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["float32", "int8", "numerics"], choices=("float32", "int8", "numerics"))
    parser.add_argument("--arena-max", type=int, help="run under MALLOC_ARENA_MAX=N")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    environment = dict(os.environ) | ({"MALLOC_ARENA_MAX": str(args.arena_max)} if args.arena_max else {})
    print(f"{'mode':10} {'before':>8} {'loaded':>8} {'closed':>8} {'back':>6}   (anonymous RSS, MB)")
    for mode in args.modes:
        for _ in range(args.runs):  # modes in turn would share the page cache alike; runs of a mode back to back
            figures = run_script(mode, _MEASURE, [str(bundle), str(base), mode], environment)
            before, loaded, closed = figures["before"], figures["loaded"], figures["closed"]
            back = (loaded - closed) / (loaded - before)
            print(f"{mode:10} {before:8.0f} {loaded:8.0f} {closed:8.0f} {back:6.0%}", flush=True)


if __name__ == "__main__":
    main()
