"""One process from start to the output of one 10-token call, in one run: `pawfn run` in its modes beside the
same call through llama.cpp alone (llama-cpp-python, as the official SDK drives it: the Q6_K base with the
program's LoRA, its prompt prefix evaluated once and kept in a state file as the SDK keeps it, greedy tokens).
Each configuration is a fresh process; rounds alternate them, after one process each that fills the caches.
Prints the median wall time and the ratio to llama.cpp's.

    python benchmarks/one_shot.py [--workdir /tmp/pawfn-qwen3-shape] [--rounds 3] [--modes numerics int8 ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from load_cost import INPUT, llama_cpp_build, prepare

MODES: dict[str, list[str]] = {
    "pawfn run --numerics llamacpp": ["--numerics", "llamacpp"],
    "pawfn run --weight-dtype int8": ["--weight-dtype", "int8"],
    "pawfn run --backend llamacpp": ["--backend", "llamacpp"],
    "pawfn run (default: numerics auto)": [],
    "pawfn run --numerics native (float32)": ["--numerics", "native"],
}

_LLAMA_CPP = """
import os, pickle, sys
import llama_cpp
base, bundle, text, state_path = sys.argv[1:5]
prefix, suffix = open(os.path.join(bundle, "prompt_template.txt")).read().split("{INPUT_PLACEHOLDER}")
model = llama_cpp.Llama(base, n_ctx=2048, verbose=False, lora_path=os.path.join(bundle, "adapter.gguf"))
prefix_ids = model.tokenize(prefix.encode(), add_bos=False, special=True)
if os.path.exists(state_path):
    with open(state_path, "rb") as file:
        model.load_state(pickle.load(file))
else:
    model.eval(prefix_ids)
    with open(state_path, "wb") as file:
        pickle.dump(model.save_state(), file)
tokens = model.tokenize((text + suffix).encode(), add_bos=False, special=True)
out = []
for token in model.generate(tokens, temp=0.0, reset=False):
    if token == model.token_eos() or len(out) == 10:
        break
    out.append(token)
print(model.detokenize(out).decode(errors="replace").strip())
"""


def timed(command: list[str]) -> float:
    """Seconds from the process's start to its end (its output printed)."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])}... failed: {result.stderr.strip()[-800:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="*", default=None, help="run only the pawfn modes whose name holds one of these")
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    state = args.workdir / "llama-cpp-prefix.state"
    state.unlink(missing_ok=True)
    commands = {"llama.cpp alone": [sys.executable, "-c", _LLAMA_CPP, str(base), str(bundle), INPUT, str(state)]}
    for name, flags in MODES.items():
        if args.modes is not None and not any(word in name for word in args.modes):
            continue
        commands[name] = [
            sys.executable,
            "-m",
            "pawfn",
            "run",
            "--program",
            str(bundle),
            "--base",
            str(base),
            "--input",
            INPUT,
            "--max-tokens",
            "10",
            *flags,
        ]
    for command in commands.values():  # caches: the prefix state, converted weights, built kernels
        timed(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, command in commands.items():
            times[name].append(timed(command))
    print(llama_cpp_build())
    print(f"{'process':32} {'median wall':>12} {'vs llama.cpp':>13}   (one 10-token call, {args.rounds} rounds)")
    for name in commands:
        ratio = statistics.median(t / r for t, r in zip(times[name], times["llama.cpp alone"], strict=True))
        print(f"{name:32} {statistics.median(times[name]):10.2f} s {ratio:12.2f}x")


if __name__ == "__main__":
    main()
