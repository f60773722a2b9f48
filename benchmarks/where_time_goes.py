"""Where the time of concurrent calls goes in the default mode (llama.cpp's arithmetic on the C kernels), on the
Qwen3-0.6B-shaped program: the prompts (`TorchInterpreter.forward`) and the decode steps (`.step`) timed as phases,
and every C kernel call timed and named by kernel and phase, in one process; what no kernel holds is Python, torch
and hand-offs. A profile, not a comparison (`batching.py` compares with llama.cpp).

    python benchmarks/where_time_goes.py [--callers 8] [--calls 16] [--max-tokens 10]
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

from load_cost import INPUT, prepare

from pawfn import PawConfig, PawFn, Qwen3_0_6B, RuntimeOptions, Torch
from pawfn.torch.engine import network
from pawfn.torch.ggml import c_kernels
from pawfn.torch.ggml.interface import Kernel, Out


P = ParamSpec("P")
T = TypeVar("T")
seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
calls: collections.Counter[str] = collections.Counter()
phase = ["other"]


def timed(name: Callable[P, str], function: Callable[P, T]) -> Callable[P, T]:
    """`function`, its time added under `name(*args)` and the phase it ran in."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            key = f"{name(*args, **kwargs)} @ {phase[0]}"
            seconds[key] += time.perf_counter() - started
            calls[key] += 1

    return run


def timed_phase(label: str, method: Callable[P, T]) -> Callable[P, T]:
    """`method`, its calls timed as phase `label` (the kernels inside it named by it)."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        phase[0] = label
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[f"[{label}s]"] += time.perf_counter() - started
            calls[f"[{label}s]"] += 1
            phase[0] = "other"

    return run


def _block_name(kernel: Kernel, x: int, rows: int, width: int, codes: int, sub: int, scale: int, out: int, target: Out, work: int) -> str:
    return f"{kernel.name.lower()}, {'prompt' if rows >= 16 else 'rows'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pawfn-qwen3-shape"))
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=10)
    args = parser.parse_args()
    base, bundle = prepare(args.workdir)
    config = PawConfig(max_model_copies=args.callers, max_batch_rows=args.callers)
    program = PawFn[Qwen3_0_6B, Torch].load_sync(bundle, base=base, config=config)
    options = RuntimeOptions(max_tokens=args.max_tokens)
    program.generate(INPUT, options)  # warm-up, untimed
    kernels = c_kernels.native_kernels()
    if kernels is None:
        raise SystemExit("the C kernels did not build here: nothing to profile")
    kernels.block_product = timed(_block_name, kernels.block_product)  # type: ignore[method-assign]  # timed in place to profile
    kernels.run = timed(lambda call, count, work: call.kernel.name.lower(), kernels.run)  # type: ignore[method-assign]  # timed in place to profile
    for name in ("rope_neox", "rope_table"):
        setattr(kernels, name, timed(lambda *rest, name=name: name, getattr(kernels, name)))
    network.TorchInterpreter.forward = timed_phase("prompt", network.TorchInterpreter.forward)  # type: ignore[method-assign]  # timed in place
    network.TorchInterpreter.step = timed_phase("step", network.TorchInterpreter.step)  # type: ignore[method-assign]  # timed in place
    started = time.perf_counter()
    with ThreadPoolExecutor(args.callers) as pool:
        list(pool.map(lambda _: program.generate(INPUT, options), range(args.calls)))
    wall = time.perf_counter() - started
    print(f"{args.calls} calls from {args.callers} callers: {wall:.2f} s ({args.calls / wall:.2f} calls/s)")
    for label in ("prompt", "step"):
        key = f"[{label}s]"
        inside = sum(value for name, value in seconds.items() if name.endswith(f"@ {label}"))
        print(
            f"{label + 's':8} {seconds[key]:7.2f} s ({seconds[key] / wall:4.0%} of the wall time), {calls[key]} of them, "
            f"{seconds[key] / max(calls[key], 1) * 1e3:.1f} ms each; kernels {inside:.2f} s, the rest {seconds[key] - inside:.2f} s"
        )
    for name, value in sorted(seconds.items(), key=lambda item: -item[1]):
        if not name.startswith("["):
            print(f"  {name:34} {value * 1e3:8.1f} ms  {calls[name]:6} calls  {value / calls[name] * 1e6:8.1f} us each")


if __name__ == "__main__":
    main()
