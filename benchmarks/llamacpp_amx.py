"""What avoiding llama.cpp's AMX crash costs (upstream issue #20824): the official configuration (Qwen3-0.6B-shaped
Q6_K base, rank-64 Q4_0 adapter, f16 KV, ~290-token cached prefix, 10-token calls) on llama.cpp builds side by side,
each in fresh processes through pawfn's LlamaCpp backend, with and without weight repacking:

- this environment's llama-cpp-python (built by scripts/install.sh: without AMX on an AMX CPU), repacking on/off;
- with --amx-build DIR, a llama-cpp-python built natively, AMX included (``pip install --no-deps --no-cache-dir
  --target DIR llama-cpp-python`` on an AMX CPU): repacking off (pawfn's automatic choice there) and on (the crash).

Rounds alternate the configurations; prints each one's median call, its ratio to this build's default (repacking
on), whether its tokens equal that one's, and the builds' system info lines.

    python benchmarks/llamacpp_amx.py [--amx-build /tmp/llama-native] [--workdir /tmp/pawfn-qwen3-shape] [--runs 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from load_cost import INPUT, prepare

_MEASURE = """
import json, sys, time
from pawfn import LlamaCpp, PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions
bundle, base, repack, runs = sys.argv[1], sys.argv[2], sys.argv[3] == "on", int(sys.argv[4])
config = PawConfig.from_env(dtype="float16", llamacpp_repack=repack)  # f16 KV: llama-cpp-python's default
with PawFn[Qwen3_0_6B, LlamaCpp].load_sync(bundle, base=base, config=config) as program:
    options = RuntimeOptions(max_tokens=10)
    tokens = list(program.generate(sys.argv[5], options).token_ids)  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        program.generate(sys.argv[5], options)
        times.append((time.perf_counter() - started) * 1e3)
    print(json.dumps({"times_ms": times, "tokens": tokens}))
"""


def _environment(build: Path | None) -> dict[str, str]:
    """This environment, with `build` (a folder holding a llama_cpp package) first on the path; None: as it is."""
    environment = dict(os.environ)
    if build is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(build), *filter(None, [environment.get("PYTHONPATH")])])
    return environment


def system_info(build: Path | None) -> str:
    """The system info line of `build`'s llama.cpp (read in a child: loading it is safe, running it may not be)."""
    script = "from pawfn.llamacpp.cpu import llama_cpp_system_info; print(llama_cpp_system_info())"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300, env=_environment(build)
    ).stdout.strip()


def measure(bundle: Path, base: Path, repack: bool, runs: int, build: Path | None) -> dict[str, Any]:
    """One fresh process on `build` (see `_environment`): a warm-up call, then `runs` timed ones."""
    environment = _environment(build)
    command = [sys.executable, "-c", _MEASURE, str(bundle), str(base), "on" if repack else "off", str(runs), INPUT]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800, env=environment)
    if result.returncode < 0:
        return {"crashed": signal.Signals(-result.returncode).name}
    if result.returncode != 0:
        raise SystemExit(f"{build or 'this build'}, repacking {repack}: failed\n{result.stderr}")
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--amx-build", type=Path, help="a folder holding a natively built llama_cpp package (AMX in)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--runs", type=int, default=5, help="timed calls per process, after a warm-up call")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration once, in turn")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    configurations: dict[str, tuple[Path | None, bool]] = {"this build, repacking on": (None, True), "this build, repacking off": (None, False)}
    if args.amx_build is not None:
        configurations |= {"AMX build, repacking off": (args.amx_build, False), "AMX build, repacking on": (args.amx_build, True)}
    rounds = [{name: measure(bundle, base, repack, args.runs, build) for name, (build, repack) in configurations.items()} for _ in range(args.rounds)]
    reference = "this build, repacking on"
    print(f"this build: llama.cpp {system_info(None)}")
    if args.amx_build is not None:
        print(f"AMX build ({args.amx_build}): llama.cpp {system_info(args.amx_build)}")
    print(f"\n{'configuration':28} {'median call':>12} {'vs this build, repacking on':>28} {'same tokens':>12}")
    for name in configurations:
        runs = [r[name] for r in rounds]
        if "crashed" in runs[0]:
            print(f"{name:28} {'crashed: ' + str(runs[0]['crashed']):>12}")
            continue
        median = statistics.median(t for r in runs for t in r["times_ms"])
        ratios = [statistics.median(r[name]["times_ms"]) / statistics.median(r[reference]["times_ms"]) for r in rounds]
        same = runs[0]["tokens"] == rounds[0][reference]["tokens"]
        print(f"{name:28} {median:9.0f} ms {statistics.median(ratios):27.2f}x {str(same):>12}")


if __name__ == "__main__":
    main()
